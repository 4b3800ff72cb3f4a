"""Evaluate a search policy on a QA set: greedy rollouts through the training engine, scored per source.

What ``rllib-search eval`` runs (``algos/evaluation/cli.py`` is its command line):

1. **The policy** (:func:`load_policy`): an RLlib checkpoint of a Search algorithm (``algo.save_to_path``:
   only the RLModule is read, ``learner_group/learner/rl_module/default_policy``: its constructor arguments
   give the model config, RLlib's ``restore_from_path`` loads its weights; with LoRA they are the adapters
   over the base model the config names), a Hugging Face directory (``algo.export``), a hub name or a
   bundled alias. A checkpoint also carries the protocol and token budgets it was trained with
   (:func:`checkpoint_settings`), which are the defaults for evaluating it. Every file of a checkpoint is
   checked first (``algos/checkpoints/check.py``): a truncated or garbled one is named, not unpickled.
2. **Rollouts** (:func:`run_policy`): an :class:`~rllib_search.algos.rollouts.env_runner.LLMEnvRunner` built
   without an Algorithm (no Ray needed) rolls out batches of questions greedily with
   ``rollout_records(records, temperature=0.0)``: the same env, protocol, engine (``hf`` on CPU, ``vllm``
   on GPU) and retriever calls as training, one episode per question, under a progress bar.
3. **Scores** (:mod:`rllib_search.algos.evaluation.scores`): EM, F1 and cover-EM per ``data_source`` (and per
   hop count when every question has ``num_hops``), their unweighted average (Search-R1's "Avg.") and the
   pooled mean, with bootstrap intervals; written as ``eval.md``, ``eval.json`` and ``predictions.jsonl``.

Fidelity to Search-R1 (so its published checkpoints evaluate as they were trained): the ``search_r1``
protocol writes Search-R1's observation and invalid-action texts byte for byte (``env/protocols.py`` lists
what still differs); a Search-R1 test parquet is prompted with its own prompt column's template
(:func:`data_prompt_template`; Search-R1's code words the instruction slightly differently from the
paper's Table 1, which the protocol holds); and the defaults are Search-R1's evaluation settings (top-3
passages, 500 new tokens a turn, 500-token observations, ``max_turns=5`` here, which is Search-R1's
``max_turns=4``: four search rounds and a final answer turn).
"""

from __future__ import annotations

import json
import logging
import pickle
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rllib_search.algos.checkpoints.check import check_checkpoint
from rllib_search.algos.evaluation.scores import METRICS, Scores, per_question_metrics, score_predictions
from rllib_search.data.records import QARecord
from rllib_search.env.protocols import Protocol, get_protocol
from rllib_search.env.rewards import exact_match

logger = logging.getLogger(__name__)

#: Where an Algorithm checkpoint keeps the policy's RLModule (RLlib's layout).
MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"
#: The env settings a checkpoint's config may carry that shape an evaluation episode.
EPISODE_SETTINGS = (
    "protocol",
    "max_turns",
    "topk",
    "max_obs_tokens",
    "max_total_tokens",
    "use_chat_template",
)


@dataclass
class EvalSettings:
    """How episodes run. The defaults are Search-R1's evaluation (``max_turns`` counts model turns here:
    Search-R1's ``max_turns=4`` search rounds plus its final answer turn are 5)."""

    protocol: str = "search_r1"
    max_turns: int = 5
    topk: int = 3
    max_turn_tokens: int = 500
    max_obs_tokens: int = 500
    max_total_tokens: int = 4096
    use_chat_template: bool | None = None
    engine: str = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 32
    seed: int = 0

    def env_config(self) -> dict[str, Any]:
        return {
            "max_turns": self.max_turns,
            "topk": self.topk,
            "max_obs_tokens": self.max_obs_tokens,
            "max_total_tokens": self.max_total_tokens,
            "use_chat_template": self.use_chat_template,
        }


