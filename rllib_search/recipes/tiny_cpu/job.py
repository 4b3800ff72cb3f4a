"""The CPU main job's stages: world, warm start, plan calibration, GRPO, evaluation and report.

``run(TinyCPUConfig())`` trains the bundled SmolLM2-135M-Instruct to chain searches on the synthetic
multi-hop world, on local Ray with the retriever on Ray Serve, and writes its results under ``config.out``
(``docs/main_job.md`` describes each stage and why it exists).
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rllib_search.llm.host_memory import collect_and_release, map_large_allocations
from rllib_search.recipes.process_memory import JobMemory
from rllib_search.recipes.tiny_cpu.config import TinyCPUConfig

HOPS = (1, 2)


class JobError(RuntimeError):
    """What stops the job with a message instead of a traceback: its inputs break an assumption."""


class Progress:
    """Lines of progress, each with the seconds since the job started."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def __call__(self, message: str) -> None:
        print(f"[{self.seconds():6.1f}s] {message}", flush=True)


@dataclass
class World:
    """The synthetic world's questions as the job splits them, and the services it talks to."""

    index: Any
    by_hops: dict[int, list]  # training questions by hop count
    held_out: dict[int, list]  # test questions evaluated after each stage
    demonstrated: list  # questions the warm start is shown
    fork_questions: dict[int, list]  # where the plan's branch probabilities are read; validation's pool
    undemonstrated: dict[int, list]  # RL's pool
    retriever_spec: Any = None
    started_retriever: bool = False
    env_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def golds(self) -> list[list[str]]:
        return [r.golden_answers for h in self.held_out for r in self.held_out[h]]

    @property
    def groups(self) -> list[str]:
        return [str(h) for h in self.held_out for _ in self.held_out[h]]


def describe_forks(forks: dict[int, dict[str, float]]) -> str:
    return (
        f"forks: P(',') 1-hop {forks[1]['goes_on']:.2f} 2-hop {forks[2]['goes_on']:.2f}, "
        f"P(' its') {forks[2]['its']:.2f}"
    )


def best_validation(validations: list[dict[str, Any]]) -> dict[str, Any]:
    """The validation whose weights RL keeps: the most right answers over both hop counts, the
    latest on a tie."""
    return max(validations, key=lambda validation: (validation["correct"], validation["iteration"]))


# --- 1. machine and world ------------------------------------------------------------------------------
def build_world(config: TinyCPUConfig, say: Progress) -> World:
    """The embedded world's questions, split: demonstrated, branch-reading, RL's pool and held out."""
    from rllib_search.recipes import embedded

    world = embedded.embedded_world(config.world_seed)
    train, test = world.records("train"), world.records("test")
    by_hops = {h: [r for r in train if r.extra["num_hops"] == h] for h in HOPS}
    held_out = {h: [r for r in test if r.extra["num_hops"] == h][: config.eval_questions] for h in HOPS}
    say(
        f"world: {len(train)} train / {len(test)} test questions "
        f"(1-hop {len(by_hops[1])}, 2-hop {len(by_hops[2])})"
    )
    demonstrated = by_hops[1][: config.demonstrations] + by_hops[2][: config.two_hop_demonstrations]
    fork_questions = {h: by_hops[h][-config.fork_questions :] for h in HOPS}
    seen = {r.uid for r in demonstrated} | {r.uid for h in HOPS for r in fork_questions[h]}
    undemonstrated = {h: [r for r in by_hops[h] if r.uid not in seen] for h in HOPS}
    env_settings = {
        "protocol": config.protocol,
        "max_turns": 3,  # enough for 2 hops and the answer
        "topk": config.topk,
        "max_obs_tokens": 100,
        "max_total_tokens": 1024,
    }
    return World(
        world.index,
        by_hops,
        held_out,
        demonstrated,
        fork_questions,
        undemonstrated,
        env_settings=env_settings,
    )


