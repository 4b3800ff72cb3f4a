"""The resource and memory plan of a GPU run, made before any actor starts.

:func:`make_plan` sets a config's GPU roles (``resources.py``: learners, vLLM EnvRunners or colocated pairs
of both, the Serve applications' replicas) against the cluster's GPUs, and each kind of GPU's memory
(``memory.py``: learner state, activations, logits, vLLM's budget and KV cache) against one GPU's memory.
``Plan.fits`` says whether it can be placed and fits; ``Plan.reasons`` says why not, with the numbers;
``str(plan)`` is the table ``rllib-search plan`` prints.

A colocated GPU (``rollouts(colocate=True)``) holds a learner and a vLLM engine at different times: its
peak is the larger of the rollout phase (the engine awake, the learner's state offloaded to CPU) and the
update phase (the learner training, the engine asleep). A transformers engine (``engine="hf"``) never
sleeps: its weights count in both phases. A retriever replica with GPUs holds its index, faiss's temporary
memory and the query encoder (read from the index's manifest when the plan can read it).

:func:`check_trials` is the same check for a Ray Tune experiment (``recipes/sweeps.fit_or_restore``), where
no ``build_algo`` runs: every trial the param space's grid makes is planned before the Tuner starts.

:func:`check_config` is what ``SearchConfig.build_algo`` calls for a GPU config (GPU learners or vLLM
rollouts): the plan against the running Ray cluster's free GPUs (Serve applications already deployed hold
theirs) and their memory (``resources.gpu_memory``), raising :class:`PlanError` when it does not fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllib_search.algos.plan.memory import (
    GIB,
    EngineMemory,
    EngineSetup,
    IndexSetup,
    LearnerSetup,
    Terms,
    engine_setup,
    engine_terms,
    hf_engine_setup,
    hf_engine_terms,
    host_terms,
    learner_offloaded_bytes,
    learner_setup,
    learner_terms,
    retriever_terms,
)
from rllib_search.algos.plan.resources import (
    COLOCATED,
    COLOCATED_HF_PAIR,
    COLOCATED_PAIR,
    Role,
    ServiceApp,
    asks_gpus,
    cluster_gpus,
    gpus_needed,
    read_services,
    training_roles,
)
from rllib_search.algos.plan.shapes import ModelShape, encoder_parameters, model_shape

#: How long ``check_config`` waits for GPUs the cluster has but holds (a run stopped just before frees its
#: placement group asynchronously) before it refuses.
FREE_GPUS_WAIT_S = 10.0

__all__ = ["ModelShape", "Plan", "PlanError", "check_config", "check_trials", "make_plan", "model_shape"]


class PlanError(ValueError):
    """A run that cannot be placed on the cluster or does not fit its GPUs' memory."""


@dataclass
class GpuMemory:
    """One kind of GPU of the plan and its peak, phase by phase (bytes)."""

    name: str
    phases: dict[str, float]
    detail: dict[str, str] = field(default_factory=dict)

    @property
    def peak(self) -> float:
        return max(self.phases.values())