@dataclass
class Policy:
    """What to evaluate: ``model_config`` builds the LLMRLModule; ``module_dir`` (a checkpoint's RLModule)
    holds the weights to load over it; ``trained_settings`` are the checkpoint's episode settings."""

    name: str
    model_config: dict[str, Any]
    checkpoint: Path | None = None
    module_dir: Path | None = None
    iteration: int | None = None
    trained_settings: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "model": str(self.model_config.get("model")),
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "iteration": self.iteration,
            "trained_settings": self.trained_settings,
        }


# --- the policy ------------------------------------------------------------------------------------------
def load_policy(*, model: str | None = None, checkpoint: str | Path | None = None) -> Policy:
    """The policy from an RLlib ``checkpoint`` (``model`` then replaces the base model its config names,
    e.g. when that directory moved) or from ``model`` (hub name, Hugging Face directory or alias)."""
    if checkpoint is None:
        if model is None:
            raise ValueError(
                "evaluate --model (alias, hub name or Hugging Face directory) or --checkpoint DIR"
            )
        return Policy(name=str(model), model_config={"model": str(model)})
    root = check_checkpoint(Path(checkpoint).expanduser().resolve())  # every file, before any unpickling
    module_dir = find_module_dir(root)
    model_config = dict(_ctor_kwargs(module_dir).get("model_config") or {})
    if model is not None:
        model_config["model"] = str(model)
    if "model" not in model_config:
        raise ValueError(f"the RLModule in {module_dir} names no model in its model_config")
    return Policy(
        name=str(root),
        model_config=model_config,
        checkpoint=root,
        module_dir=module_dir,
        iteration=_training_iteration(root),
        trained_settings=checkpoint_settings(root),
    )


def find_module_dir(path: Path) -> Path:
    """The RLModule directory of a checkpoint: an Algorithm's (``save_to_path``), a Learner's, a
    MultiRLModule's or the module's own directory."""
    for candidate in (
        path / MODULE_SUBDIR,
        path / "learner" / "rl_module" / "default_policy",
        path / "rl_module" / "default_policy",
        path / "default_policy",
        path,
    ):
        if (candidate / "class_and_ctor_args.pkl").is_file() and any(candidate.glob("module_state.*")):
            return candidate
    raise FileNotFoundError(
        f"no RLModule checkpoint under {path} (expected {MODULE_SUBDIR}/ with module_state.pkl, as "
        "algo.save_to_path writes)"
    )


def _ctor_kwargs(directory: Path) -> dict[str, Any]:
    with open(directory / "class_and_ctor_args.pkl", "rb") as handle:
        info = pickle.load(handle)
    args, kwargs = info["ctor_args_and_kwargs"]
    return {"args": args, **kwargs}


def checkpoint_settings(root: Path) -> dict[str, Any]:
    """The episode settings (protocol, budgets, ``max_turn_tokens``) of the config an Algorithm checkpoint
    was trained with; empty when ``root`` is not an Algorithm checkpoint."""
    if not (root / "class_and_ctor_args.pkl").is_file():
        return {}
    try:
        args = _ctor_kwargs(root)
        config = args.get("config") or (args["args"][0] if args["args"] else None)
    except Exception as error:  # an unreadable config only costs the defaults
        logger.warning("could not read the training config of %s (%s): using the defaults", root, error)
        return {}
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        return {}
    env_config = dict(config.get("env_config") or {})
    settings = {key: env_config[key] for key in EPISODE_SETTINGS if env_config.get(key) is not None}
    if isinstance(settings.get("protocol"), Protocol):
        settings["protocol"] = settings["protocol"].name
    if config.get("max_turn_tokens") is not None:
        settings["max_turn_tokens"] = int(config["max_turn_tokens"])
    return settings


def _training_iteration(root: Path) -> int | None:
    state = root / "algorithm_state.pkl"
    if not state.is_file():
        return None
    try:
        with open(state, "rb") as handle:
            return int(pickle.load(handle).get("training_iteration"))
    except Exception:
        return None


