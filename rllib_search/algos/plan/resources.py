"""GPUs per role, set against the cluster's: learners, vLLM EnvRunners (or colocated pairs of both), and
the Serve applications' replicas (retriever, judge) read from a Serve config file.

Ray accounts GPUs as numbers: a role asks ``count x gpus_each``, and fractional requests share a GPU.
Colocated pairs (``rollouts(colocate=True)`` with as many learners as EnvRunners) each ask the learner's and
the runner's fractions together, one GPU for 0.5 + 0.5. A Serve application asks its ``max_replicas``
times each replica's GPUs (``ray_actor_options.num_gpus``; for Ray Serve LLM, ``tensor_parallel_size x
pipeline_parallel_size`` of its ``engine_kwargs``), the most autoscaling can reach. The plan checks the
totals: on several nodes each bundle and replica also needs its GPUs free on one node.

The cluster (:func:`cluster_gpus`): its GPUs come from Ray (``ray.cluster_resources()`` and
``ray.available_resources()``); the memory of one GPU from, first match wins, the environment variable
``RLLIB_SEARCH_GPU_MEMORY_GIB``, Ray's ``accelerator_type:<type>`` resource looked up in
:data:`GPU_MEMORY_GIB`, or ``torch.cuda`` on the driver. With none of them the memory is unknown and only the
GPU count is checked.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_MEMORY_ENV = "RLLIB_SEARCH_GPU_MEMORY_GIB"
COLOCATED_PAIR = "learner + vLLM EnvRunner (colocated)"
COLOCATED_HF_PAIR = "learner + HF EnvRunner (colocated)"
COLOCATED = (COLOCATED_PAIR, COLOCATED_HF_PAIR)
#: Total memory of one GPU, in GiB, by Ray's accelerator type (the total ``nvidia-smi`` reports, in MiB).
GPU_MEMORY_GIB = {
    "H100": 81559 / 1024,
    "H200": 143771 / 1024,
    "A100-80G": 81920 / 1024,
    "A100-40G": 40960 / 1024,
    "L40S": 46068 / 1024,
    "A10G": 23028 / 1024,
    "L4": 23034 / 1024,
}


@dataclass(frozen=True)
class Role:
    """``count`` processes (or placement bundles) of ``gpus_each`` GPUs; ``where`` says what holds them."""

    name: str
    count: int
    gpus_each: float
    where: str = ""

    @property
    def gpus(self) -> float:
        return self.count * self.gpus_each

    def describe(self) -> str:
        each = f"{self.gpus_each:g} GPU" if self.gpus_each else "no GPU"
        return f"{self.count} {self.name} x {each}"


@dataclass(frozen=True)
class ServiceApp:
    """A Serve application of a Serve config: its replicas at most, their GPUs, and the model it serves on
    vLLM (a judge), if any, with vLLM's memory settings."""

    name: str
    kind: str  # retriever | judge | other
    max_replicas: int
    gpus_per_replica: float
    model: str | None = None
    engine: str | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    source: str = ""
    index_dir: str | None = None  # a retriever's index directory (its manifest sizes the index)

    def role(self) -> Role:
        return Role(f"{self.name} replica", self.max_replicas, self.gpus_per_replica, self.source)


def training_roles(config: Any) -> list[Role]:
    """The GPU roles a SearchConfig asks for: colocated pairs, or learners and EnvRunners apart; a local
    learner or EnvRunner that needs a GPU runs in the driver (counted: the driver's node needs one)."""
    learners = int(config.num_learners or 0)
    runners = int(config.num_env_runners or 0)
    per_learner = float(config.num_gpus_per_learner or 0)
    per_runner = float(config.num_gpus_per_env_runner or 0)
    vllm = config.engine == "vllm"
    roles = []
    if config.colocate and learners and learners == runners:
        roles.append(Role(COLOCATED_PAIR if vllm else COLOCATED_HF_PAIR, learners, per_learner + per_runner))
        return roles
    if learners:
        roles.append(Role("learner", learners, per_learner))
    elif per_learner > 0:
        roles.append(Role("local learner", 1, per_learner, "driver"))
    if runners:
        roles.append(Role("vLLM EnvRunner" if vllm else "EnvRunner", runners, per_runner))
    elif vllm:
        roles.append(Role("local vLLM EnvRunner", 1, 1.0, "driver"))
    return [role for role in roles if role.gpus_each > 0]