def describe_machine(config: TinyCPUConfig, precision_measured: bool, say: Progress) -> dict[str, Any]:
    """The CPU, the precision and why, and its product speed now (the run's seconds scale with it)."""
    from rllib_search.llm.models import (
        cpu_description,
        cpu_has_native_bf16,
        cpu_precision,
        cpu_times,
        describe_cpu,
        matmul_gflops,
    )

    machine = cpu_description()
    say(f"machine: {describe_cpu(machine)}")
    machine["_cpu_times"] = cpu_times()  # the hypervisor's share of the run, read again at the end
    if config.bf16 and not cpu_has_native_bf16():
        say(
            "--bf16 on a CPU without AVX512-BF16 or AMX: bf16 is emulated here, expect a slower run than fp32"
        )
    chosen_by = "--bf16 / --no-bf16"
    if precision_measured:
        precision = cpu_precision()
        chosen_by = precision.reason()
        machine["fp32_gflops"], machine["bf16_gflops"] = precision.fp32_gflops, precision.bf16_gflops
    machine["precision"] = "bf16" if config.bf16 else "fp32"
    if config.bf16:
        say(
            "precision: bf16, the engine's weights, the learners under autocast over fp32 weights "
            f"({chosen_by}; --no-bf16 for fp32)"
        )
    else:
        say(f"precision: fp32 ({chosen_by}; --bf16 for bf16)")
    dtype = "bfloat16" if config.bf16 else "float32"
    machine["matmul_gflops_start"] = round(matmul_gflops(dtype), 1)
    say(
        f"machine speed: {machine['matmul_gflops_start']:.0f} GFLOP/s in a {dtype} product "
        "(the run's seconds scale with it; measured again at the end)"
    )
    return machine


def start_services(config: TinyCPUConfig, world: World, say: Progress) -> None:
    """Local Ray (or the cluster the job was submitted to) and the BM25 retriever on Ray Serve."""
    from rllib_search.recipes import embedded
    from rllib_search.recipes.jobs import connect

    for line in connect(num_cpus=2, metrics_port=config.metrics_port):
        say(line)
    world.retriever_spec, world.started_retriever = embedded.serve_retriever(world.index)
    say("retriever: BM25 over the world's passages, served by Ray Serve")


def stop_services(world: World) -> None:
    """The retriever's Serve app, where the job started it."""
    from rllib_search.recipes import embedded

    if world.started_retriever:
        embedded.stop_apps([world.retriever_spec["app"]])


# --- evaluation -----------------------------------------------------------------------------------------
def base_config(config: TinyCPUConfig, world: World, cls: type, model: str, dataset: list) -> Any:
    """What every stage's RLlib config shares: env, model, rollout budgets, precision, seed, metrics."""
    from rllib_search.env.search_env import ENV_ID

    env_config = {"retriever": world.retriever_spec, "dataset": dataset, **world.env_settings}
    return (
        cls()
        .environment(ENV_ID, env_config=env_config)
        # each decoder layer's activations recomputed in backward: the same gradients, bit for bit, and a
        # fraction of the update's memory (shared-prompt batches too: see algos/model/shared_prompt.py)
        .rl_module(model_config={"model": model, "gradient_checkpointing": True})
        .rollouts(
            max_turn_tokens=config.max_turn_tokens,
            temperature=config.temperature,
            engine_dtype="bfloat16" if config.bf16 else None,
        )
        # the reference and AdamW's moments wait in a file outside scoring and the step: the same values
        .training(autocast=True if config.bf16 else None, disk_offload=True)
        .debugging(seed=config.seed)
        .dashboard_metrics(run_name="tiny_cpu_grpo")
    )


def greedy_episodes(algo: Any, questions: dict[int, list]) -> dict[int, list]:
    """Greedy episodes of ``questions`` (hop count -> records), all in one batch, by hop count."""
    records = [record for group in questions.values() for record in group]
    rollouts = iter(algo.evaluate_questions(records, temperature=0.0))
    return {hops: [next(rollouts) for _ in group] for hops, group in questions.items()}


def part(memory: JobMemory | None, name: str) -> AbstractContextManager[None]:
    """Memory sampled in the block counts under ``"<stage>: <name>"`` (nothing without ``memory``)."""
    return memory.within(name) if memory is not None else nullcontext()


