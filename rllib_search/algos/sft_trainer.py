"""Masked SFT on Ray Train: a ``TorchTrainer`` whose workers run the same learner update as RL.

The warm start of every recipe is supervised: the negative log-likelihood of demonstrated (generated) tokens,
observations and prompts masked exactly as in RL. :func:`train_sft` runs it as a Ray Train job:

- data: a Ray Dataset of demonstrations, one row per episode (``token_ids``, ``loss_mask``, optional
  ``nll_weights`` and ``prompt_length``), from teacher trajectories (:func:`demonstrations_dataset` of
  ``Rollout`` records) or a user's parquet file (:func:`read_demonstrations`, which names file, row and field
  of anything malformed);
- order: the rows are put in the order :class:`~rllib_search.algos.sft.SearchSFT` would draw them (the same
  seeded shuffle, reshuffled every epoch), every worker reads the whole ordered dataset and takes its own
  ``rank::num_workers`` share of each step's batch, so a run is reproducible and ``num_workers`` changes
  only how a step's batch is split;
- the update: each worker builds the config's learner (``config.build_learner``, RLlib's
  ``SearchTorchLearner``; DDP over Ray Train's process group when there are several workers) and calls its
  ``update``: the same masks, micro-batches, loss, AdamW, warmup and gradient clipping as RL;
- checkpoints: every ``checkpoint_every`` steps and at the end, worker 0 exports the policy as a Hugging
  Face directory (LoRA merged, tokenizer beside it) and reports it as the ``ray.train.Checkpoint``; that
  directory is what a recipe's ``rl_module(model_config={"model": ...})`` starts from
  (``result.checkpoint.path``);
- resources: ``ray.train.ScalingConfig`` (workers, GPUs), ``ray.train.RunConfig`` (storage, name).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rllib_search.algos.rollouts.record import Rollout
from rllib_search.algos.rollouts.sampler import ShuffledSampler

COLUMNS = ("token_ids", "loss_mask", "nll_weights", "prompt_length")


def demonstration_rows(rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """One row per demonstration: tokens, loss mask, NLL weights (None: 1 everywhere), prompt length."""
    return [
        {
            "token_ids": [int(t) for t in r.token_ids],
            "loss_mask": [int(m) for m in r.loss_mask],
            "nll_weights": None if r.nll_weights is None else [float(w) for w in r.nll_weights],
            "prompt_length": int(r.prompt_length),
        }
        for r in rollouts
    ]


def demonstrations_dataset(rollouts: Sequence[Rollout]) -> Any:
    """A Ray Dataset of ``rollouts`` (e.g. ``teacher_rollouts(...)``), one row each."""
    import ray.data

    return ray.data.from_items(demonstration_rows(rollouts))


def read_demonstrations(path: str | Path) -> Any:
    """A Ray Dataset of the demonstrations in a parquet file: ``token_ids`` (list of int) and ``loss_mask``
    (list of 0/1, as long) per row, optional ``nll_weights`` (list of float, as long) and ``prompt_length``
    (default: the tokens before the first masked one). A malformed row raises ``ValueError`` naming the
    file, the row and the field."""
    import pyarrow.parquet as pq
    import ray.data

    table = pq.read_table(path)
    for required in ("token_ids", "loss_mask"):
        if required not in table.column_names:
            raise ValueError(f"{path}: no column {required!r} (columns: {table.column_names})")
    rows = table.to_pylist()
    for index, row in enumerate(rows):
        tokens, mask = row.get("token_ids"), row.get("loss_mask")
        if not tokens or not all(isinstance(t, int) and t >= 0 for t in tokens):
            raise ValueError(f"{path}: row {index}, field 'token_ids': a non-empty list of token ids")
        if mask is None or len(mask) != len(tokens) or any(m not in (0, 1) for m in mask):
            raise ValueError(f"{path}: row {index}, field 'loss_mask': 0/1 values, one per token")
        if not any(mask):
            raise ValueError(f"{path}: row {index}, field 'loss_mask': no token to train on")
        weights = row.get("nll_weights")
        if weights is not None and len(weights) != len(tokens):
            raise ValueError(f"{path}: row {index}, field 'nll_weights': one weight per token")
        prompt = row.get("prompt_length")
        row["prompt_length"] = int(prompt) if prompt is not None else int(mask.index(1))
        row["nll_weights"] = weights
    return ray.data.from_items([{name: row[name] for name in COLUMNS} for row in rows])


def rollout_of(row: dict[str, Any], index: int) -> Rollout:
    """A demonstration row as the learner's ``Rollout`` record (a demonstration earns no reward)."""
    tokens = np.asarray(row["token_ids"], dtype=np.int64)
    mask = np.asarray(row["loss_mask"], dtype=np.int8)
    weights = row.get("nll_weights")
    return Rollout(
        token_ids=tokens,
        loss_mask=mask,
        logprobs=np.where(mask.astype(bool), 0.0, np.nan),
        prompt_length=int(row["prompt_length"]),
        turn_spans=[],
        reward=0.0,
        reward_components={},
        group_id=f"demonstration-{index}",
        uid=f"demonstration-{index}",
        data_source="demonstrations",
        weights_version=0,
        terminated=True,
        truncated=False,
        answer=None,
        golden_answers=[],
        nll_weights=None if weights is None else np.asarray(weights, dtype=np.float32),
    )