# --- data --------------------------------------------------------------------------------------------------
def read_eval_records(paths: Sequence[str | Path]) -> list[QARecord]:
    """The questions of Search-R1 parquet and FlashRAG jsonl files, in file order."""
    from rllib_search.data.formats import read_qa_file

    records: list[QARecord] = []
    for path in paths:
        records.extend(read_qa_file(path))
    if not records:
        raise ValueError(f"no questions in {[str(p) for p in paths]}")
    return records


def limit_per_source(records: Sequence[QARecord], limit: int | None, seed: int = 0) -> list[QARecord]:
    """At most ``limit`` questions of each data source: a seeded sample (each source's own generator, so
    one source's sample does not depend on the others), kept in file order."""
    if limit is None:
        return list(records)
    if limit < 1:
        raise ValueError(f"limit per source must be at least 1, got {limit}")
    by_source: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        by_source.setdefault(record.data_source, []).append(index)
    keep: set[int] = set()
    for source, indices in by_source.items():
        if len(indices) <= limit:
            keep.update(indices)
            continue
        rng = np.random.default_rng([int(seed), zlib.crc32(source.encode("utf-8"))])
        keep.update(indices[int(i)] for i in rng.choice(len(indices), size=limit, replace=False))
    return [record for index, record in enumerate(records) if index in keep]


def data_prompt_template(paths: Sequence[str | Path], records: Sequence[QARecord]) -> str | None:
    """The instruction template of Search-R1 parquet files' own prompts, or None when they have none.

    Search-R1's files hold each prompt as one user message, ``<instruction> Question: <question>\\n``. The
    template is that message with the question replaced by ``{question}``; it is returned only when it
    rebuilds every row's message exactly from the row's question (``records`` are the files' rows in
    order). Files that are not parquet, or rows whose prompt holds only the question, give None.
    """
    import pyarrow.parquet as pq

    contents: list[str | None] = []
    for path in paths:
        path = Path(path)
        if path.suffix != ".parquet" or "prompt" not in pq.read_schema(path).names:
            return None
        for messages in pq.read_table(path, columns=["prompt"]).column("prompt").to_pylist():
            users = [m.get("content") for m in messages or [] if m.get("role") == "user"]
            contents.append(users[-1] if len(messages or []) == 1 and users else None)
    if len(contents) != len(records) or not contents or contents[0] is None:
        return None
    head, marker, tail = contents[0].rpartition("Question: ")
    question = tail.strip()
    if not marker or not question:
        return None
    at = tail.index(question)
    lead, trail = tail[:at], tail[at + len(question) :]
    template = _escape(head) + marker + _escape(lead) + "{question}" + _escape(trail)
    for content, record in zip(contents, records):
        if content is None or template.format(question=record.question.strip()) != content:
            return None
    return template


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def eval_protocol(name: str, template: str | None) -> Protocol:
    """The protocol ``name``, prompting with ``template`` instead of its own instruction when given."""
    protocol = get_protocol(name)
    if template is None or template == protocol.instruction:
        return protocol
    if "{question}" not in protocol.instruction:
        raise ValueError(f"protocol {name!r} sends the question apart from its instruction: no data template")
    return replace(protocol, name=f"{protocol.name}@data_prompt", instruction=template)


