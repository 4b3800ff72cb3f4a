"""The papers' findings in miniature: each finding is a set of arms trained from one shared warm start and
compared on held-out questions, question by question (``tuned_examples/findings.py`` runs them with Tune).

- Search-R1 (arXiv 2503.09516) Table 4: retrieved-token masking on vs off;
- the empirical study (arXiv 2505.15117): λ_f 0 vs 0.2 from a weaker warm start, λ_r 0 vs 0.1;
- the study's retrievers: dense (the bundled all-MiniLM-L6-v2, Flat) vs BM25 vs random passages;
- GRPO vs PPO (Search-R1 section 5.1) vs REINFORCE++ (R1-Searcher section 4.1: REINFORCE++ as published,
  no baseline) and REINFORCE++-baseline (the group's mean reward subtracted first);
- GRPO vs GSPO vs Dr. GRPO, each with and without LLDS (arXiv 2512.04220, the likelihood-preserving
  regulariser against GRPO's collapse on search agents);
- R-Search: the evidence reward (the served Gemma-3-270M judge) on vs off.

An arm is a transform of its finding's base recipe (``search_r1_grpo`` or ``r_search_grpo`` at CPU scale):
every arm of a finding gets the same warm start, iterations, batch (episodes per iteration), learning rate and
seeds. Each trial's held-out evaluation (greedy, at its last iteration) carries every question's answer
(``held_out(answers=True)``), so an arm's EM is the mean of its seeds' EMs and a comparison is the mean of
the seeds' paired per-question differences, each with a 95% two-level bootstrap interval (seeds drawn, then
each drawn seed's questions: ``algos/evaluation/scores.nested_bootstrap``), so an interval holds the
seed-to-seed spread as well as the questions'. Each finding also evaluates its warm start (the base recipe
before any RL: greedy, so one evaluation serves every seed), and each arm's gain over it says whether RL
helped at all. Each comparison carries its power (``scores.power``): the smallest difference its seeds can
detect, and the seeds the difference the paper reports (``Arm.effect``) would need.

The labels (each paper's claim, the verdict against it, the notes) are this module's, applied again whenever
the report is written (:func:`relabel`), so a corrected claim reaches the report without training again. A
re-check of an arm on another machine (``check*.json`` beside the results, ``check.py``) of the same run
settings is reported beside the verdict it bears on.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllib_search.algos.collapse import MONITORS

#: Training-reward columns whose per-iteration curve is plotted: the answer term where the reward has one.
CURVE_COLUMNS = ("env_runners/reward/em", "env_runners/reward/answer_f1", "env_runners/episode_return_mean")
#: Search-R1's format component is its format check (1 well-formed, 0 not), so its mean is the share of
#: well-formed training trajectories; the other protocols' format terms are scaled rewards, not shares.
FORMAT_CURVE_COLUMNS = ("env_runners/reward/format",)
#: How an analysis's intervals resample (analyses without it resampled (seed, question) pairs as one level).
SEED_AWARE = "seeds, then questions"
#: Each algorithm an arm trains with: its config class's name in ``rllib_search.algos`` and its estimator.
ALGORITHMS = {
    "grpo": ("SearchGRPOConfig", "grpo"),
    "ppo": ("SearchPPOConfig", "gae"),
    "reinforce_pp": ("SearchReinforcePPConfig", "reinforce_pp"),
    "reinforce_pp_baseline": ("SearchReinforcePPConfig", "reinforce_pp_baseline"),
}


@dataclass(frozen=True)
class Arm:
    """One configuration of a finding: ``transform(config, context)`` of the finding's base recipe, trained
    with ``algorithm`` (a key of :data:`ALGORITHMS`). A compared arm names the arm it is compared ``versus``
    (the difference is this arm minus that one) and the sign the paper reports for it (``expected``: +1, -1,
    0 for "no difference", None for no claim), in words in ``direction``, from ``source`` (default: the
    finding's). ``note`` is what the comparison's data show beyond its verdict, reported whatever it is."""

    name: str
    transform: Callable[[Any, dict[str, Any]], Any]
    algorithm: str = "grpo"
    versus: str | None = None
    expected: int | None = None
    direction: str = ""
    source: str = ""
    note: str = ""
    effect: float | None = None  # the EM difference the paper reports (absolute), for the power analysis


@dataclass(frozen=True)
class Finding:
    """A paper's finding: its arms over ``base`` (``search_r1`` or ``r_search``), from the ``standard`` or a
    ``weak`` warm start; ``reason`` is what we believe explains a non-reproduction at this scale."""

    key: str
    title: str
    source: str
    base: str
    arms: tuple[Arm, ...]
    warm_start: str = "standard"
    reason: str = ""
    needs: tuple[str, ...] = field(default_factory=tuple)

    def arm(self, name: str) -> Arm:
        return next(arm for arm in self.arms if arm.name == name)


def _training(**settings: Any) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda config, context: config.training(**settings)


def _reward(**terms: Any) -> Callable[[Any, dict[str, Any]], Any]:
    def transform(config: Any, context: dict[str, Any]) -> Any:
        config.env_config["reward_config"] = {**config.env_config.get("reward_config", {}), **terms}
        return config

    return transform


def _retriever(name: str) -> Callable[[Any, dict[str, Any]], Any]:
    def transform(config: Any, context: dict[str, Any]) -> Any:
        config.env_config["retriever"] = context["retrievers"][name]
        return config

    return transform


def _judge(on: bool) -> Callable[[Any, dict[str, Any]], Any]:
    def transform(config: Any, context: dict[str, Any]) -> Any:
        config.env_config["judge"] = context["judge"] if on else None  # no judge: the evidence term is 0
        return config

    return transform


def _same(config: Any, context: dict[str, Any]) -> Any:
    return config


FINDINGS: tuple[Finding, ...] = (
    Finding(
        key="masking",
        title="Retrieved-token masking",
        source="Search-R1 Table 4",
        base="search_r1",
        arms=(
            Arm("masking off", _training(mask_retrieved_tokens=False)),
            Arm(
                "masking on",
                _training(mask_retrieved_tokens=True),
                versus="masking off",
                expected=1,
                direction="masking helps (higher EM: LLaMA3.2-3B-base, average of 7 datasets 0.305 vs 0.147)",
                effect=0.305 - 0.147,
            ),
        ),
        reason=(
            "Search-R1 measures masking over full training runs of 512-prompt batches on 3B models, where "
            "fitting the passages' tokens pulls the policy toward writing passages; here each arm makes 10 "
            "updates of 8 episodes from a warm start already trained on whole trajectories, and we believe "
            "that drift is too small in so few updates to separate the arms, while the seed-to-seed spread "
            "of what RL does to the warm start is wide"
        ),
    ),
    Finding(
        key="lambda_format",
        title="Format reward λ_f (weaker warm start)",
        source="Empirical study (arXiv 2505.15117) section 4",
        base="search_r1",
        warm_start="weak",
        arms=(
            Arm("λ_f = 0", _reward(lambda_format=0.0, lambda_retrieval=0.0)),
            Arm(
                "λ_f = 0.2",
                _reward(lambda_format=0.2, lambda_retrieval=0.0),
                versus="λ_f = 0",
                expected=1,
                direction="the format reward speeds convergence and helps, most from a weak start",
            ),
        ),
        reason=(
            "the weaker warm start rarely answers right in its training episodes, so at 8 episodes an "
            "iteration the answer term gives GRPO almost nothing to reinforce in either arm, and a well-"
            "formed trajectory that answers wrong adds no EM; the study's speed-up is in answer reward over "
            "hundreds of steps of 512 episodes, of which 10 small iterations can show only the first step, to"
            " well-formed trajectories"
        ),
    ),
    Finding(
        key="lambda_retrieval",
        title="Retrieval reward λ_r",
        source="Empirical study (arXiv 2505.15117) section 4",
        base="search_r1",
        arms=(
            Arm("λ_r = 0", _reward(lambda_format=0.2, lambda_retrieval=0.0)),
            Arm(
                "λ_r = 0.1",
                _reward(lambda_format=0.2, lambda_retrieval=0.1),
                versus="λ_r = 0",
                expected=0,
                direction="adds little (no clear gain)",
            ),
        ),
        reason=(
            "on the synthetic world this policy answers right almost only when the gold passage came back, so"
            " the retrieval term pays where the EM term already does and adds little signal of its own; each "
            "iteration is two questions' GRPO groups of 4, the same questions in both arms for a seed"
        ),
    ),
    Finding(
        key="retrievers",
        title="Retriever quality",
        source="Empirical study (arXiv 2505.15117) section 5",
        base="search_r1",
        needs=("retrievers",),
        arms=(
            Arm("random", _retriever("random")),
            Arm(
                "BM25",
                _retriever("bm25"),
                versus="random",
                expected=1,
                direction="a better retriever trains a better agent (BM25 > random)",
            ),
            Arm(
                "dense (MiniLM, Flat)",
                _retriever("dense"),
                versus="BM25",
                expected=1,
                direction="dense > BM25 on their data",
            ),
        ),
        reason=(
            "the synthetic questions name their entities verbatim, which favours BM25's exact lexical match, "
            "where the papers' Wikipedia questions paraphrase their passages; and at a few seeds one seed "
            "lost to a format collapse moves an arm's EM more than the retriever does"
        ),
    ),
    Finding(
        key="algorithms",
        title="RL algorithm",
        source="Search-R1 section 5.1; R1-Searcher section 4.1",
        base="search_r1",
        arms=(
            Arm("GRPO", _same, algorithm="grpo"),
            Arm(
                "PPO",
                _same,
                algorithm="ppo",
                versus="GRPO",
                expected=-1,
                source="Search-R1 section 5.1, Table 3",
                direction=(
                    "GRPO ahead on held-out EM (average over 7 datasets higher in 3 of 4 models: 0.298, "
                    "0.365, 0.324 vs PPO's 0.292, 0.327, 0.305; LLaMA3.2-3B-Instruct the exception, 0.263 vs "
                    "0.322); final training rewards alike; PPO the more stable"
                ),
                effect=-0.021,  # the mean of the three models where GRPO is ahead (0.006, 0.038, 0.019)
                note=(
                    "PPO's advantages come from a value head that starts untrained and sees 8 episodes an "
                    "iteration, so they carry the critic's noise where GRPO's come from the group's own "
                    "rewards; Search-R1 found PPO the more stable after a critic warm-up over far more steps"
                ),
            ),
            Arm(
                "REINFORCE++ (no baseline)",
                _same,
                algorithm="reinforce_pp",
                versus="GRPO",
                expected=1,
                source="R1-Searcher section 4.1, Table 3",
                direction=(
                    "in-domain, as the held-out questions here are, REINFORCE++ ahead "
                    "(Llama-3.1-8B-Instruct: HotpotQA EM 58.4 vs 53.0, 2Wiki 57.5 vs 58.0); out of domain "
                    "GRPO ahead (Bamboogle 44.0 vs 48.0); average CEM level (58.9 vs 59.0), training rewards "
                    "alike"
                ),
                effect=((58.4 - 53.0) + (57.5 - 58.0)) / 2 / 100,  # in-domain EM, HotpotQA and 2Wiki
            ),
            Arm(
                "REINFORCE++-baseline",
                _same,
                algorithm="reinforce_pp_baseline",
                versus="GRPO",
                source="R1-Searcher section 4.1",
                direction="compares REINFORCE++ without a baseline (the row above), not this variant",
                note=(
                    "REINFORCE++-baseline subtracts the group's mean reward, puts its KL penalty in the "
                    "reward and whitens its returns over the batch, where GRPO scales by the group's std and "
                    "adds the KL to the loss"
                ),
            ),
        ),
    ),
    Finding(
        key="losses",
        title="Policy loss and LLDS",
        source="LLDS (arXiv 2512.04220)",
        base="search_r1",
        arms=(
            Arm("GRPO", _training(policy_loss="grpo")),
            Arm(
                "GRPO + LLDS",
                _training(policy_loss="grpo", llds_coeff=0.2),
                versus="GRPO",
                expected=1,
                direction=(
                    "LLDS (λ 0.2, action-level gate) keeps GRPO from collapsing and helps: about +45% "
                    "relative EM over vanilla GRPO on Qwen2.5-3B"
                ),
            ),
            Arm("GSPO", _training(policy_loss="gspo"), versus="GRPO", direction="no claim in these papers"),
            Arm(
                "GSPO + LLDS",
                _training(policy_loss="gspo", llds_coeff=0.2),
                versus="GSPO",
                expected=1,
                direction="LLDS helps GSPO too (GSPO + LLDS: 0.451 average EM, Qwen2.5-3B-Instruct)",
            ),
            Arm(
                "Dr. GRPO",
                _training(policy_loss="dr_grpo"),
                versus="GRPO",
                direction="no claim in these papers",
            ),
            Arm(
                "Dr. GRPO + LLDS",
                _training(policy_loss="dr_grpo", llds_coeff=0.2),
                versus="Dr. GRPO",
                expected=1,
                direction="LLDS's gate applies to any policy loss",
            ),
        ),
    ),
    Finding(
        key="evidence",
        title="R-Search evidence reward",
        source="R-Search ablation (evidence reward)",
        base="r_search",
        needs=("judge",),
        arms=(
            Arm("evidence reward off", _judge(False)),
            Arm(
                "evidence reward on",
                _judge(True),
                versus="evidence reward off",
                expected=1,
                direction=(
                    "the evidence reward helps (Qwen2.5-3B-Instruct, EM averaged over 7 datasets: 42.9 with "
                    "evidence vs 40.0 without, Appendix A.2)"
                ),
                effect=(300.0 - 279.8) / 7 / 100,
            ),
        ),
        reason=(
            "R-Search's ablation also removes the evidence from the rollout; here only the reward is "
            "switched. The evidence term (the judge's answer F1 from the policy's quoted evidence) is added "
            "with weight 1 as in R-Search's eq. 6 (the 0.2 of eq. 5 is γ_e, the format reward for a well-"
            "formed evidence box), and it pays mostly in episodes whose own answers score too, which GRPO "
            "reinforces anyway"
        ),
    ),
)
BY_KEY = {finding.key: finding for finding in FINDINGS}


def select(keys: Sequence[str] | None) -> list[Finding]:
    """The findings named in ``keys`` (all when None), in the study's order."""
    if not keys:
        return list(FINDINGS)
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        raise ValueError(f"unknown findings {unknown}; known: {list(BY_KEY)}")
    return [f for f in FINDINGS if f.key in keys]


def experiment_name(finding: Finding, arm: Arm, max_turn_tokens: int) -> str:
    """The Tune experiment directory of one arm (its seeds are its trials) trained at a turn budget of
    ``max_turn_tokens``: an arm measured at another budget is another experiment, never resumed or read as
    this one's."""
    slug = "".join(c if c.isalnum() else "_" for c in arm.name.lower().replace("λ", "lambda")).strip("_")
    return f"{finding.key}__{slug}__{max_turn_tokens}_tokens"


def config_class(algorithm: str) -> Any:
    """The config class ``algorithm`` (a key of :data:`ALGORITHMS`) trains with."""
    import rllib_search.algos as algos

    return getattr(algos, ALGORITHMS[algorithm][0])


def trainable(arm: Arm) -> Any:
    """The RLlib Algorithm class an arm trains with (its config class's, named without ``Config``)."""
    import rllib_search.algos as algos

    return getattr(algos, ALGORITHMS[arm.algorithm][0].removesuffix("Config"))


def with_algorithm(config: Any, algorithm: str) -> Any:
    """``config`` trained by ``algorithm`` with the same env, model, learning rate, KL coefficient, masking
    and budget: the same episodes per iteration (PPO samples one response a prompt, so it takes
    ``group_size`` times the prompts) and mini-batch; each algorithm keeps its own estimator defaults (and
    PPO the CPU recipe's critic learning rate); its advantage estimator is the algorithm's
    (:data:`ALGORITHMS`)."""
    from rllib_search.env.search_env import ENV_ID
    from rllib_search.recipes.search_r1 import search_r1_ppo

    cls, estimator = config_class(algorithm), ALGORITHMS[algorithm][1]
    if type(config) is cls and config.advantage_estimator == estimator:
        return config
    episodes = int(config.group_size) * int(config.prompts_per_sample)
    group = 1 if algorithm == "ppo" else int(config.group_size)
    model_config = dict(config.model_config)
    if algorithm == "ppo":
        model_config["value_head"] = True
    new = (
        cls()
        .environment(ENV_ID, env_config=copy.deepcopy(config.env_config))
        .rl_module(model_config=model_config)
        .rollouts(
            group_size=group,
            prompts_per_sample=max(1, episodes // group),
            engine=config.engine,
            engine_options=dict(config.engine_options),
            temperature=config.temperature,
            top_p=config.top_p,
            max_turn_tokens=config.max_turn_tokens,
        )
        .training(
            lr=config.lr,
            minibatch_size=config.minibatch_size,
            micro_batch_size=config.micro_batch_size,
            kl_coeff=config.kl_coeff,
            mask_retrieved_tokens=config.mask_retrieved_tokens,
            advantage_estimator=estimator,
        )
    )
    if algorithm == "ppo":
        new.training(critic_lr=search_r1_ppo(dataset=None, scale="cpu").critic_lr)
    return new


def arm_config(base: Any, arm: Arm, context: dict[str, Any]) -> Any:
    """The arm's config: its transform of a copy of ``base``, trained by its algorithm."""
    config = base.copy(copy_frozen=False)
    config.env_config = copy.deepcopy(base.env_config)
    return with_algorithm(arm.transform(config, context), arm.algorithm)


# --- results ----------------------------------------------------------------------------------------------
def trial_record(result: Any) -> dict[str, Any]:
    """What a study keeps of one Tune trial: its seed, iterations, held-out answers and learning curve."""
    from rllib_search.recipes.sweeps import metric_curve

    metrics = result.metrics or {}
    answers = metrics.get("evaluation_answers")
    curve = metric_curve(result, CURVE_COLUMNS)
    format_curve = metric_curve(result, FORMAT_CURVE_COLUMNS)
    monitors = {name: metric_curve(result, (column,)) for name, column in MONITORS.items()}
    return {
        "seed": (result.config or {}).get("seed"),
        "iterations": metrics.get("training_iteration"),
        "held_out_em": metrics.get("evaluation", {}).get("em"),
        "answers": json.loads(answers) if isinstance(answers, str) else None,
        "curve": [float(x) for x in curve],
        "format_curve": [float(x) for x in format_curve],
        # The collapse monitors per iteration (NaN where an iteration lacks one, as JSON null).
        "monitor_curves": {
            name: [None if x != x else float(x) for x in values]
            for name, values in monitors.items()
            if len(values)
        },
    }


def _predictions(trials: list[dict[str, Any]]) -> dict[tuple[Any, str], dict[str, Any]]:
    return {(t["seed"], a["uid"]): a for t in trials for a in t["answers"]}


def _correct(answer: dict[str, Any]) -> float:
    from rllib_search.env.rewards import exact_match

    return float(exact_match(answer["answer"], answer["golden_answers"]))


def _per_seed_correct(trials: list[dict[str, Any]], hops: int | None = None) -> dict[Any, dict[str, float]]:
    """Seed -> question uid -> 1.0 right / 0.0 wrong (exact match), on ``hops``-hop questions (all: None)."""
    return {
        t["seed"]: {
            a["uid"]: _correct(a) for a in t["answers"] if hops is None or str(a["hops"]) == str(hops)
        }
        for t in trials
    }


def _hop_counts(trials: list[dict[str, Any]]) -> list[str]:
    return sorted({str(a["hops"]) for t in trials for a in t["answers"]}, key=lambda h: (len(h), h))


def _seed_em(correct: dict[Any, dict[str, float]]) -> dict[str, float]:
    from rllib_search.algos.evaluation.scores import nested_bootstrap

    return nested_bootstrap([list(by_uid.values()) for by_uid in correct.values() if by_uid]).to_dict()


def _differences(
    after: dict[Any, dict[str, float]], before: dict[Any, dict[str, float]] | dict[str, float]
) -> list[list[float]]:
    """Per seed of ``after``, its correctness minus ``before``'s on each question both answered;
    ``before`` is per seed too, or one mapping for every seed (a warm start's greedy answers)."""
    rows = []
    for seed, right in after.items():
        baseline = before if all(isinstance(v, float) for v in before.values()) else before.get(seed, {})
        shared = sorted(uid for uid in right if uid in baseline)
        if shared:
            rows.append([right[uid] - baseline[uid] for uid in shared])
    return rows


def _seed_gain(rows: list[list[float]]) -> dict[str, float] | None:
    from rllib_search.algos.evaluation.scores import nested_bootstrap

    return nested_bootstrap(rows).to_dict() if rows else None


def reproduced(expected: int | None, low: float, high: float) -> str:
    """The verdict of a difference's interval against the paper's sign."""
    if expected is None:
        return "no claim"
    if expected == 0:
        return "yes" if low <= 0 <= high else "no"
    if low <= 0 <= high:
        return "inconclusive (interval covers 0)"
    return "yes" if (low > 0) == (expected > 0) else "no"


def analyse(
    finding: Finding,
    trials_by_arm: dict[str, list[dict[str, Any]]],
    warm_start: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One finding's figures: per arm the held-out EM (F1, cover-EM) with seed-aware intervals, overall and
    per hop count, and its gain over the warm start (``warm_start``: the warm start's held-out answers);
    per compared arm the paired gain, its power and its verdict."""
    from rllib_search.algos.evaluation.scores import paired_gain, power, score_predictions

    arms: dict[str, Any] = {}
    complete = {}
    warm = {a["uid"]: _correct(a) for a in warm_start} if warm_start else None
    for arm in finding.arms:
        trials = sorted(
            (t for t in trials_by_arm.get(arm.name, []) if t["answers"]), key=lambda t: str(t["seed"])
        )
        if not trials:
            arms[arm.name] = {"status": "not yet run"}
            continue
        complete[arm.name] = trials
        rows = [a for t in trials for a in t["answers"]]
        scores = score_predictions(
            [a["answer"] for a in rows], [a["golden_answers"] for a in rows], [a["hops"] for a in rows]
        )
        curves = [t["curve"] for t in trials if t["curve"]]
        length = min((len(c) for c in curves), default=0)
        correct = _per_seed_correct(trials)
        arms[arm.name] = {
            "status": "run",
            "algorithm": arm.algorithm,
            "seeds": sorted(t["seed"] for t in trials),
            "iterations": max(t["iterations"] or 0 for t in trials),
            "per_seed_em": {str(t["seed"]): t["held_out_em"] for t in trials},
            "questions_per_seed": len(trials[0]["answers"]),
            "em": _seed_em(correct),
            "em_by_hop": {hops: _seed_em(_per_seed_correct(trials, hops)) for hops in _hop_counts(trials)},
            "scores": scores.to_dict(),
            "curves": {str(t["seed"]): t["curve"] for t in trials},
            "format_curves": {str(t["seed"]): t.get("format_curve") or [] for t in trials},
            "monitor_curves": {
                str(t["seed"]): t["monitor_curves"] for t in trials if t.get("monitor_curves")
            },
            "curve_mean": [sum(c[i] for c in curves) / len(curves) for i in range(length)],
            "training_answer_reward_mean": (
                sum(sum(c) / len(c) for c in curves) / len(curves) if curves else None
            ),
            # The trials themselves: a later run (another session or machine) analyses them again with the
            # arms it trains (tuned_examples/findings.py carries them over arm by arm).
            "trials": trials,
        }
        machines = _unique(t["machine"] for t in trials if t.get("machine"))
        if machines:
            arms[arm.name]["machines"] = machines
        if warm is not None:
            arms[arm.name]["gain_over_warm_start"] = _seed_gain(_differences(correct, warm))
    comparisons = []
    for arm in finding.arms:
        if arm.versus is None:
            continue
        measured = None
        if arm.name in complete and arm.versus in complete:
            after, before = _predictions(complete[arm.name]), _predictions(complete[arm.versus])
            keys = sorted(set(after) & set(before), key=str)
            gain = paired_gain(
                [before[k]["answer"] for k in keys],
                [after[k]["answer"] for k in keys],
                [after[k]["golden_answers"] for k in keys],
                [after[k]["hops"] for k in keys],
            )
            rows = _differences(
                _per_seed_correct(complete[arm.name]), _per_seed_correct(complete[arm.versus])
            )
            measured = {
                "pairs": len(keys),
                "em_gain": _seed_gain(rows),
                "gain": gain.to_dict(),
                "power": power(rows, arm.effect).to_dict(),
            }
        comparisons.append(labelled(finding, arm, arms, measured))
    analysis = {
        "title": finding.title,
        "source": finding.source,
        "base": finding.base,
        "warm_start": finding.warm_start,
        "intervals": SEED_AWARE,
        "status": _status(finding, arms),
        "arms": arms,
        "comparisons": comparisons,
    }
    if warm_start:
        analysis["warm_start_eval"] = {
            "em": _seed_em({"warm start": warm}),
            "em_by_hop": {
                hops: _seed_em(
                    {"warm start": {a["uid"]: _correct(a) for a in warm_start if str(a["hops"]) == hops}}
                )
                for hops in sorted({str(a["hops"]) for a in warm_start}, key=lambda h: (len(h), h))
            },
            "answers": warm_start,
        }
    return analysis


def _unique(items: Any) -> list[Any]:
    """``items`` without repeats (compared as JSON), in order."""
    seen: dict[str, Any] = {}
    for item in items:
        seen.setdefault(json.dumps(item, sort_keys=True), item)
    return list(seen.values())


def carried_trials(analysis: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """Arm name -> its trials, for each arm an earlier :func:`analyse` recorded trials of (arms analysed
    before trials were kept have none: they cannot be analysed again with new arms)."""
    arms = (analysis or {}).get("arms", {})
    return {
        name: arm["trials"] for name, arm in arms.items() if arm.get("status") == "run" and arm.get("trials")
    }


def _status(finding: Finding, arms: dict[str, Any]) -> str:
    run = sum(arms.get(arm.name, {}).get("status") == "run" for arm in finding.arms)
    return "run" if run == len(finding.arms) else "partly run" if run else "not yet run"


def verdict(arm: Arm, arms: dict[str, Any], em_gain: dict[str, float]) -> str:
    """The verdict of ``arm``'s measured difference (``em_gain``) against its paper's sign; a "no
    difference" between two arms that both answer almost nothing is inconclusive, not a yes."""
    result = reproduced(arm.expected, em_gain["low"], em_gain["high"])
    learned = max(arms[name]["em"]["value"] for name in (arm.name, arm.versus)) >= 0.05
    if result == "yes" and arm.expected == 0 and not learned:
        return "inconclusive (neither arm learned)"
    return result


def labelled(
    finding: Finding, arm: Arm, arms: dict[str, Any], measured: dict[str, Any] | None
) -> dict[str, Any]:
    """``arm``'s comparison entry: the paper's claim as this module states it and, given what was
    ``measured`` (``pairs``, ``em_gain``, ``gain``; None: not yet run), the verdict, the reason for a
    non-reproduction and the arm's note."""
    entry: dict[str, Any] = {
        "arm": arm.name,
        "versus": arm.versus,
        "source": arm.source or finding.source,
        "expected": arm.expected,
        "direction": arm.direction,
    }
    if measured is None:
        entry.update(status="not yet run", reproduced="not yet run")
        return entry
    entry.update(status="run", **measured, reproduced=verdict(arm, arms, measured["em_gain"]))
    if entry["reproduced"] not in ("yes", "no claim"):
        entry["reason"] = explain(finding, arms, entry)
    entry["note"] = "; ".join(
        part for part in (observed(arms, (arm.name, str(arm.versus))), arm.note) if part
    )
    return entry


def relabel(finding: Finding, analysis: dict[str, Any]) -> dict[str, Any]:
    """``analysis`` (an :func:`analyse` output, perhaps written by an earlier version of this module) with
    its arms and comparisons those ``finding`` has now and every label (claim, verdict, reason, note) this
    module's: the measurements (each arm's figures, each comparison's paired gain) are kept as they are,
    an arm the finding has gained reads "not yet run", and one it no longer has is left out."""
    stored = {(c["arm"], c["versus"]): c for c in analysis.get("comparisons", []) if c.get("status") == "run"}
    measured_arms = analysis.get("arms", {})
    arms = {arm.name: measured_arms.get(arm.name, {"status": "not yet run"}) for arm in finding.arms}
    comparisons = []
    for arm in finding.arms:
        if arm.versus is None:
            continue
        entry = stored.get((arm.name, arm.versus))
        both_run = all(arms[name]["status"] == "run" for name in (arm.name, arm.versus))
        kept = ("pairs", "em_gain", "gain", "power")
        measured = {key: entry[key] for key in kept if key in entry} if entry else {}
        if measured and both_run and "power" not in measured:  # analysed before power was recorded
            measured["power"] = seed_power(arm, arms)
        comparisons.append(labelled(finding, arm, arms, measured if measured and both_run else None))
    return {
        **analysis,
        "title": finding.title,
        "source": finding.source,
        "status": _status(finding, arms),
        "arms": arms,
        "comparisons": comparisons,
    }


def seed_power(arm: Arm, arms: dict[str, Any]) -> dict[str, Any] | None:
    """A comparison's power from its arms' per-seed EMs (the seeds both ran): the variance of one seed's
    difference is all :func:`scores.power` needs."""
    from rllib_search.algos.evaluation.scores import power

    after, before = arms[arm.name].get("per_seed_em", {}), arms[str(arm.versus)].get("per_seed_em", {})
    differences = [[after[seed] - before[seed]] for seed in sorted(after) if seed in before]
    return power(differences, arm.effect).to_dict() if differences else None


def explain(finding: Finding, arms: dict[str, Any], entry: dict[str, Any]) -> str:
    """What we believe explains a comparison that did not reproduce: what the data show, then the finding's
    likely cause at this scale."""
    ems = [arms[name]["em"]["value"] for name in (entry["arm"], entry["versus"])]
    gain = entry["em_gain"]
    parts = []
    if max(ems) < 0.05:
        parts.append("neither arm answers held-out questions (EM below 0.05), so there is nothing to compare")
    elif entry["reproduced"].startswith("inconclusive"):
        parts.append(
            f"{entry['pairs']} paired (seed, question) answers cannot resolve a difference of "
            f"{gain['value']:+.3f} (interval [{gain['low']:+.3f}, {gain['high']:+.3f}])"
        )
        if entry.get("power"):
            parts.append(power_text(entry["power"]))
    else:
        parts.append(f"the difference is {gain['value']:+.3f} [{gain['low']:+.3f}, {gain['high']:+.3f}]")
    return "; ".join([*parts, finding.reason] if finding.reason else parts)


#: A seed whose share of well-formed training trajectories over its last iterations is below this has lost
#: its format (Search-R1's format check; the other protocols' format terms are not shares).
FORMAT_LOST = 0.5
#: The iterations at the end of a seed's curve the format share is read over.
LAST_ITERATIONS = 3


def observed(arms: dict[str, Any], names: Sequence[str]) -> str:
    """What the measurements of the arms ``names`` show beyond a verdict, from the stored figures alone: each
    arm's per-seed EM, its gain over the warm start, its training answer reward over the first and the
    second half of its iterations, and the seeds that lost their format."""
    return "; ".join(_arm_observed(name, arms[name]) for name in names if arms[name].get("status") == "run")


def _arm_observed(name: str, figures: dict[str, Any]) -> str:
    per_seed = figures.get("per_seed_em", {})
    seeds = sorted(per_seed, key=int)
    parts = []
    if seeds:
        parts.append(
            "held-out EM per seed "
            + ", ".join(f"{per_seed[seed]:.2f}" for seed in seeds)
            + f" (seeds {', '.join(seeds)})"
        )
    if "gain_over_warm_start" in figures:
        parts.append(f"{_estimate(figures['gain_over_warm_start'], signed=True)} against the warm start")
    curve = figures.get("curve_mean", [])
    if len(curve) >= 2:
        half = len(curve) // 2
        first, second = sum(curve[:half]) / half, sum(curve[half:]) / (len(curve) - half)
        parts.append(
            f"training answer reward {first:.2f} over iterations 1-{half} and {second:.2f} over "
            f"{half + 1}-{len(curve)}"
        )
    lost = []
    for seed, shares in sorted(figures.get("format_curves", {}).items(), key=lambda item: int(item[0])):
        last = shares[-LAST_ITERATIONS:]
        if last and sum(last) / len(last) < FORMAT_LOST:
            lost.append(f"seed {seed} ({sum(last) / len(last):.2f})")
    if lost:
        parts.append(
            f"lost its format (well-formed share of training trajectories over the last {LAST_ITERATIONS} "
            f"iterations): {', '.join(lost)}"
        )
    return f"{name}: " + ", ".join(parts) if parts else ""


def power_text(figures: dict[str, Any]) -> str:
    """'3 seeds detect a difference of 0.210 or more (80% power, 5% two-sided); the paper reports +0.158,
    which needs 6 seeds' (``scores.Power``'s figures)."""
    seeds = figures["seeds"]
    detects = f"{seeds} seed{'s' if seeds != 1 else ''} detect"
    if figures["detectable"] >= 1:
        text = f"{detects} no difference an EM can show (the 80%-power bound is {figures['detectable']:.3f})"
    else:
        text = f"{detects} a difference of {figures['detectable']:.3f} or more (80% power, 5% two-sided)"
    if figures.get("effect") is None:
        return text + "; the paper's difference is not stated in figures we could use"
    return text + f"; the paper reports {figures['effect']:+.3f}, which needs {figures['seeds_needed']} seeds"


# --- the report -------------------------------------------------------------------------------------------
# A finding whose analysis records no turn budget was measured at these shorter CPU budgets, which cut the
# teacher's longer turns: R-Search's answer turn quoting its evidence (up to 123 tokens, most of them over
# 64), a few of Search-R1's second searches (up to 54).
EARLIER_TURN_BUDGETS = {"search_r1": 48, "r_search": 64}


def measured_turn_budget(finding: Finding, analysis: dict[str, Any]) -> int:
    """The turn budget (tokens a turn may generate) ``finding``'s ``analysis`` was measured at."""
    return int(analysis.get("max_turn_tokens", EARLIER_TURN_BUDGETS[finding.base]))


def turn_budgets_text(results: dict[str, dict[str, Any]]) -> str:
    """The report's line of turn budgets: each budget with the findings measured at it."""
    by_budget: dict[int, list[str]] = {}
    for finding in FINDINGS:
        if finding.key in results:
            by_budget.setdefault(measured_turn_budget(finding, results[finding.key]), []).append(
                finding.title
            )
    return "; ".join(f"{budget} ({', '.join(titles)})" for budget, titles in by_budget.items()) or "—"


#: A finding's results carry over between runs (and machines) only when all of these match.
RUN_SETTINGS = (
    "scale",
    "model",
    "world_seed",
    "iterations",
    "seeds",
    "held_out_per_hop",
    "hops",
    "warm_start_steps",
    "weak_warm_start_steps",
    "main_warm_start",
)


def same_run_settings(earlier: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether two runs' settings (:data:`RUN_SETTINGS`) match; a main job's warm start is compared by its
    weights and settings, not by the folder it was read from."""

    def settings(document: dict[str, Any]) -> dict[str, Any]:
        values = {key: document.get(key) for key in RUN_SETTINGS}
        if values["main_warm_start"]:
            values["main_warm_start"] = {k: v for k, v in values["main_warm_start"].items() if k != "model"}
        return values

    return settings(earlier) == settings(run)


def judges_text(results: dict[str, dict[str, Any]]) -> str:
    """The judge each finding that needs one was measured with (``findings.py`` records it)."""
    lines = []
    for finding in FINDINGS:
        analysis = results.get(finding.key)
        if "judge" not in finding.needs or not analysis or analysis.get("status") == "not yet run":
            continue
        judge = analysis.get("judge")
        text = (
            f"`{judge['model']}`, greedy, {judge['examples']} worked examples before R-Search's template"
            if judge
            else "the bare template (recorded before judges were)"
        )
        lines.append(f"{text} ({finding.title})")
    return "; ".join(lines) or "—"


def machine_line(machine: dict[str, Any]) -> str:
    """One line of a run's recorded machine (``tuned_examples/findings.py``'s ``machine()``)."""
    from rllib_search.llm.models import describe_cpu

    return f"{describe_cpu(machine)}, {machine.get('precision', 'fp32')}, torch {machine.get('torch', '?')}"


def machines_text(results: dict[str, dict[str, Any]]) -> str:
    """'<CPU line> (Retrieved-token masking); not recorded (RL algorithm)': the machine each finding ran
    on, as its analysis records it (findings analysed before machines were recorded have none)."""
    by_machine: dict[str, list[str]] = {}
    for finding in FINDINGS:
        analysis = results.get(finding.key)
        if analysis is None or analysis.get("status") == "not yet run":
            continue
        machines = _unique(m for arm in analysis.get("arms", {}).values() for m in arm.get("machines", []))
        for machine in machines or [analysis.get("machine")]:
            line = machine_line(machine) if machine else "not recorded"
            by_machine.setdefault(line, []).append(finding.title)
    return "; ".join(f"{line} ({', '.join(titles)})" for line, titles in by_machine.items()) or "—"


def report(
    run: dict[str, Any], results: dict[str, dict[str, Any]], markdown: Path, json_path: Path
) -> dict[str, Any]:
    """Write ``findings.json`` and the markdown report (one table, the learning curves beside it as PNGs
    under ``<markdown's folder>/findings/``) from ``results`` (finding key -> :func:`analyse` output or
    absent: not yet run), labelled by this module (:func:`relabel`), with the re-checks found beside
    ``json_path`` (:func:`rechecks`); returns the JSON document."""
    from rllib_search.recipes.sweeps import plot_mean_curves

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    document = {"generated": date, "run": run, "findings": {}}
    figures = markdown.parent / "findings"
    status = "" if run else ' No arm has run yet: every row reads "not yet run".'
    checks = rechecks(json_path.parent, run)
    lines = [
        "# The papers' findings in miniature",
        "",
        "Generated by `tuned_examples/findings.py` from its Tune results; do not edit by hand. Run it (see "
        f"the README's tuned examples) to fill the table.{status}",
        "",
        f"- generated: {date}",
        f"- scale: {run.get('scale', '—')}; policy: `{run.get('model', '—')}`; embedded default (synthetic "
        f"world seed {run.get('world_seed', 0)}, CPU)",
        f"- per arm: {run.get('iterations', '—')} iterations, seeds {run.get('seeds', '—')}, warm start "
        f"{_warm_start_text(run)} (weak: {run.get('weak_warm_start_steps', '—')} SFT steps), "
        f"held-out {run.get('held_out_per_hop', '—')} questions per hop count {run.get('hops', '—')}",
        "- turn budget (tokens a turn may generate) the findings were measured at: "
        f"{turn_budgets_text(results)}",
        f"- machine (fp32 on the CPU; `--check` re-runs arms elsewhere): {machines_text(results)}",
        f"- evidence judge: {judges_text(results)}",
        "- EM: held-out exact match, the mean of the seeds' EMs, with a 95% two-level bootstrap interval "
        "(seeds drawn, then each drawn seed's questions; † marks findings analysed before seed-aware "
        "intervals, whose intervals resample (seed, question) pairs); ΔEM: the paired per-question "
        "difference (arm minus the one it is compared with), interval the same way; vs warm start: the "
        "arm's paired gain over its finding's warm start (the base recipe before any RL, greedy), i.e. "
        "whether RL helped. Reproduced: yes / no / inconclusive (interval covers 0); for a paper's "
        '"no difference", yes when the interval covers 0; the power of each comparison is listed below the '
        "table"
        + (
            "; re-checked: how the arms trained again on another machine compare (the re-checks below)."
            if checks
            else "."
        ),
        "",
        "| Finding | Arm | Held-out EM [95% CI] | EM per hop count | Seeds | vs warm start | Compared with | "
        "ΔEM [95% CI] | Paper reports | Reproduced here |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes, arm_notes, curves_md, powers = [], [], [], []
    for finding in FINDINGS:
        analysis = results.get(finding.key)
        if analysis is not None:
            analysis = relabel(finding, analysis)
            document["findings"][finding.key] = analysis
        else:
            document["findings"][finding.key] = {
                "title": finding.title,
                "source": finding.source,
                "status": "not yet run",
            }
        comparisons = {c["arm"]: c for c in (analysis or {}).get("comparisons", [])}
        dagger = "" if (analysis or {}).get("intervals") == SEED_AWARE else " †"
        warm = (analysis or {}).get("warm_start_eval")
        if warm:
            hops = ", ".join(f"{h}-hop {e['value']:.3f}" for h, e in warm["em_by_hop"].items())
            lines.append(
                f"| {finding.title} | warm start (no RL) | {_estimate(warm['em'])} | {hops} | — | — | — | "
                "— | — | — |"
            )
        for arm in finding.arms:
            figures_of_arm = (analysis or {}).get("arms", {}).get(arm.name, {"status": "not yet run"})
            run_here = figures_of_arm["status"] == "run"
            em = _estimate(figures_of_arm["em"]) + dagger if run_here else "not yet run"
            seeds = ", ".join(str(s) for s in figures_of_arm["seeds"]) if run_here else "—"
            per_hop = _per_hop(figures_of_arm) if run_here else "—"
            over_warm = figures_of_arm.get("gain_over_warm_start") if run_here else None
            over_warm = _estimate(over_warm, signed=True) if over_warm else "—"
            versus = gain = paper = verdict = "—"
            if arm.versus is not None:
                versus, paper = arm.versus, f"{arm.source or finding.source}: {arm.direction}"
                comparison = comparisons.get(arm.name, {})
                verdict = comparison.get("reproduced", "not yet run")
                if comparison.get("status") == "run":
                    gain = _estimate(comparison["em_gain"], signed=True) + dagger
                    if comparison.get("power"):
                        figures_of_power = power_text(comparison["power"])
                        powers.append(
                            f"- **{finding.title}, {arm.name} vs {arm.versus}**: {figures_of_power}."
                        )
                    bearing = [
                        c for c in checks if c["finding"] == finding.key and c["arm"] in (arm.name, versus)
                    ]
                    if bearing:
                        verdict += "; re-checked on another machine: " + ", ".join(
                            f"{c['arm']} {c['verdict']}" for c in bearing
                        )
                    heading = f"- **{finding.title}, {arm.name} vs {arm.versus}** ({verdict}): "
                    if "reason" in comparison:
                        notes.append(f"{heading}{comparison['reason']}.")
                    if "note" in comparison:
                        arm_notes.append(f"{heading}{comparison['note']}.")
            lines.append(
                f"| {finding.title} | {arm.name} | {em} | {per_hop} | {seeds} | {over_warm} | {versus} | "
                f"{gain} | {paper} | {verdict} |"
            )
        if analysis is None or analysis["status"] == "not yet run":  # no curves: none of an earlier run
            for suffix in ("", "_format", "_monitors"):
                stale = figures / f"{finding.key}{suffix}.png"
                stale.unlink(missing_ok=True)
        else:
            figures.mkdir(parents=True, exist_ok=True)
            png = figures / f"{finding.key}.png"
            plot_mean_curves(
                _seed_curves(analysis, "curves"),
                png,
                title=f"{finding.title}: training answer reward",
                ylabel="answer reward (mean of seeds)",
            )
            curves_md.append(f"![{finding.title}](findings/{png.name})")
            format_curves = _seed_curves(analysis, "format_curves")
            if finding.base == "search_r1" and any(any(runs) for runs in format_curves.values()):
                png = figures / f"{finding.key}_format.png"
                plot_mean_curves(
                    format_curves,
                    png,
                    title=f"{finding.title}: well-formed training trajectories",
                    ylabel="share well-formed (mean of seeds)",
                )
                curves_md.append(f"![{finding.title}: well-formed](findings/{png.name})")
            monitors = _monitor_curves(analysis)
            if monitors:
                png = figures / f"{finding.key}_monitors.png"
                plot_monitors(monitors, png, title=f"{finding.title}: collapse monitors (mean of seeds)")
                curves_md.append(f"![{finding.title}: collapse monitors](findings/{png.name})")
    if powers:
        lines += ["", "## Power", "", *powers]
    if notes:
        lines += ["", "## Why a finding did not reproduce here", "", *notes]
    if arm_notes:
        lines += ["", "## What the comparisons' data show beyond their verdicts", "", *arm_notes]
    if checks:
        lines += [
            "",
            "## Re-checks on another machine",
            "",
            "Arms trained again from the same seeds and settings on another machine "
            "(`tuned_examples/findings.py --check`; `rllib_search/recipes/findings/check.py` says what "
            "carries across CPUs), each set beside its committed EM. A verdict whose arms' re-check differs "
            "is one machine's result: it did not reproduce.",
            "",
            *[_recheck_line(check, markdown.parent) for check in checks],
        ]
    if curves_md:
        lines += [
            "",
            "## Learning curves",
            "",
            "Training answer reward (EM term; R-Search: answer F1) per iteration, mean over seeds; for "
            "the Search-R1 findings also the share of training trajectories that pass its format check "
            "(whatever λ_f pays for it).",
            "",
            *curves_md,
        ]
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text("\n".join(lines) + "\n")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    return document


def rechecks(folder: Path, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The compared arms of every re-check (``check*.json``, ``check.py``'s documents) in ``folder`` that
    re-ran the reported ``run`` (a check of other run settings checked results the report does not hold), in
    file-name order, each with the file it came from and the machine it re-ran on."""
    entries = []
    for path in sorted(folder.glob("check*.json")):
        document = json.loads(path.read_text())
        if not same_run_settings(document.get("committed", {}).get("run", {}), run):
            continue
        machine = document.get("rerun", {}).get("machine")
        for entry in document.get("arms", []):
            if entry.get("status") == "compared":
                entries.append({**entry, "file": path, "machine": machine})
    return entries


def _recheck_line(check: dict[str, Any], folder: Path) -> str:
    """One re-checked arm: where it re-ran, each seed's committed and re-run EM, the pooled difference."""
    import os

    machine = machine_line(check["machine"]) if check["machine"] else "machine not recorded"
    seeds = "; ".join(
        f"seed {r['seed']}: {r['committed_em']:.3f} -> {r['rerun_em']:.3f}" for r in check["per_seed"]
    )
    d = check["difference"]
    return (
        f"- **{check['title']}, {check['arm']}** (`{os.path.relpath(check['file'], folder)}`, on {machine}): "
        f"{seeds}; pooled {check['committed_em']:.3f} -> {check['rerun_em']:.3f}, "
        f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]: {check['verdict']}."
    )


def _monitor_curves(analysis: dict[str, Any]) -> dict[str, dict[str, list[list[float | None]]]]:
    """Monitor -> arm -> that arm's per-seed curves, for the monitors some run arm recorded (analyses
    carried over from before monitors were recorded have none)."""
    curves: dict[str, dict[str, list[list[float | None]]]] = {}
    for name, figures_of_arm in analysis["arms"].items():
        if figures_of_arm["status"] != "run":
            continue
        for per_monitor in figures_of_arm.get("monitor_curves", {}).values():
            for monitor, values in per_monitor.items():
                curves.setdefault(monitor, {}).setdefault(name, []).append(values)
    return {monitor: curves[monitor] for monitor in MONITORS if monitor in curves}


def plot_monitors(curves: dict[str, dict[str, list[list[float | None]]]], path: Path, *, title: str) -> None:
    """One panel per monitor, one line per arm: the mean over its seeds per iteration (missing values
    skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns = 3
    rows = -(-len(curves) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    for ax, (monitor, by_arm) in zip(axes.flat, curves.items()):
        for arm, runs in by_arm.items():
            length = min(len(run) for run in runs)
            values = np.array(
                [[np.nan if x is None else x for x in run[:length]] for run in runs], dtype=float
            )
            kept = ~np.isnan(values).all(axis=0)
            if kept.any():
                mean = np.nanmean(values[:, kept], axis=0)
                ax.plot(np.arange(1, length + 1)[kept], mean, marker=".", label=arm)
        ax.set_title(monitor, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
    for ax in list(axes.flat)[len(curves) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _seed_curves(analysis: dict[str, Any], field: str) -> dict[str, list[list[float]]]:
    """Each run arm's per-seed curves of ``field`` (``curves`` or ``format_curves``; analyses carried over
    from before a field existed have none)."""
    return {
        name: list(figures_of_arm.get(field, {}).values())
        for name, figures_of_arm in analysis["arms"].items()
        if figures_of_arm["status"] == "run"
    }


def _per_hop(figures_of_arm: dict[str, Any]) -> str:
    """'1-hop 0.833, 2-hop 0.000': an arm's EM per hop count (the pooled EM hides which hops it answers), with
    its seed-aware interval where the analysis has one."""
    if "em_by_hop" in figures_of_arm:
        by_hop = figures_of_arm["em_by_hop"]
        return ", ".join(f"{hops}-hop {_estimate(by_hop[hops])}" for hops in sorted(by_hop, key=int))
    groups = figures_of_arm["scores"].get("groups", {})
    return ", ".join(f"{hops}-hop {groups[hops]['em']['value']:.3f}" for hops in sorted(groups, key=int))


def _warm_start_text(run: dict[str, Any]) -> str:
    """The standard warm start of a run: its own SFT steps, or the main job's warm start it started from."""
    main = run.get("main_warm_start")
    steps = f"{run.get('warm_start_steps', '—')} SFT steps"
    if not main:
        return steps
    where = Path(main["model"]).parent.name
    return (
        f"the main job's warm start for the Search-R1 findings (`{where}`: protocol {main['protocol']}, "
        f"top-{main['topk']}, {main['max_turn_tokens']} tokens a turn; R-Search's: {steps})"
    )


def _estimate(estimate: dict[str, float], signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{estimate['value']:{sign}.3f} [{estimate['low']:{sign}.3f}, {estimate['high']:{sign}.3f}]"