def training_order(count: int, steps: int, batch_size: int, seed: int) -> list[int]:
    """The demonstrations' indices in the order :class:`SearchSFT` draws them: ``steps`` batches of
    ``batch_size`` from one seeded shuffle, reshuffled every epoch."""
    sampler = ShuffledSampler(count, np.random.default_rng(seed or 0))
    return [index for _ in range(steps) for index in sampler.take(batch_size)]


def train_loop(loop_config: dict[str, Any]) -> None:
    """One Ray Train worker: its share of each step's batch through the config's learner; worker 0 exports
    and reports the checkpoints."""
    import ray.train
    import torch
    from gymnasium import spaces
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_search.algos.algorithm import train_batch
    from rllib_search.algos.checkpoints.export import export_module
    from rllib_search.llm.models import load_tokenizer

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    config = loop_config["config"].copy(copy_frozen=False)
    config.learners(num_learners=world if world > 1 else 0)  # DDP over Ray Train's process group
    tokenizer = load_tokenizer(str(config.model_config["model"]))
    vocab = spaces.Sequence(spaces.Discrete(len(tokenizer)), stack=True)
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (vocab, vocab)})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    steps, batch_size, every = (
        loop_config["steps"],
        loop_config["batch_size"],
        loop_config["checkpoint_every"],
    )
    rows = iter(ray.train.get_dataset_shard("train").iter_rows())
    for step in range(1, steps + 1):
        batch_rows = [next(rows) for _ in range(batch_size)]
        mine = [rollout_of(row, index) for index, row in enumerate(batch_rows)][rank::world]
        results = learner.update(batch=train_batch(mine, config, pad))
        nll = float(np.asarray(results[DEFAULT_MODULE_ID]["sft_nll"].peek()))
        metrics = {"step": step, "sft_nll": nll}
        if step % every == 0 or step == steps:
            with tempfile.TemporaryDirectory() as directory:
                checkpoint = None
                if rank == 0:
                    export_module(learner.module[DEFAULT_MODULE_ID].unwrapped(), directory)
                    checkpoint = ray.train.Checkpoint.from_directory(directory)
                ray.train.report(metrics, checkpoint=checkpoint)
        else:
            ray.train.report(metrics)
    del learner
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_sft(
    config: Any,
    demonstrations: Sequence[Rollout] | Any,
    *,
    steps: int,
    batch_size: int = 8,
    checkpoint_every: int | None = None,
    scaling_config: Any = None,
    run_config: Any = None,
) -> Any:
    """Masked SFT of ``config``'s policy (a ``SearchSFTConfig``: model, lr, micro-batch, seed) for ``steps``
    steps of ``batch_size`` demonstrations, as a Ray Train ``TorchTrainer``; ``demonstrations`` are
    ``Rollout`` records or a Ray Dataset of rows (:func:`read_demonstrations`; read into the driver to be
    put in order). ``scaling_config``: one CPU
    worker by default; ``batch_size`` must split evenly over its workers. Returns the ``ray.train.Result``;
    ``result.checkpoint.path`` is the trained policy as a Hugging Face directory."""
    import ray.data
    from ray.train import DataConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    scaling_config = scaling_config or ScalingConfig(num_workers=1)
    if batch_size % scaling_config.num_workers:
        raise ValueError(f"batch_size {batch_size} does not split over {scaling_config.num_workers} workers")
    rows = (
        demonstration_rows(demonstrations)
        if isinstance(demonstrations, Sequence)
        else demonstrations.take_all()
    )
    if not rows:
        raise ValueError("train_sft needs at least one demonstration")
    order = training_order(len(rows), steps, batch_size, config.seed)
    ordered = ray.data.from_items([rows[i] for i in order])
    preserve = ray.data.ExecutionOptions(preserve_order=True)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "config": config,
            "steps": steps,
            "batch_size": batch_size,
            "checkpoint_every": checkpoint_every or steps,
        },
        scaling_config=scaling_config,
        run_config=run_config,
        datasets={"train": ordered},
        dataset_config=DataConfig(datasets_to_split=[], execution_options=preserve),
    )
    return trainer.fit()