def asks_gpus(config: Any) -> bool:
    """Whether a config is a GPU config: GPU learners or EnvRunners, or vLLM rollouts."""
    gpus = float(config.num_gpus_per_learner or 0) + float(config.num_gpus_per_env_runner or 0)
    return gpus > 0 or config.engine == "vllm"


def read_services(path: str | Path) -> list[ServiceApp]:
    """The applications of a Serve config file (``serve deploy``'s YAML) with their GPUs at most."""
    import yaml

    path = Path(path)
    document = yaml.safe_load(path.read_text()) or {}
    apps = []
    for app in document.get("applications") or []:
        apps.extend(_service_apps(app, path.name))
    return apps


def _replicas(deployment: dict[str, Any]) -> int:
    autoscaling = deployment.get("autoscaling_config") or {}
    if autoscaling:
        return int(autoscaling.get("max_replicas", autoscaling.get("min_replicas", 1)))
    return int(deployment.get("num_replicas") or 1)


def _service_apps(app: dict[str, Any], source: str) -> list[ServiceApp]:
    name = str(app.get("name", "app"))
    import_path = str(app.get("import_path", ""))
    args = dict(app.get("args") or {})
    if import_path.startswith("ray.serve.llm"):  # Ray Serve LLM: one app may serve several models
        apps = []
        for llm in args.get("llm_configs") or []:
            engine = dict(llm.get("engine_kwargs") or {})
            parallel = int(engine.get("tensor_parallel_size", 1)) * int(
                engine.get("pipeline_parallel_size", 1)
            )
            apps.append(
                ServiceApp(
                    name=name,
                    kind="judge" if name == "judge" else "other",
                    max_replicas=_replicas(dict(llm.get("deployment_config") or {})),
                    gpus_per_replica=float(parallel),
                    model=str((llm.get("model_loading_config") or {}).get("model_source")),
                    engine="vllm",
                    gpu_memory_utilization=float(engine.get("gpu_memory_utilization", 0.9)),
                    max_model_len=engine.get("max_model_len"),
                    source=source,
                )
            )
        return apps
    options = dict(args.get("ray_actor_options") or app.get("ray_actor_options") or {})
    engine_options = dict(args.get("engine_options") or {})
    kind = "retriever" if "retrieval" in import_path else "judge" if "judge" in import_path else "other"
    return [
        ServiceApp(
            name=name,
            kind=kind,
            max_replicas=_replicas(args),
            gpus_per_replica=float(options.get("num_gpus", 0) or 0),
            model=args.get("model") if kind == "judge" else None,
            engine=args.get("engine") if kind == "judge" else None,
            gpu_memory_utilization=engine_options.get("gpu_memory_utilization"),
            max_model_len=engine_options.get("max_model_len"),
            source=source,
            index_dir=args.get("index_dir") if kind == "retriever" else None,
        )
    ]


@dataclass(frozen=True)
class Cluster:
    """The running Ray cluster's GPUs: in all, free now, and the memory of one (None: unknown)."""

    gpus: float
    free_gpus: float
    gpu_memory_gib: float | None
    memory_source: str


def cluster_gpus() -> Cluster:
    """The GPUs of the Ray cluster this process is connected to, and their memory (module docstring)."""
    import ray

    resources = ray.cluster_resources()
    free = ray.available_resources()
    memory, source = gpu_memory(resources)
    return Cluster(float(resources.get("GPU", 0)), float(free.get("GPU", 0)), memory, source)


def gpu_memory(resources: dict[str, float]) -> tuple[float | None, str]:
    """One GPU's memory in GiB and where it was read (see the module docstring)."""
    override = os.environ.get(GPU_MEMORY_ENV)
    if override:
        return float(override), GPU_MEMORY_ENV
    types = sorted(key.split(":", 1)[1] for key in resources if key.startswith("accelerator_type:"))
    known = [GPU_MEMORY_GIB[kind] for kind in types if kind in GPU_MEMORY_GIB]
    if known:
        return min(known), f"accelerator type {', '.join(types)}"
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / 1024**3, "torch.cuda on the driver"
    except (ImportError, RuntimeError):
        pass
    return None, f"unknown (set {GPU_MEMORY_ENV})"


def gpus_needed(roles: list[Role]) -> float:
    """GPUs the roles take in all, as Ray counts them (rounded to a millionth: fractions add up)."""
    return round(math.fsum(role.gpus for role in roles), 6)
