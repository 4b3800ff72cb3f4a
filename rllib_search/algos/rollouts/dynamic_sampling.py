"""Dynamic sampling (DAPO, Yu et al. 2025): train only on groups whose rewards differ.

A GRPO group whose episodes all earned the same reward has zero advantage: it adds nothing to the policy
gradient, only its KL term, and where successes are rare (a warm start that answers one 2-hop question in
twenty) most groups are such. With ``rollouts(dynamic_sampling_rounds=N)`` the Algorithm drops those
groups and samples again, up to N ``sample()`` rounds an iteration, until it holds as many informative
groups as one round draws; it then trains on those alone (or, when no round gave one, on the last round as
sampled). verl's DAPO recipe (``algorithm.filter_groups``, ``max_num_gen_batches``) does the same inside
its trainer; RLlib has no such step, hence this module.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllib_search.algos.rollouts.record import Rollout


def split_groups(rollouts: Sequence[Rollout]) -> list[list[Rollout]]:
    """The episodes grouped by ``group_id``, groups in the order of their first episode."""
    groups: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        groups.setdefault(rollout.group_id, []).append(rollout)
    return list(groups.values())


def informative_groups(rollouts: Sequence[Rollout]) -> list[list[Rollout]]:
    """The groups of at least two episodes whose rewards are not all equal (non-zero GRPO advantage)."""
    return [
        group
        for group in split_groups(rollouts)
        if len(group) > 1 and any(r.reward != group[0].reward for r in group[1:])
    ]