class HeldOutEvaluation:
    """Greedy answers on the held-out questions after each stage, scored per hop count with intervals."""

    def __init__(
        self, config: TinyCPUConfig, world: World, say: Progress, memory: JobMemory | None = None
    ) -> None:
        from rllib_search.llm.models import cache_dir
        from rllib_search.recipes.tiny_cpu.answer_cache import EvaluationCache

        self.config, self.world, self.say, self.memory = config, world, say, memory
        self.cache = EvaluationCache(cache_dir() / "evaluations")
        self.table: list[dict[str, Any]] = []

    def answers(self, algo: Any) -> dict[str, Any]:
        answers, searches = {}, {}
        with part(self.memory, "evaluation"):
            episodes = greedy_episodes(algo, self.world.held_out)
        for hops, rollouts in episodes.items():
            answers[str(hops)] = [r.answer for r in rollouts]
            searches[str(hops)] = sum(r.stats["searches"] for r in rollouts) / len(rollouts)
        return {"answers": answers, "searches": searches}

    def base_model_key(self) -> str | None:
        """The cache key of the base model's evaluation (None: no cache, or not a local directory)."""
        from rllib_search.llm.models import resolve_model_path
        from rllib_search.serve.retrieval.manifest import index_identity

        model_dir = Path(resolve_model_path(self.config.model))
        if not self.config.eval_cache or not model_dir.is_dir():
            return None
        held_out = self.world.held_out
        settings = {
            "env": self.world.env_settings,
            "max_turn_tokens": self.config.max_turn_tokens,
            "questions": {str(h): [[r.uid, r.question] for r in held_out[h]] for h in held_out},
            "retriever": index_identity(self.world.index),
            "batch": "all hop counts",  # answers of another batch can differ in the last bits
            **({"engine_dtype": "bfloat16"} if self.config.bf16 else {}),
        }
        return self.cache.key(model_dir, settings)

    def __call__(self, algo: Any, stage: str, cache_key: str | None = None) -> dict[str, Any]:
        """Evaluate ``algo``'s policy, append the row to the table and return it."""
        from rllib_search.algos.evaluation.scores import score_predictions

        if cache_key is None:
            result, cached = self.answers(algo), False
        else:
            result, cached = self.cache.get_or_compute(cache_key, lambda: self.answers(algo))
        held_out = self.world.held_out
        row: dict[str, Any] = {"stage": stage, "answers": {}, "cached": cached}
        for hops in held_out:
            row["answers"][hops] = result["answers"][str(hops)]
            row[f"searches_{hops}hop"] = result["searches"][str(hops)]
        scores = score_predictions(flat(row), self.world.golds, self.world.groups, seed=self.config.seed)
        row["scores"] = scores.to_dict()
        for hops in held_out:
            row[f"em_{hops}hop"] = scores.groups[str(hops)]["em"].value
        self.say(
            f"eval {stage:>16}: EM 1-hop {scores.groups['1']['em'].format()}  "
            f"EM 2-hop {scores.groups['2']['em'].format()}  "
            f"searches {row['searches_1hop']:.2f} / {row['searches_2hop']:.2f}"
            + (f"  (answers read from {self.cache.path(cache_key)})" if cached else "")
        )
        self.table.append(row)
        return row


def flat(row: dict[str, Any]) -> list[str | None]:
    """An evaluation row's answers, hop count by hop count."""
    return [a for hops in row["answers"] for a in row["answers"][hops]]


# --- 2-4. warm start and plan calibration -----------------------------------------------------------------
@dataclass
class WarmStart:
    directory: Path
    calibration: list[dict[str, Any]] = field(default_factory=list)
    turns_over_budget: int = 0


