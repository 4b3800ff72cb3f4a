"""Masked SFT on Ray Train (``algos/sft_trainer.py``): for the same demonstrations, order and seed, the
TorchTrainer gives the weights the RLlib SFT algorithm gives; two workers split each step's batch and give
the same update; its checkpoint is a Hugging Face directory a recipe starts from; parquet input is checked
row by row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from rllib_search.algos import SearchGRPOConfig, SearchSFTConfig
from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
from rllib_search.algos.sft_trainer import (
    demonstration_rows,
    read_demonstrations,
    train_sft,
    training_order,
)
from rllib_search.env.search_env import ENV_ID, SearchEnvConfig
from rllib_search.llm.models import load_tokenizer
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from tests.helpers import ENV_SETTINGS

pytestmark = pytest.mark.slow
STEPS, BATCH = 3, 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_trainer_model")
    return str(build_tiny_causal_lm(root / "model", build_tiny_tokenizer(root / "tok")))


@pytest.fixture(scope="module")
def demonstrations(model_dir, world):
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    return teacher_rollouts(load_tokenizer(model_dir), BM25Retriever(world.passages), world.train[:6], config)


def sft_config(model_dir, world, corpus, demonstrations):
    env_config = {"retriever": {"type": "bm25", "corpus": corpus}, "dataset": world.train, **ENV_SETTINGS}
    return (
        SearchSFTConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": model_dir})
        .training(lr=5e-3, micro_batch_size=2)
        .sft(demonstrations=demonstrations, sft_batch_size=BATCH)
        .debugging(seed=7)
    )


def weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(next(iter(sorted(__import__("pathlib").Path(directory).glob("*.safetensors"))))))


def test_the_order_is_the_rllib_sft_order():
    assert training_order(5, 3, 2, seed=0) == training_order(5, 3, 2, seed=0)
    order = training_order(5, 3, 4, seed=0)
    assert len(order) == 12 and sorted(order[:5]) == [0, 1, 2, 3, 4]  # every one once per epoch


@pytest.fixture(scope="module")
def rllib_sft_weights(ray_cluster, model_dir, world, corpus, demonstrations, tmp_path_factory):
    """The weights of the RLlib SFT algorithm after ``STEPS`` steps: what Ray Train's SFT must give."""
    algo = sft_config(model_dir, world, corpus, demonstrations).build_algo()
    try:
        for _ in range(STEPS):
            algo.train()
        return weights(algo.export(tmp_path_factory.mktemp("rllib_sft")))
    finally:
        algo.stop()


def test_torch_trainer_sft_gives_the_rllib_sft_weights(
    ray_cluster, model_dir, world, corpus, demonstrations, rllib_sft_weights, tmp_path
):
    from ray.train import RunConfig

    config = sft_config(model_dir, world, corpus, demonstrations)
    result = train_sft(
        config,
        demonstrations,
        steps=STEPS,
        batch_size=BATCH,
        checkpoint_every=2,
        run_config=RunConfig(storage_path=str(tmp_path / "train"), name="sft"),
    )
    assert result.error is None and result.metrics["step"] == STEPS
    trained = weights(result.checkpoint.path)
    assert trained.keys() == rllib_sft_weights.keys()
    assert all(torch.equal(trained[k], rllib_sft_weights[k]) for k in rllib_sft_weights)
    assert len(result.best_checkpoints) == 2  # steps 2 and 3

    # Its checkpoint is what a recipe starts from: an RL config builds on it.
    rl = SearchGRPOConfig().rl_module(model_config={"model": result.checkpoint.path})
    assert rl.model_config["model"] == result.checkpoint.path
    assert (tmp_path / "train" / "sft").is_dir()


def test_two_workers_split_each_batch_and_give_the_same_update(
    ray_cluster, model_dir, world, corpus, demonstrations, rllib_sft_weights, tmp_path
):
    """Each worker takes half of every step's batch; the gradients, averaged across the two, are the whole
    batch's (one process gives the RLlib SFT's weights bit for bit: the test above), up to float sums."""
    from ray.train import RunConfig, ScalingConfig

    config = sft_config(model_dir, world, corpus, demonstrations)
    result = train_sft(
        config,
        demonstrations,
        steps=STEPS,
        batch_size=BATCH,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "train"), name="sft_2"),
    )
    assert result.error is None
    trained = weights(result.checkpoint.path)
    assert all(torch.allclose(trained[k], rllib_sft_weights[k], atol=1e-5) for k in rllib_sft_weights)


def test_parquet_demonstrations_are_checked_row_by_row(demonstrations, tmp_path, ray_cluster):
    rows = demonstration_rows(demonstrations[:3])
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(rows), good)
    assert read_demonstrations(good).count() == 3

    broken = [dict(row) for row in rows]
    broken[1]["loss_mask"] = broken[1]["loss_mask"][:-1]
    path = tmp_path / "broken.parquet"
    pq.write_table(pa.Table.from_pylist(broken), path)
    with pytest.raises(ValueError, match=r"broken.parquet: row 1, field 'loss_mask'"):
        read_demonstrations(path)
    pq.write_table(pa.Table.from_pylist([{"tokens": [1, 2]}]), tmp_path / "nocol.parquet")
    with pytest.raises(ValueError, match="no column 'token_ids'"):
        read_demonstrations(tmp_path / "nocol.parquet")