# --- rollouts ----------------------------------------------------------------------------------------------
def build_runner(
    policy: Policy, retriever: Any, records: Sequence[QARecord], settings: EvalSettings, protocol: Protocol
) -> Any:
    """An LLMEnvRunner for greedy evaluation (no Algorithm, no Ray), with the policy's weights loaded."""
    from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

    from rllib_search.algos.config import SearchConfig
    from rllib_search.algos.rollouts.env_runner import LLMEnvRunner
    from rllib_search.env.search_env import ENV_ID

    model_config = dict(policy.model_config)
    env_config = {
        "retriever": retriever,
        "dataset": list(records),
        "protocol": protocol,
        **settings.env_config(),
    }
    config = (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config=model_config)
        .rollouts(
            group_size=1,
            prompts_per_sample=max(1, settings.batch_size),
            engine=settings.engine,
            engine_options=dict(settings.engine_options),
            temperature=0.0,
            max_turn_tokens=settings.max_turn_tokens,
        )
        .debugging(seed=settings.seed)
    )
    runner = LLMEnvRunner(config=config)
    if policy.module_dir is None:
        return runner
    if runner.module is not None:
        runner.module.restore_from_path(policy.module_dir)  # RLlib's own reader (pickle or msgpack)
        weights = runner.module.get_state()  # the HF engine shares the tensors and drops its caches
    else:
        # vLLM holds the only copy on the GPU: the checkpoint's module is read on the CPU, merged and sent.
        from rllib_search.llm.models import engine_weights

        spec = config.get_default_rl_module_spec()
        spec.model_config = {**model_config, "device": "cpu"}
        spec.observation_space, spec.action_space = runner.get_spaces()[DEFAULT_MODULE_ID]
        module = spec.build()
        module.restore_from_path(policy.module_dir)
        weights = engine_weights(module.model, dict(settings.engine_options).get("dtype", "bfloat16"))
        del module
    runner.set_state({COMPONENT_RL_MODULE: weights, "weights_version": policy.iteration or 0})
    return runner


def run_policy(runner: Any, records: Sequence[QARecord], batch_size: int, progress: bool = True) -> list[Any]:
    """One greedy episode per record, ``batch_size`` questions per ``rollout_records`` call (the engine
    generates a turn of the whole batch at once), under a tqdm progress bar (stderr) with the running EM."""
    from tqdm import tqdm

    rollouts: list[Any] = []
    correct = 0.0
    with tqdm(total=len(records), desc="eval", unit="q", disable=not progress, dynamic_ncols=True) as bar:
        for start in range(0, len(records), max(1, batch_size)):
            batch = list(records[start : start + max(1, batch_size)])
            done = runner.rollout_records(batch, temperature=0.0)
            rollouts.extend(done)
            correct += sum(exact_match(r.answer, r.golden_answers) for r in done)
            bar.update(len(batch))
            bar.set_postfix(em=f"{correct / len(rollouts):.3f}")
    return rollouts


def group_keys(records: Sequence[QARecord], field_name: str) -> list[str] | None:
    """Each record's key for grouping by ``field_name`` (``data_source`` or an ``extra`` entry such as
    ``num_hops``); None when some record lacks it."""
    if field_name == "data_source":
        return [record.data_source for record in records]
    values = [record.extra.get(field_name) for record in records]
    return None if any(value is None for value in values) else [str(value) for value in values]


def prediction_rows(
    rollouts: Sequence[Any], records: Sequence[QARecord], tokenizer: Any
) -> list[dict[str, Any]]:
    """One JSON-able row per question: the prediction, its metrics and how the episode went."""
    values = per_question_metrics([r.answer for r in rollouts], [r.golden_answers for r in rollouts])
    rows = []
    for i, (rollout, record) in enumerate(zip(rollouts, records)):
        response = tokenizer.decode(
            rollout.token_ids[rollout.prompt_length :].tolist(), skip_special_tokens=False
        )
        rows.append(
            {
                "uid": record.uid,
                "data_source": record.data_source,
                "num_hops": record.extra.get("num_hops"),
                "question": record.question,
                "golden_answers": list(record.golden_answers),
                "prediction": rollout.answer,
                **{metric: float(values[metric][i]) for metric in METRICS},
                "searches": int(rollout.stats.get("searches", 0)),
                "turns": int(rollout.stats.get("turns", 0)),
                "invalid_actions": int(rollout.stats.get("invalid_actions", 0)),
                "retriever_errors": int(rollout.stats.get("retriever_errors", 0)),
                "terminated": bool(rollout.terminated),
                "truncated": bool(rollout.truncated),
                "generated_tokens": rollout.num_generated_tokens,
                "response": response,
            }
        )
    return rows