@dataclass
class Plan:
    """A run's GPUs and per-GPU memory against a cluster's; see the module docstring."""

    title: str
    gpus: float
    gpu_memory_gib: float | None
    roles: list[Role]
    services: list[Role]
    learner: Terms | None = None
    learner_note: str = ""
    engine: EngineMemory | None = None
    hf_engine: Terms | None = None
    retrievers: list[tuple[ServiceApp, Terms]] = field(default_factory=list)
    judges: list[tuple[ServiceApp, EngineMemory]] = field(default_factory=list)
    gpu_kinds: list[GpuMemory] = field(default_factory=list)
    host: Terms | None = None
    host_memory_gib: float | None = None
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def gpus_needed(self) -> float:
        return gpus_needed(self.roles + self.services)

    def __str__(self) -> str:
        lines = [self.title]
        memory = f", {self.gpu_memory_gib:.1f} GiB each" if self.gpu_memory_gib else ", memory unknown"
        lines.append(f"GPUs: {self.gpus_needed:g} asked of {self.gpus:g}{memory}")
        lines.append(f"  {'role':44s} {'count':>5s} {'GPU each':>8s} {'GPUs':>6s}")
        for role in self.roles + self.services:
            name = f"{role.name} ({role.where})" if role.where else role.name
            lines.append(f"  {name:44s} {role.count:5d} {role.gpus_each:8g} {role.gpus:6g}")
        if self.learner is not None:
            lines.append(f"learner per GPU: {self.learner_note}")
            lines.extend(_term_lines(self.learner))
        if self.engine is not None:
            lines.append(f"vLLM EnvRunner engine:\n  {_engine_line(self.engine)}")
        if self.hf_engine is not None:
            lines.append("HF EnvRunner engine (never sleeps):")
            lines.extend(_term_lines(self.hf_engine))
        for app, index in self.retrievers:
            lines.append(f"{app.name} replica, index {app.index_dir}, first GPU:")
            lines.extend(_term_lines(index))
        for app, judge in self.judges:
            lines.append(f"{app.name} replica, {app.model} on vLLM:\n  {_engine_line(judge)}")
        if self.gpu_kinds:
            lines.append("peak per GPU:")
            for kind in self.gpu_kinds:
                phases = ", ".join(f"{phase} {value / GIB:.2f}" for phase, value in kind.phases.items())
                of = f" of {self.gpu_memory_gib:.1f}" if self.gpu_memory_gib else ""
                lines.append(f"  {kind.name:44s} {kind.peak / GIB:9.2f} GiB{of} ({phases})")
                lines.extend(f"    {phase}: {text}" for phase, text in kind.detail.items())
        if self.host is not None and self.host.items:
            of = f" of {self.host_memory_gib:.1f}" if self.host_memory_gib else ""
            lines.append(f"host memory, all nodes together: {self.host.total / GIB:.2f} GiB{of}")
            lines.extend(f"  {name:44s} {value / GIB:9.2f} GiB" for name, value in self.host.items.items())
        lines.extend(f"note: {note}" for note in self.notes)
        if self.fits:
            lines.append("fits: yes")
        else:
            lines.append("fits: NO")
            lines.extend(f"  - {reason}" for reason in self.reasons)
        return "\n".join(lines)


def _term_lines(terms: Terms) -> list[str]:
    lines = [f"  {name:44s} {value / GIB:9.2f} GiB" for name, value in terms.items.items()]
    return [*lines, f"  {'total':44s} {terms.total / GIB:9.2f} GiB"]


def _engine_line(engine: EngineMemory) -> str:
    return (
        f"budget {engine.budget / GIB:.2f} GiB: weights {engine.weights / GIB:.2f}, KV cache "
        f"{engine.kv_cache / GIB:.2f} ({engine.kv_tokens:,} tokens, {engine.sequences:.0f} x "
        f"{engine.max_model_len}); asleep {engine.asleep / GIB:.2f}"
    )


def describe_learner(setup: LearnerSetup) -> str:
    strategy = {
        "ddp": f"DDP over {setup.num_learners}" if setup.num_learners > 1 else "one learner",
        "fsdp2": f"FSDP2 over {setup.num_learners}",
    }[setup.strategy]
    checkpointing = "gradient checkpointing" if setup.gradient_checkpointing else "no gradient checkpointing"
    precision = "bf16 autocast" if setup.autocast else "fp32"
    return (
        f"{strategy}, micro-batch {setup.micro_batch_size} x {setup.sequence_tokens} tokens, "
        f"{checkpointing}, {precision}"
    )


