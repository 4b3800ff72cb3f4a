"""Colocated placement: learner i and EnvRunner i on one GPU, in one placement-group bundle.

With ``rollouts(colocate=True)``, ``learners(num_learners=n, num_gpus_per_learner=g_l)`` and
``env_runners(num_env_runners=n, num_gpus_per_env_runner=g_r)`` (fractions, g_l + g_r <= 1), the
Algorithm reserves ONE placement group of n bundles, each ``{"GPU": g_l + g_r, "CPU": c_l + c_r}``
(``pair_bundle``), before RLlib creates any actor, and places:

- EnvRunner i (worker index i, 1..n) on bundle i - 1, through a
  ``PlacementGroupSchedulingStrategy`` (``PairedEnvRunnerGroup``: RLlib's own ``EnvRunnerGroup``, whose
  actor options get the strategy; nothing else about how RLlib creates, restarts or talks to its
  runners changes, and a runner Ray restarts comes back to its bundle);
- the learners in the same placement group (``LearnerGroup(placement_group=...)``, the argument RLlib
  passes Tune's group through). Ray Train creates them after RLlib has waited for every runner to be up,
  and gives them no bundle index, so each goes where its request fits: every bundle has exactly one
  learner's share left, and a learner asks for a GPU fraction, so no bundle can take two. Each GPU ends
  up with one learner and one runner (learner ranks follow Ray Train's order, not the bundles').

Why not fractional ``num_gpus`` alone: Ray packs fractional actors wherever they fit, so two runners (or two
learners) may share a GPU and leave another to a pair of learners; sleep and offload then free the wrong
GPU's memory. verl and OpenRLHF pair their colocated actors the same way (one placement-group bundle per
GPU, each actor given its bundle index). RLlib offers no hook for the runners' scheduling options: while
``SearchAlgorithm.setup`` runs RLlib's setup, the name ``EnvRunnerGroup`` in RLlib's algorithm module (the
one place RLlib builds its runner group) refers to the subclass (``paired_runner_groups``), and the
learner group gets the placement group through ``SearchConfig.build_learner_group``.

Under Tune the trial's placement group plays this part: ``SearchAlgorithm.default_resource_request`` asks
Tune for the driver's bundle followed by the n pair bundles, and RLlib already puts EnvRunner i on bundle
i of the trial's group and the learners into it; ``PairedEnvRunnerGroup`` then leaves RLlib's placement
alone.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import ray
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.util.placement_group import PlacementGroup, get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLACEMENT_TIMEOUT_S = 120.0
# The pairs' placement group while an Algorithm builds its actors (``SearchConfig.build_learner_group``).
_building_pairs: contextvars.ContextVar[PlacementGroup | None] = contextvars.ContextVar(
    "rllib_search_pairs", default=None
)


def building_pairs() -> PlacementGroup | None:
    """The placement group of the pairs whose actors are being built (None outside that)."""
    return _building_pairs.get()


def pairs_of(config: Any) -> int:
    """How many learner/EnvRunner pairs ``config`` colocates (0: no paired placement)."""
    runners, learners = int(config.num_env_runners or 0), int(config.num_learners or 0)
    if not config.colocate or runners == 0 or learners == 0:
        return 0
    return runners


def check_pairs(config: Any) -> None:
    """Refuse a colocated layout that cannot pair: unequal counts, or GPU shares that are not positive
    fractions adding up to at most one GPU."""
    runners, learners = int(config.num_env_runners or 0), int(config.num_learners or 0)
    if not config.colocate or runners == 0 or learners == 0:
        return
    g_r, g_l = float(config.num_gpus_per_env_runner or 0), float(config.num_gpus_per_learner or 0)
    if runners != learners:
        raise ValueError(
            "rollouts(colocate=True) pairs each learner with one EnvRunner on a GPU: "
            f"num_learners ({learners}) must equal num_env_runners ({runners})"
        )
    if not (g_r > 0 and g_l > 0 and g_r + g_l <= 1.0 + 1e-9):
        raise ValueError(
            "rollouts(colocate=True) shares each GPU between a learner and an EnvRunner: "
            f"num_gpus_per_learner ({g_l:g}) and num_gpus_per_env_runner ({g_r:g}) must be positive and add "
            "up to at most 1"
        )


def learner_cpus(config: Any) -> float:
    """CPUs per learner as RLlib's LearnerGroup asks for them (``"auto"``: 0 with a GPU, else 1)."""
    cpus = config.num_cpus_per_learner
    if cpus == "auto":
        return 0.0 if config.num_gpus_per_learner else 1.0
    return float(cpus)


