"""Ray Tune over the reward's λ_f, as the λ sweep runs it: each trial's λ_f must reach that trial's
rewards."""

from __future__ import annotations

import pytest

from rllib_search import ENV_ID
from rllib_search.algos import SearchGRPOConfig
from rllib_search.data.formats import write_corpus_jsonl
from rllib_search.env.protocols import get_protocol
from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit

pytestmark = pytest.mark.slow

# A formatted answer that is wrong for every question: exact match 0, format valid 1, so the Search-R1
# study's reward is λ_f itself and two λ_f values must give two different returns.
WRONG_BUT_FORMATTED = "<think> easy </think>\n<answer> Nowhere at all </answer>"


@pytest.fixture(scope="module")
def formatted_model_dir(tmp_path_factory, world):
    root = tmp_path_factory.mktemp("lambda_model")
    base = build_tiny_causal_lm(root / "base", build_tiny_tokenizer(root / "tok"))
    instruction = get_protocol("search_r1").instruction
    prompts = [instruction.format(question=r.question) for r in world.train]
    return str(teach_to_emit(base, root / "formatted", prompts, WRONG_BUT_FORMATTED))


def test_each_trials_lambda_format_reaches_its_rewards(ray_cluster, formatted_model_dir, world, tmp_path):
    """The λ sweep's Tune experiment (``train_cli.run_sweep``: one grid search over the design's (λ_f, λ_r)
    pairs, ``tune.Tuner(SearchGRPO, param_space=config)``) over λ_f at λ_r = 0; Search-R1's study reward is
    em + λ_f (format - em) for every episode, so each trial's mean return must equal that of its own mean em,
    mean format and λ_f (the reward components every runner logs). Every result carries the sweep's metric,
    and the TuneConfig's metric and mode rank the trials (``ResultGrid.get_best_result()``)."""
    from types import SimpleNamespace

    from rllib_search.recipes import sweeps, train_cli

    corpus = tmp_path / "corpus.jsonl"
    write_corpus_jsonl(world.passages, corpus)
    env_config = {
        "retriever": {"type": "bm25", "corpus": str(corpus)},
        "dataset": world.train,
        "protocol": "search_r1",
        "max_turns": 3,
        "max_total_tokens": 700,
        "max_obs_tokens": 80,
    }
    config = (
        SearchGRPOConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": formatted_model_dir})
        .rollouts(group_size=2, prompts_per_sample=3, max_turn_tokens=48, temperature=0.0)
        .training(lr=1e-3, micro_batch_size=2)
    )
    sweep = train_cli.LambdaSweep(
        design="one-at-a-time",
        lambda_format=(0.0, 0.4),
        lambda_retrieval=(0.0,),
        seeds=(11,),
        iterations=1,
        scale="smoke",
        metric=train_cli.TRAINING_EM,
        fixed_lambda_format=0.0,
    )
    job = SimpleNamespace(out=tmp_path / "sweep", iterations=1, say=print)
    results = train_cli.run_sweep(job, config, sweep, SimpleNamespace(fresh=False, max_concurrent=None))
    assert len(results) == 2 and not results.errors
    returns = {}
    for result in results:
        lambdas = result.config["env_config"]["reward_config"]
        lam = lambdas["lambda_format"]
        assert lambdas["lambda_retrieval"] == 0.0 and result.config["seed"] == 11
        metrics = result.metrics["env_runners"]
        em, fmt = metrics["reward"]["em"], metrics["reward"]["format"]
        assert fmt > em  # formatted wrong answers: λ_f has something to change
        assert metrics["episode_return_mean"] == pytest.approx(em + lam * (fmt - em), abs=1e-6)
        assert result.metrics[train_cli.TRAINING_EM] == pytest.approx(em)
        returns[lam] = metrics["episode_return_mean"]
    assert sorted(returns) == [0.0, 0.4]
    assert returns[0.4] > returns[0.0]
    best = results.get_best_result()  # the TuneConfig's metric and mode
    assert best.metrics[train_cli.TRAINING_EM] == max(r.metrics[train_cli.TRAINING_EM] for r in results)
    assert (job.out / "tune" / sweeps.SPEC_FILE).exists()