def make_plan(
    config: Any,
    *,
    gpus: float,
    gpu_memory_gib: float | None,
    services: str | Path | list[ServiceApp] | None = None,
    host_memory_gib: float | None = None,
    name: str | None = None,
) -> Plan:
    """The plan of ``config`` (a SearchConfig) on a cluster of ``gpus`` GPUs of ``gpu_memory_gib`` each
    (None: memory unknown, only the GPU count is checked), beside ``services`` (a Serve config file or its
    apps: their replicas' GPUs at most; None: none). The host memory the run keeps is counted, and checked
    against ``host_memory_gib`` (the cluster's, all nodes together) when given. ``name`` heads the table."""
    apps = read_services(services) if isinstance(services, str | Path) else list(services or [])
    model = str(dict(config.model_config or {}).get("model", "smollm2-135m-instruct"))
    shape = model_shape(model)
    roles = training_roles(config)
    plan = Plan(
        title=f"plan: {name or type(config).__name__} on {model} ({shape.parameters() / 1e9:.2f}B params)",
        gpus=float(gpus),
        gpu_memory_gib=gpu_memory_gib,
        roles=roles,
        services=[app.role() for app in apps if app.gpus_per_replica > 0],
    )
    if plan.gpus_needed > plan.gpus + 1e-9:
        asked = ", ".join(role.describe() for role in plan.roles + plan.services)
        plan.reasons.append(
            f"the run asks {plan.gpus_needed:g} GPUs ({asked}) but the cluster has {plan.gpus:g}: Ray would "
            f"leave the rest pending; {_fewer_gpus_advice(config)}"
        )
    for role in roles:
        if role.gpus_each > 1 and role.gpus_each != int(role.gpus_each):
            plan.reasons.append(f"{role.name}: {role.gpus_each:g} GPUs each is neither a fraction nor whole")
    learner = learner_setup(config, shape) if float(config.num_gpus_per_learner or 0) > 0 else None
    if learner is not None:
        plan.learner, plan.learner_note = learner_terms(learner), describe_learner(learner)
    engine = engine_setup(config, shape) if config.engine == "vllm" else None
    if config.engine != "vllm" and float(config.num_gpus_per_env_runner or 0) > 0:
        plan.hf_engine = hf_engine_terms(hf_engine_setup(config, shape))
    colocated = any(role.name in COLOCATED for role in roles)
    plan.host = host_terms(learner, engine, int(config.num_env_runners or 0), colocated)
    plan.host_memory_gib = host_memory_gib
    if host_memory_gib and plan.host.total > host_memory_gib * GIB:
        held = ", ".join(f"{n} {v / GIB:.2f}" for n, v in plan.host.items.items())
        plan.reasons.append(
            f"host memory: the run keeps {plan.host.total / GIB:.2f} GiB ({held} GiB) but the cluster has "
            f"{host_memory_gib:.2f} GiB; use engine_options sleep_level 2 (no weights kept) or more host "
            "memory"
        )
    gpu_bytes = gpu_memory_gib * GIB if gpu_memory_gib else None
    if gpu_bytes is None:
        plan.notes.append("per-GPU memory unknown: only the GPU count was checked")
        return plan
    if engine is not None:
        plan.engine = engine_terms(engine, gpu_bytes)
        _check_engine("vLLM EnvRunner engine", engine, plan.engine, plan.reasons)
    _retrievers(apps, plan)
    _gpu_kinds(config, plan, gpu_bytes)
    for app in apps:
        if app.kind == "judge" and app.engine == "vllm" and app.model and app.gpus_per_replica:
            judge_engine = EngineSetup(
                shape=model_shape(app.model),
                gpu_memory_utilization=float(app.gpu_memory_utilization or 0.9),
                max_model_len=int(app.max_model_len or 4096),
            )
            judge = engine_terms(judge_engine, gpu_bytes * app.gpus_per_replica)
            plan.judges.append((app, judge))
            _check_engine(f"{app.name} ({app.model})", judge_engine, judge, plan.reasons)
    return plan


def _fewer_gpus_advice(config: Any) -> str:
    colocate = "" if config.colocate else ", colocate them (rollouts(colocate=True), 0.5 GPU each)"
    return f"use fewer learners or EnvRunners{colocate}, or fewer service replicas"