def warm_start(
    config: TinyCPUConfig,
    world: World,
    evaluate: HeldOutEvaluation,
    say: Progress,
    memory: JobMemory | None = None,
) -> WarmStart:
    """Masked SFT on teacher trajectories, then plan calibration; evaluated before and after."""
    from rllib_search.algos import SearchSFTConfig
    from rllib_search.algos.rollouts.demonstrations import teacher_rollouts, turns_over_budget
    from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
    from rllib_search.llm.models import load_tokenizer
    from rllib_search.recipes.tiny_cpu.calibration import (
        ForkCalibration,
        calibrate_forks,
        calibration_demonstrations,
    )
    from rllib_search.recipes.tiny_cpu.plan_forks import ForkWindow, fork_contexts, mean_forks
    from rllib_search.serve.retrieval.client import build_retriever

    client = build_retriever({"timeout_s": 60, **world.retriever_spec})  # the app serving this world
    tokenizer = load_tokenizer(config.model)
    env_config = SearchEnvConfig.from_dict(world.env_settings)
    fork_env = MultiTurnSearchEnv(tokenizer, None, None, SearchEnvConfig(protocol=config.protocol))
    contexts = {h: fork_contexts(world.fork_questions[h], fork_env, tokenizer) for h in HOPS}
    if config.warm_start:
        say(f"warm start: {config.warm_start} (no SFT here)")
        return WarmStart(Path(config.warm_start))
    demos = teacher_rollouts(
        tokenizer,
        client,
        world.demonstrated,
        env_config,
        early_answer=config.early_answer,
        seed=config.seed,
        decision_weight=config.decision_weight,
        **config.teacher,
    )
    unanswered = sum(d.stats.get("retriever_errors", 0) for d in demos)
    if unanswered:
        raise JobError(
            f"{unanswered} of the teacher's searches got no passages from the retriever "
            f"({world.retriever_spec}): the warm start's demonstrations need the synthetic world's own "
            "index; see the retriever's Serve logs"
        )
    say(
        f"warm start data: {len(demos)} teacher trajectories ({config.demonstrations} 1-hop, "
        f"{config.two_hop_demonstrations} 2-hop)"
    )
    over = turns_over_budget(demos, config.max_turn_tokens)
    if over:
        say(
            f"warning: {len(over)} demonstrated turns are longer than the {config.max_turn_tokens}-token "
            f"turn budget (up to {max(over)} tokens): the agent cannot write them whole"
        )
    sft = (
        base_config(config, world, SearchSFTConfig, config.model, world.by_hops[1])
        .training(
            lr=config.sft_lr, micro_batch_size=config.micro_batch, total_training_steps=config.sft_steps
        )
        .sft(demonstrations=demos, sft_batch_size=config.sft_batch)
        .build_algo()
    )
    evaluate(sft, "before", cache_key=evaluate.base_model_key())
    for step in range(1, config.sft_steps + 1):
        with part(memory, "sft"):
            nll = sft.train()["learners"]["default_policy"]["sft_nll"]
        say(f"sft step {step:3d}/{config.sft_steps}  nll {nll:.4f}")

    def read_forks() -> dict[int, dict[str, float]]:
        return sft.on_policy_module(lambda module: mean_forks(module.model, tokenizer, contexts))

    calibration: list[dict[str, Any]] = []
    if config.calibrates:
        settings = ForkCalibration(
            its_target=config.calibration_its,
            lr=config.calibration_lr,
            max_steps=config.calibration_steps,
            min_steps=config.calibration_min_steps,
            turns=config.calibration_turns,
            questions_per_step=config.calibration_questions,
        )
        records = {h: [q for q in world.demonstrated if q.extra["num_hops"] == h] for h in HOPS}
        try:
            demonstrations = calibration_demonstrations(
                tokenizer,
                client,
                records,
                {h: fork_contexts(records[h], fork_env, tokenizer) for h in HOPS},
                env_config,
                settings,
                seed=config.seed,
            )
        except ValueError as error:  # a teacher turn that does not follow its plan: the world or teacher
            raise JobError(
                f"plan calibration: the teacher's turns do not follow its plans ({error})"
            ) from error
        say(
            f"fork calibration: {len(demonstrations)} first turns, P(' its') target "
            f"{settings.its_target}, after SFT's {describe_forks(read_forks())}"
        )

        def report(step: int, nll: float, forks: dict[int, dict[str, float]], inside: bool) -> None:
            stops = inside and step >= settings.min_steps
            end = "  in the window: calibration stops" if stops else "  in the window" if inside else ""
            if not stops and step == settings.max_steps:
                end = "  (never in the window from the fewest steps on)"
            say(f"calibration step {step}/{settings.max_steps}  nll {nll:.4f}  {describe_forks(forks)}{end}")

        with part(memory, "calibration"):
            calibration = calibrate_forks(sft, demonstrations, read_forks, settings, ForkWindow(), report)
    evaluate(sft, "after warm start")
    directory = sft.export(Path(config.out) / "warm_start_model")
    sft.stop()
    return WarmStart(directory, calibration, len(over))