# --- the whole evaluation ----------------------------------------------------------------------------------
@dataclass
class EvalResult:
    """Scores by grouping (``data_source`` first), the per-question rows, and what was evaluated how."""

    scores: dict[str, Scores]
    predictions: list[dict[str, Any]]
    info: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        by_source = self.scores["data_source"].to_dict()
        return {
            **self.info,
            "questions": len(self.predictions),
            "metrics": by_source["metrics"],
            "sources": by_source["groups"],
            "average": by_source["average"],
            "pooled": by_source["pooled"],
            "by": {name: scores.to_dict() for name, scores in self.scores.items()},
            "confidence": by_source["confidence"],
            "resamples": by_source["resamples"],
            "predictions": "predictions.jsonl",
        }

    def markdown(self) -> str:
        info = self.info
        lines = [
            "# rllib-search eval",
            "",
            f"- model: `{info['policy']['model']}`",
            f"- checkpoint: `{info['policy']['checkpoint']}`"
            + (
                f" (iteration {info['policy']['iteration']})"
                if info["policy"]["iteration"] is not None
                else ""
            ),
            f"- data: {', '.join(f'`{p}`' for p in info['data'])} ({len(self.predictions)} questions)",
            f"- retriever: `{info['retriever']}`; protocol `{info['settings']['protocol']}`, prompt "
            f"{info['prompt']}; greedy, engine `{info['settings']['engine']}`",
            "- budgets: "
            + ", ".join(
                f"{k} {info['settings'][k]}"
                for k in ("max_turns", "topk", "max_turn_tokens", "max_obs_tokens", "max_total_tokens")
            ),
            f"- {info['seconds']:.1f} s",
        ]
        names = {"data_source": "source", "num_hops": "hops"}
        for name, scores in self.scores.items():
            lines += ["", f"## by {name}", "", scores.markdown(names.get(name, name))]
        return "\n".join(lines) + "\n"


def evaluate(
    policy: Policy,
    records: Sequence[QARecord],
    retriever: Any,
    settings: EvalSettings,
    *,
    prompt_template: str | None = None,
    group_by: Sequence[str] | None = None,
    resamples: int = 1000,
    confidence: float = 0.95,
    progress: bool = True,
    info: dict[str, Any] | None = None,
) -> EvalResult:
    """Roll ``policy`` out greedily on ``records`` and score it per ``data_source`` and per each field of
    ``group_by`` (default: ``num_hops`` when every record has it)."""
    started = time.perf_counter()
    protocol = eval_protocol(settings.protocol, prompt_template)
    runner = build_runner(policy, retriever, records, settings, protocol)
    try:
        rollouts = run_policy(runner, records, settings.batch_size, progress=progress)
        rows = prediction_rows(rollouts, records, runner.tokenizer)
    finally:
        runner.stop()
    predictions = [row["prediction"] for row in rows]
    golds = [row["golden_answers"] for row in rows]
    scores = {}
    for name in dict.fromkeys(["data_source", *(group_by if group_by is not None else ["num_hops"])]):
        keys = group_keys(records, name)
        if keys is None and group_by is not None:
            raise ValueError(f"cannot group by {name!r}: some questions do not have it")
        if keys is not None:
            scores[name] = score_predictions(
                predictions, golds, keys, resamples=resamples, confidence=confidence, seed=settings.seed
            )
    full_info = {
        "policy": policy.describe(),
        "settings": asdict(settings),
        "prompt": "the data's own template" if protocol.name.endswith("@data_prompt") else "the protocol's",
        "instruction": protocol.instruction,
        **(info or {}),
        "seconds": time.perf_counter() - started,
    }
    return EvalResult(scores=scores, predictions=rows, info=full_info)


def write_result(result: EvalResult, out: str | Path) -> dict[str, Path]:
    """``eval.md``, ``eval.json`` and ``predictions.jsonl`` under ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "eval.md", "json": out / "eval.json", "predictions": out / "predictions.jsonl"}
    paths["markdown"].write_text(result.markdown(), encoding="utf-8")
    paths["json"].write_text(
        json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with open(paths["predictions"], "w", encoding="utf-8") as handle:
        for row in result.predictions:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return paths