def _less_memory_advice(config: Any, phase: str) -> str:
    if phase == "rollout":
        return "lower engine_options gpu_memory_utilization, or use GPUs with more memory"
    if phase == "serve":
        return (
            "give each retriever replica more GPUs (ray_actor_options num_gpus: the index is sharded over "
            "them), build an IVF-PQ index, or use GPUs with more memory"
        )
    model = dict(config.model_config or {})
    advice = []
    if getattr(config, "sharding", None) != "fsdp2":
        advice.append("shard the learners (training(sharding='fsdp2'))")
    if not model.get("gradient_checkpointing"):
        advice.append("turn on gradient checkpointing (model_config gradient_checkpointing)")
    if int(config.micro_batch_size) > 1:
        advice.append("lower micro_batch_size")
    advice.append("use more learners to shard over" if getattr(config, "sharding", None) == "fsdp2" else "")
    advice.append("or use GPUs with more memory")
    return ", ".join(item for item in advice if item)


def _check_engine(what: str, setup: EngineSetup, engine: EngineMemory, reasons: list[str]) -> None:
    if engine.kv_tokens < setup.max_model_len:
        reasons.append(
            f"{what}: gpu_memory_utilization {setup.gpu_memory_utilization:g} gives "
            f"{engine.budget / GIB:.2f} GiB, which after its weights ({engine.weights / GIB:.2f} GiB) and "
            f"process overhead leaves KV cache for {engine.kv_tokens:,} tokens, less than one "
            f"{setup.max_model_len}-token sequence: raise engine_options gpu_memory_utilization or use GPUs "
            "with more memory"
        )


def _retrievers(apps: list[ServiceApp], plan: Plan) -> None:
    """Each GPU retriever application's first GPU: its index (from the manifest), faiss and the encoder."""
    from rllib_search.serve.retrieval.manifest import read_manifest

    for app in apps:
        if app.kind != "retriever" or not app.gpus_per_replica:
            continue
        try:
            manifest = read_manifest(Path(str(app.index_dir)))
        except (OSError, ValueError, TypeError) as error:
            plan.notes.append(f"{app.name}: its index's GPU memory is not counted ({error})")
            continue
        encoder = dict(manifest.get("encoder") or {}).get("name_or_path")
        index = IndexSetup(
            kind=str(manifest["kind"]),
            count=int(manifest["count"]),
            dim=int(manifest.get("dim") or 0),
            options=dict(manifest.get("options") or {}),
            gpus=max(1, int(app.gpus_per_replica)),
            encoder_parameters=encoder_parameters(str(encoder)) if encoder else None,
        )
        terms = retriever_terms(index)
        plan.retrievers.append((app, terms))
        plan.gpu_kinds.append(GpuMemory(f"{app.name} replica", {"serve": terms.total}))


def _gpu_kinds(config: Any, plan: Plan, gpu_bytes: float) -> None:
    """Each kind of GPU's peak by phase (training pairs, learners, EnvRunners, retriever replicas), checked
    against ``gpu_bytes``."""
    learner, engine, hf = plan.learner, plan.engine, plan.hf_engine
    offloaded = learner_offloaded_bytes(learner)
    if any(role.name == COLOCATED_HF_PAIR for role in plan.roles) and learner is not None and hf is not None:
        weights = hf.items["weights"] + hf.items["cuda context"]
        plan.gpu_kinds.append(
            GpuMemory(
                COLOCATED_HF_PAIR,
                {"rollout": hf.total + offloaded, "update": learner.total + weights},
                {
                    "rollout": f"engine {hf.total / GIB:.2f} + learner offloaded {offloaded / GIB:.2f}",
                    "update": f"learner {learner.total / GIB:.2f} + engine weights {weights / GIB:.2f}",
                },
            )
        )
    elif (
        any(role.name == COLOCATED_PAIR for role in plan.roles) and learner is not None and engine is not None
    ):
        kind = GpuMemory(
            COLOCATED_PAIR,
            {"rollout": engine.budget + offloaded, "update": learner.total + engine.asleep},
            {
                "rollout": f"engine awake {engine.budget / GIB:.2f} + learner offloaded "
                f"{offloaded / GIB:.2f}",
                "update": f"learner {learner.total / GIB:.2f} + engine asleep {engine.asleep / GIB:.2f}",
            },
        )
        plan.gpu_kinds.append(kind)
    else:
        if learner is not None:
            plan.gpu_kinds.append(GpuMemory("learner", {"update": learner.total}))
        if engine is not None:
            plan.gpu_kinds.append(GpuMemory("vLLM EnvRunner", {"rollout": engine.budget}))
        if hf is not None:
            plan.gpu_kinds.append(GpuMemory("HF EnvRunner", {"rollout": hf.total}))
    for kind in plan.gpu_kinds:
        if kind.peak > gpu_bytes:
            phase = max(kind.phases, key=kind.phases.get)
            top = ""
            if phase == "update" and learner is not None:
                biggest = sorted(learner.items.items(), key=lambda item: -item[1])[:4]
                top = " (learner: " + ", ".join(f"{n} {v / GIB:.2f}" for n, v in biggest) + " GiB)"
            plan.reasons.append(
                f"{kind.name} GPU, {phase}: {kind.peak / GIB:.2f} GiB needed > {gpu_bytes / GIB:.2f} GiB per "
                f"GPU{top}; {_less_memory_advice(config, phase)}"
            )