# --- 5. GRPO -----------------------------------------------------------------------------------------------
@dataclass
class RLResult:
    history: list[dict[str, Any]]
    validation: dict[str, Any]
    questions: dict[str, Any]
    checkpoint: str | None


def train_rl(
    config: TinyCPUConfig,
    world: World,
    warm: WarmStart,
    evaluate: HeldOutEvaluation,
    say: Progress,
    memory: JobMemory | None = None,
) -> RLResult:
    """GRPO from the warm start, crediting each episode's first turn, with validations that keep the
    best weights and a WiSE-FT check; evaluated after."""
    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.algos.evaluation.scores import per_question_metrics
    from rllib_search.recipes.tiny_cpu.guidance import TeacherGuidance
    from rllib_search.recipes.tiny_cpu.placebo import PlaceboRewards
    from rllib_search.recipes.tiny_cpu.weight_interpolation import WeightStore, interpolate_weights

    questions = world.undemonstrated[2][: config.rl_two_hop] + world.undemonstrated[1][: config.rl_one_hop]
    guidance = None
    if config.rl_guidance:  # the warm start's teacher, never answering early
        guidance = TeacherGuidance(
            turns=config.rl_trained_turns, teacher={**config.teacher, "seed": config.seed}
        )
    group_hook = PlaceboRewards(config.seed, guidance) if config.placebo_rewards else guidance
    grpo = (
        base_config(config, world, SearchGRPOConfig, str(warm.directory), questions)
        .rollouts(
            group_size=config.group_size,
            prompts_per_sample=config.prompts,
            balance_by="num_hops",  # each iteration draws its questions round-robin over hop counts
            execution_temperature=config.execution_temperature,
            group_hook=group_hook,
        )
        .training(
            lr=config.rl_lr,
            kl_coeff=config.kl_coeff,
            micro_batch_size=config.rl_micro_batch,
            minibatch_size=config.minibatch,
            trained_turns=config.rl_trained_turns,
        )
        .build_algo()
    )
    if config.warm_start:
        evaluate(grpo, "after warm start")
    checked = {h: world.fork_questions[h][: config.validation_questions] for h in HOPS}

    def validate(iteration: int) -> dict[str, Any]:
        """Greedy answers on the validation questions: right answers per hop count, and which."""
        result: dict[str, Any] = {"iteration": iteration, "correct": 0}
        with part(memory, "validation"):
            episodes = greedy_episodes(grpo, checked)
        for hops, rollouts in episodes.items():
            em = per_question_metrics(
                [r.answer for r in rollouts], [r.golden_answers for r in checked[hops]], ("em",)
            )["em"]
            result[f"em_{hops}hop"] = float(em.mean())
            result[f"right_{hops}hop"] = [int(x) for x in em]
            result["correct"] += int(em.sum())
        return result

    validations: list[dict[str, Any]] = []
    # Snapshots on disk: the warm start's, the best validation's while later iterations change the weights.
    snapshots = WeightStore(Path(config.out) / ".weights")
    if config.rl_interpolate:
        snapshots.save("warm_start", grpo.policy_weights())
    history = []
    for iteration in range(1, config.rl_iterations + 1):
        result = grpo.train()
        runners, learner = result["env_runners"], result["learners"]
        row = {
            "iteration": iteration,
            "reward": runners["episode_return_mean"],
            "exact_match": runners["reward"]["em"],
            "searches": runners["searches_per_episode"],
            "generation_tokens_per_s": runners["generation_tokens_per_s"],
            "trained_tokens_per_s": learner["trained_tokens_per_s"],
            "kl": learner["default_policy"].get("kl", 0.0),  # absent when kl_coeff is 0
        }
        if guidance is not None:
            row["guided_groups"] = int(runners["guided_groups"])
            row["guided_solved"] = int(runners["guided_solved"])
        if config.placebo_rewards:
            row["placebo_moved_rewards"] = int(runners["placebo_moved_rewards"])
        history.append(row)
        say(
            f"grpo iter {iteration:2d}/{config.rl_iterations}  reward {row['reward']:.3f}  "
            f"EM {row['exact_match']:.3f}  searches {row['searches']:.2f}  "
            f"gen {row['generation_tokens_per_s']:.0f} tok/s  train {row['trained_tokens_per_s']:.0f} tok/s  "
            f"kl {row['kl']:.4f}"
            + (f"  guided groups {row['guided_groups']} ({row['guided_solved']} right)" if guidance else "")
        )
        if iteration in config.validation_iterations:
            validation = validate(iteration)
            row["validation"] = validation
            validations.append(validation)
            best = best_validation(validations) is validation
            if best and iteration != config.rl_iterations:
                snapshots.save("kept", grpo.policy_weights())
            say(
                f"validation after iteration {iteration}: EM 1-hop {validation['em_1hop']:.3f}  "
                f"EM 2-hop {validation['em_2hop']:.3f}  ({validation['correct']} of "
                f"{sum(map(len, checked.values()))} right{', the best so far' if best else ''})"
            )
    kept_iteration = history[-1]["iteration"] if history else 0
    if validations:
        kept_iteration = best_validation(validations)["iteration"]
        if kept_iteration != history[-1]["iteration"]:
            grpo.load_policy_weights(snapshots.load("kept"))
        say(f"RL keeps iteration {kept_iteration}'s weights (the validation with the most right answers)")
    kept_alpha, mixes = 1.0, []
    if config.rl_interpolate and validations:
        best = snapshots.save("end", grpo.policy_weights())
        mixes.append({"alpha": 1.0, **best_validation(validations)})
        fractions = sorted(set(config.rl_interpolate), reverse=True)  # from RL's end towards the warm start
        for alpha in fractions:
            mixed = interpolate_weights(
                snapshots.load("warm_start"), snapshots.load("end"), alpha, in_place=True
            )
            grpo.load_policy_weights(mixed)
            validation = {"alpha": alpha, **validate(kept_iteration)}
            if validation["correct"] > max(mix["correct"] for mix in mixes):  # a tie keeps the one nearer RL
                kept_alpha, best = alpha, snapshots.save(f"mix_{alpha:g}", mixed)
            del mixed
            mixes.append(validation)
            say(
                f"validation at {alpha:g} x RL + {1 - alpha:g} x warm start: EM 1-hop "
                f"{validation['em_1hop']:.3f}  EM 2-hop {validation['em_2hop']:.3f}  "
                f"({validation['correct']} right)"
            )
        if kept_alpha != fractions[-1]:  # the weights last read are not the ones kept
            grpo.load_policy_weights(snapshots.load(best))
        say(f"RL keeps the weights at {kept_alpha:g} x RL + {1 - kept_alpha:g} x warm start")
    snapshots.clear()
    evaluate(grpo, "after RL")
    with part(memory, "checkpoint"):
        checkpoint = grpo.save_to_path(str((Path(config.out) / "checkpoint").resolve()))
    grpo.stop()
    stop_services(world)
    return RLResult(
        history=history,
        validation={
            "questions_per_hop": {str(h): len(checked[h]) for h in checked} if validations else None,
            "validations": validations,
            "kept_iteration": kept_iteration,
            "interpolations": mixes,  # alpha 1 is the kept validation
            "kept_alpha": kept_alpha,
        },
        questions={
            "one_hop": len(world.undemonstrated[1][: config.rl_one_hop]),
            "two_hop": min(config.rl_two_hop, len(world.undemonstrated[2])),
            "prompts": config.prompts,
        },
        checkpoint=str(checkpoint),
    )