def pair_bundle(config: Any) -> dict[str, float]:
    """One pair's bundle: a learner's and an EnvRunner's resources together."""
    bundle = {
        "CPU": float(config.num_cpus_per_env_runner) + learner_cpus(config),
        "GPU": float(config.num_gpus_per_env_runner) + float(config.num_gpus_per_learner),
    }
    for extra in (config.custom_resources_per_env_runner, config.custom_resources_per_learner):
        for name, amount in (extra or {}).items():
            bundle[name] = bundle.get(name, 0.0) + float(amount)
    return bundle


def reserve_pairs(config: Any) -> PlacementGroup:
    """The pairs' placement group (``PACK``: as few nodes as fit), waited for."""
    group = ray.util.placement_group([pair_bundle(config)] * pairs_of(config), strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise TimeoutError(
            f"the colocated pairs' placement group ({pairs_of(config)} x {pair_bundle(config)}) was not "
            f"placed within {PLACEMENT_TIMEOUT_S:g} s; the cluster has {ray.cluster_resources()}"
        )
    return group


class PairedEnvRunnerGroup(EnvRunnerGroup):
    """RLlib's EnvRunnerGroup that schedules remote EnvRunner i on bundle i - 1 of ``pairs`` (the
    training runners only; evaluation runners and runs inside a Tune trial keep RLlib's placement)."""

    pairs: PlacementGroup | None = None

    def _make_worker(self, *, worker_index: int, **kwargs: Any) -> Any:
        pairs = type(self).pairs
        config = self._remote_config
        if (
            worker_index > 0
            and pairs is not None
            and not config.in_evaluation
            and get_current_placement_group() is None
        ):
            strategy = PlacementGroupSchedulingStrategy(pairs, placement_group_bundle_index=worker_index - 1)
            self._remote_args = {**self._remote_args, "scheduling_strategy": strategy}
        return super()._make_worker(worker_index=worker_index, **kwargs)


@contextlib.contextmanager
def paired_runner_groups(pairs: PlacementGroup | None) -> Iterator[None]:
    """While open, RLlib's Algorithm builds its EnvRunnerGroups as :class:`PairedEnvRunnerGroup` over
    ``pairs`` (nothing changes when ``pairs`` is None)."""
    if pairs is None:
        yield
        return
    from ray.rllib.algorithms import algorithm as rllib_algorithm

    original = rllib_algorithm.EnvRunnerGroup
    paired = type("PairedEnvRunnerGroup", (PairedEnvRunnerGroup,), {"pairs": pairs})
    rllib_algorithm.EnvRunnerGroup = paired
    token = _building_pairs.set(pairs)
    try:
        yield
    finally:
        _building_pairs.reset(token)
        rllib_algorithm.EnvRunnerGroup = original


def placement_of_actor() -> dict[str, Any]:
    """Where the calling actor runs: its placement group, bundle index (from the resources Ray assigned
    it: a bundle's resources are named ``<name>_group_<index>_<group id>``) and GPU ids."""
    context = ray.get_runtime_context()
    group = context.get_placement_group_id()
    bundles = set()
    for name in context.get_assigned_resources():
        parts = name.split("_group_")
        if len(parts) == 2 and "_" in parts[1]:
            index, _, _ = parts[1].partition("_")
            if index.isdigit():
                bundles.add(int(index))
    return {"placement_group": group, "bundles": sorted(bundles), "gpu_ids": list(ray.get_gpu_ids())}