def check_config(config: Any) -> Plan | None:
    """Refuse (:class:`PlanError`) a GPU config that the running Ray cluster cannot place or whose GPUs it
    does not fit; None for a CPU config (nothing to plan). Called by ``SearchConfig.build_algo`` before any
    actor starts; starts a local Ray when none is running, as the Algorithm's first actor would."""
    if not asks_gpus(config):
        return None
    import ray

    if not ray.is_initialized():
        ray.init()
    cluster = cluster_gpus()
    needed = gpus_needed(training_roles(config))
    deadline = time.monotonic() + FREE_GPUS_WAIT_S
    while cluster.free_gpus < needed <= cluster.gpus and time.monotonic() < deadline:
        time.sleep(0.5)  # GPUs just released (a stopped run's placement group) reach Ray's count late
        cluster = cluster_gpus()
    plan = make_plan(config, gpus=cluster.free_gpus, gpu_memory_gib=cluster.gpu_memory_gib)
    if cluster.free_gpus < cluster.gpus:
        plan.notes.append(
            f"the cluster has {cluster.gpus:g} GPUs, {cluster.free_gpus:g} of them free (the rest held by "
            "others, e.g. Serve replicas)"
        )
    plan.notes.append(f"GPU memory: {cluster.memory_source}")
    if not plan.fits:
        raise PlanError("this run does not fit the Ray cluster:\n" + str(plan))
    return plan


#: The config keys that make a trial a GPU trial (``asks_gpus``).
GPU_KEYS = ("num_gpus_per_learner", "num_gpus_per_env_runner", "engine")


def check_trials(trainable: Any, param_space: Any) -> list[Plan]:
    """Refuse (:class:`PlanError`) a Tune experiment of ``trainable`` (an RLlib Algorithm class) over
    ``param_space`` (an AlgorithmConfig, maybe with ``tune.grid_search`` values) when one of its trials is a
    GPU config that the running Ray cluster cannot place or whose GPUs it does not fit; returns the GPU
    trials' plans (none for CPU sweeps). Each trial is planned on its own against the cluster's free GPUs:
    Tune runs as many at once as fit and queues the rest."""
    if not hasattr(param_space, "to_dict") or not hasattr(trainable, "get_default_config"):
        return []
    spec = param_space.to_dict()
    if not any(isinstance(spec.get(key), dict) for key in GPU_KEYS) and not asks_gpus(param_space):
        return []
    import ray
    from ray.tune.search.variant_generator import generate_variants

    if not ray.is_initialized():
        ray.init()
    cluster = cluster_gpus()
    plans = []
    for resolved, variant in generate_variants(spec):
        config = trainable.get_default_config().update_from_dict(variant)
        if not asks_gpus(config):
            continue
        label = ", ".join(f"{'/'.join(map(str, path))}={value}" for path, value in resolved.items())
        plan = make_plan(
            config, gpus=cluster.free_gpus, gpu_memory_gib=cluster.gpu_memory_gib, name=f"trial {label}"
        )
        plan.notes.append(f"GPU memory: {cluster.memory_source}")
        if not plan.fits:
            raise PlanError(f"a trial of this Tune experiment does not fit the Ray cluster:\n{plan}")
        plans.append(plan)
    return plans