# --- 6. report ---------------------------------------------------------------------------------------------
def report(
    config: TinyCPUConfig,
    world: World,
    machine: dict[str, Any],
    warm: WarmStart,
    rl: RLResult | None,
    table: list[dict[str, Any]],
    say: Progress,
    memory: dict[str, Any],
) -> dict[str, Any]:
    """The table with RL's paired gain over the warm start; summary.json (with the job's peak memory),
    predictions.jsonl, training.png. ``rl`` None: the warm start alone (no gain, no GRPO history)."""
    from rllib_search.algos.evaluation.scores import Estimate, paired_gain
    from rllib_search.llm.models import cpu_times, matmul_gflops, steal_share

    out = Path(config.out)
    machine["matmul_gflops_end"] = round(matmul_gflops("bfloat16" if config.bf16 else "float32"), 1)
    machine["cpu_steal_share"] = steal_share(machine.pop("_cpu_times"), cpu_times())
    say(
        f"machine speed: {machine['matmul_gflops_end']:.0f} GFLOP/s at the end "
        f"({machine['matmul_gflops_start']:.0f} at the start)"
        + (
            f"; the hypervisor took {machine['cpu_steal_share']:.1%} of the CPUs' time during the run"
            if machine["cpu_steal_share"] is not None
            else ""
        )
    )
    if rl is None:
        rl = RLResult(history=[], validation={}, questions={}, checkpoint=None)
        gain, rl_gain = None, {f"{hops}hop": None for hops in world.held_out}
    else:
        gain = paired_gain(flat(table[-2]), flat(table[-1]), world.golds, world.groups, seed=config.seed)
        rl_gain = {f"{hops}hop": gain.groups[str(hops)]["em"] for hops in world.held_out}
    print("\nheld-out evaluation (greedy; EM [95% bootstrap interval])")
    print(f"{'stage':>18} | {'EM 1-hop':>21} | {'EM 2-hop':>21} | {'searches 1/2-hop':>16}")
    for row in table:
        ems = [Estimate(**row["scores"]["groups"][str(h)]["em"]).format() for h in world.held_out]
        print(
            f"{row['stage']:>18} | {ems[0]:>21} | {ems[1]:>21} | "
            f"{row['searches_1hop']:7.2f} / {row['searches_2hop']:.2f}"
        )
    if gain is not None:
        print(f"{'RL gain (paired)':>18} | {rl_gain['1hop'].format():>21} | {rl_gain['2hop'].format():>21} |")
    hop_keys = [f"{h}hop" for h in world.held_out]
    summary = {
        "evaluation": [{k: v for k, v in row.items() if k != "answers"} for row in table],
        "held_out_questions_per_hop": {str(h): len(world.held_out[h]) for h in world.held_out},
        "em": {row["stage"]: {k: row[f"em_{k}"] for k in hop_keys} for row in table},
        "searches_per_episode": {row["stage"]: {k: row[f"searches_{k}"] for k in hop_keys} for row in table},
        "rl_gain_2hop": rl_gain["2hop"] and rl_gain["2hop"].value,
        "rl_gain_2hop_interval": rl_gain["2hop"] and [rl_gain["2hop"].low, rl_gain["2hop"].high],
        "rl_gain_1hop": rl_gain["1hop"] and rl_gain["1hop"].value,
        "rl_gain_1hop_interval": rl_gain["1hop"] and [rl_gain["1hop"].low, rl_gain["1hop"].high],
        "rl_gain": gain and gain.to_dict(),
        "rl_questions": rl.questions,
        "demonstrated_turns_over_budget": warm.turns_over_budget,
        "fork_calibration": warm.calibration,
        "grpo": rl.history,
        "rl_validation": rl.validation,
        "settings": {k: v for k, v in asdict(config).items() if k != "metrics_port"},
        "machine": machine,
        "memory": memory,
        "checkpoint": rl.checkpoint,
        "seconds": say.seconds(),
    }
    with open(out / "predictions.jsonl", "w") as handle:
        for row in table:
            for hops in world.held_out:
                for record, answer in zip(world.held_out[hops], row["answers"][hops]):
                    line = {"stage": row["stage"], "hops": hops, "uid": record.uid, "answer": answer}
                    handle.write(json.dumps({**line, "golds": record.golden_answers}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(table, rl.history, out / "training.png")
    saved = f"checkpoint {rl.checkpoint}; " if rl.checkpoint else f"warm start {warm.directory}; "
    say(f"{saved}wrote {out / 'summary.json'} and {out / 'training.png'}")
    return summary


def plot(table: list[dict[str, Any]], history: list[dict[str, Any]], path: Path) -> None:
    """GRPO reward per iteration beside held-out EM per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    iterations = [h["iteration"] for h in history]
    left.plot(iterations, [h["reward"] for h in history], marker="o", label="reward")
    left.plot(iterations, [h["searches"] / 2 for h in history], marker="s", label="searches / 2")
    left.set_xlabel("GRPO iteration")
    left.set_title("GRPO")
    left.legend()
    stages = [row["stage"] for row in table]
    x = range(len(stages))
    for offset, hops in ((-0.2, "1"), (0.2, "2")):
        estimates = [row["scores"]["groups"][hops]["em"] for row in table]
        values = [e["value"] for e in estimates]
        errors = [
            [v - e["low"] for v, e in zip(values, estimates)],
            [e["high"] - v for v, e in zip(values, estimates)],
        ]
        right.bar([i + offset for i in x], values, width=0.4, yerr=errors, capsize=3, label=f"{hops}-hop")
    right.set_xticks(list(x), stages)
    right.set_ylim(0, 1)
    right.set_title("held-out exact match (95% interval)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(config: TinyCPUConfig, precision_measured: bool = False) -> dict[str, Any]:
    """The whole job; returns what summary.json holds. ``precision_measured``: ``config.bf16`` was chosen
    by ``llm.models.cpu_precision`` (said, with its figures, in the output). Writes under ``config.out``
    made absolute (``recipes.jobs.output_directory``: outside a submitted job's working directory)."""
    import torch

    from rllib_search.recipes.jobs import output_directory

    # Buffers of 1 MiB and more (activations, caches, logits) get mappings of their own, returned at free:
    # freed into glibc's heap instead, they fragment it and the job's peak grows by GBs (host_memory.py).
    map_large_allocations()
    progress = Progress()
    config = replace(config, out=str(output_directory("tiny_cpu_grpo", config.out)))
    progress(f"output directory: {config.out}")
    torch.set_num_threads(config.threads)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    with JobMemory(interval_s=2.0) as memory:
        world = build_world(config, progress)
        machine = describe_machine(config, precision_measured, progress)
        memory.stage("services")
        start_services(config, world, progress)
        evaluate = HeldOutEvaluation(config, world, progress, memory)
        memory.stage("warm start")
        warm = warm_start(config, world, evaluate, progress, memory)
        # The SFT algorithm is garbage once warm_start returns, but its learner (weights, AdamW state) sits
        # in reference cycles: collected and handed back to the OS here, before RL builds its own.
        collect_and_release()
        rl = None
        if config.rl_iterations:
            memory.stage("rl")
            rl = train_rl(config, world, warm, evaluate, progress, memory)
        else:
            progress("no RL (--rl-iterations 0): the warm start alone")
            stop_services(world)
        memory.stage("report")
        peak = memory.summary()
        progress(describe_memory(peak))
        summary = report(config, world, machine, warm, rl, evaluate.table, progress, peak)
    progress(f"output directory: {config.out}")
    return summary


def describe_memory(peak: dict[str, Any]) -> str:
    """The job's peak memory in one line, with the three processes that held the most then."""
    largest = sorted(peak["peak_pss_mb_by_process"].items(), key=lambda item: -item[1])[:3]
    held = ", ".join(f"{label} {mb / 1024:.2f}" for label, mb in largest)
    gibibytes = peak["peak_pss_mb"] / 1024  # the figures are MiB
    line = f"memory: peak {gibibytes:.2f} GiB PSS over the job's processes, in {peak['peak_stage']} ({held})"
    by_stage = peak.get("driver_peak_rss_mb_by_stage") or {}
    if by_stage:
        stage = max(by_stage, key=by_stage.get)
        line += f"; the driver's exact peak {by_stage[stage] / 1024:.2f} GiB RSS, in {stage}"
    return line
