"""Plan calibration: a short last phase of SFT that sets the plan's two branch points to chosen rates.

The teacher decides how many hops to make at two tokens of its first thought (``plan_forks.py``): "," against
"." after the first query, and " its" against " answer" after ", then". RL can lift a second search on 2-hop
questions without reaching 1-hop ones when a warm start says "," rarely on 1-hop and mostly on 2-hop
questions, and " its" sometimes but not greedily (``ForkWindow``). Plain SFT on the hesitant teacher's
trajectories lands anywhere near that window: every batch moves both forks, so the seed's last batches
decide.

Calibration trains on the teacher's first turns with the forks' targets spelled out instead of sampled:

- a 1-hop question's first turn (plan, "." and the first search), its "." weighted ``emphasis``;
- a 2-hop question's two first turns, one whose plan goes on with " its" and one that hesitates with
  " answer"; their "," weighted ``emphasis / 2`` each and the second fork ``emphasis * its_target`` and
  ``emphasis * (1 - its_target)``. Under per-sequence loss aggregation (the SFT default) the pair's fork
  terms sum to ``emphasis`` times the NLL of "," plus the cross-entropy against P(" its") = ``its_target``:
  the expected gradient of a teacher that goes on with that chance, without the draw. The other tokens of
  the turn keep weight 1, so what follows either branch stays as demonstrated.

A question's three turns stay in one batch, in order, so no batch tilts the second fork one way. Steps run
without Adam's first moment (``retune_optimizer(momentum=False)``): a soft target pulls P(" its") back from
either side, and without momentum the steps settle near it rather than swing past. Calibration stops at the
first step (from ``min_steps`` on) whose forks, read on questions it never trains on, lie in the window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rllib_search.algos.learners.batching import first_generated, keep_first_turns
from rllib_search.algos.rollouts.demonstrations import teacher_rollouts
from rllib_search.algos.rollouts.record import Rollout
from rllib_search.data.records import QARecord
from rllib_search.env.search_env import SearchEnvConfig
from rllib_search.recipes.tiny_cpu.plan_forks import FORKS, ForkContext, ForkWindow

# After the second turn's restated plan: search again (" Next I need ...") or close the thought and answer.
FOLLOW = {"search": " Next", "answer": " </think>"}


@dataclass(frozen=True)
class ForkCalibration:
    """How the calibration phase runs: the target P(" its"), the weight of the fork tokens against the
    mean of the rest of a turn, the base learning rate, questions per step (each gives one 1-hop and two
    2-hop first turns), the fewest steps (a warm start already in the window still has each question's
    P(" its") pulled toward the target) and the most."""

    its_target: float = 0.3
    emphasis: float = 1.0
    lr: float = 4e-5
    questions_per_step: int = 6
    max_steps: int = 8
    min_steps: int = 1
    turns: int = 1

    # ``turns`` 2 also keeps each demonstration's second turn: after the first search the teacher's thought
    # restates the plan's next clause, and the token after it (``FOLLOW``: " Next" and a second search where
    # the clause says ", then its ...", the thought closed and the answer where it says ", then answer" or
    # nothing) is weighted ``emphasis``, so the plan's next step is trained with the plan, not the plan alone.

    def __post_init__(self) -> None:
        if not 0.0 < self.its_target < 1.0:
            raise ValueError(f"its_target must lie in (0, 1), got {self.its_target}")
        if self.emphasis <= 0 or self.lr <= 0 or self.questions_per_step < 1 or self.max_steps < 1:
            raise ValueError(f"emphasis and lr must be positive, the counts at least 1: {self}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"min_steps must lie in 1..max_steps, got {self.min_steps}")
        if self.turns not in (1, 2):
            raise ValueError(f"turns must be 1 (the plan's turn) or 2 (and the turn after), got {self.turns}")


def fork_positions(rollout: Rollout, context: ForkContext) -> tuple[int, int | None]:
    """Where the first turn of ``rollout`` (a teacher trajectory of ``context``'s question) says its
    forks: the token after the first query ("," or "."), and after ", then" (" its" or " answer"; None when
    the plan ends at the first fork). Raises ValueError when the turn does not start with the plan."""
    start, end = rollout.turn_spans[0]
    ids = rollout.token_ids[start:end].tolist()
    plan, then = list(context.plan_ids), list(context.then_ids)
    if ids[: len(plan)] != plan:
        raise ValueError(f"the first turn does not start with the teacher's plan ({rollout.uid})")
    first = start + len(plan)
    goes_on = ids[len(plan) : len(plan) + len(then)] == then
    return first, (first + len(then) if goes_on else None)


def follow_position(rollout: Rollout, alternatives: dict[str, Sequence[int]]) -> tuple[int, str]:
    """Where the second turn of ``rollout`` decides whether to follow its restated plan with another search
    or to answer, and which it does: the earliest place the turn generated one of ``alternatives`` (kind ->
    token ids of ``FOLLOW``'s texts), past the ids they share (a tokenizer may start both with a space).
    Raises ValueError when the rollout has no second turn or the turn has none of them."""
    if len(rollout.turn_spans) < 2:
        raise ValueError(f"{rollout.uid} has no second turn")
    start, end = rollout.turn_spans[1]
    shared = 0
    for column in zip(*alternatives.values()):
        if len(set(column)) > 1:
            break
        shared += 1
    found = {
        kind: position
        for kind, marker in alternatives.items()
        if (position := first_generated(rollout, marker, start, end)) is not None
    }
    if found:
        kind = min(found, key=found.get)
        return found[kind] + shared, kind
    raise ValueError(f"{rollout.uid}: its second turn neither searches again nor closes its thought")


def calibration_demonstrations(
    tokenizer: Any,
    retriever: Any,
    records: dict[int, Sequence[QARecord]],
    contexts: dict[int, Sequence[ForkContext]],
    env_config: SearchEnvConfig,
    calibration: ForkCalibration,
    seed: int = 0,
) -> list[Rollout]:
    """The teacher's first turns for ``records`` (hop count -> questions, with their ``fork_contexts``),
    weighted as the module docstring says, in batch order: the k-th 1-hop question's turn, then the k-th
    2-hop question's turn that goes on, then its turn that hesitates (the lists are zipped; the shorter
    decides). The teacher plays whole episodes (the retriever answers its searches; a few seconds for the
    main job's 60 + 60 questions) and only their first ``calibration.turns`` turns are kept."""
    if not records.get(1) or not records.get(2):
        raise ValueError(
            "calibration_demonstrations needs 1-hop and 2-hop questions (records[1], records[2])"
        )
    teach = {
        "one_hop": (records[1], 0.0),
        "goes_on": (records[2], 0.0),  # no 2-hop demonstration answers early
        "answers_early": (records[2], 1.0),  # every one does
    }
    turns = {
        kind: [
            keep_first_turns(rollout, calibration.turns)
            for rollout in teacher_rollouts(
                tokenizer,
                retriever,
                list(questions),
                env_config,
                state_plan=True,
                early_answer=early,
                seed=seed,
                lazy_plan=True,
                echo_plan=True,
            )
        ]
        for kind, (questions, early) in teach.items()
    }
    ids = {
        text: tokenizer(text, add_special_tokens=False)["input_ids"][0]
        for pair in FORKS.values()
        for text in pair
    }
    follow = {kind: tokenizer(text, add_special_tokens=False)["input_ids"] for kind, text in FOLLOW.items()}
    emphasis, its = calibration.emphasis, calibration.its_target

    def followed(rollout: Rollout, forks: dict[int, float], then: str) -> Rollout:
        """``rollout`` weighted at ``forks`` and, with a second turn, at its follow token (``then``)."""
        if len(rollout.turn_spans) > 1:
            position, kind = follow_position(rollout, follow)
            if kind != then:
                raise ValueError(f"{rollout.uid}: its second turn does not {then} as its plan says")
            forks = {**forks, position: emphasis}
        return _weighted(rollout, forks)

    demonstrations = []
    for one, full, hesitant, one_context, two_context in zip(
        turns["one_hop"], turns["goes_on"], turns["answers_early"], contexts[1], contexts[2]
    ):
        first, _ = fork_positions(one, one_context)
        _expect(one, first, ids["."])
        demonstrations.append(followed(one, {first: emphasis}, "answer"))
        for rollout, token, target, then in (
            (full, " its", its, "search"),
            (hesitant, " answer", 1.0 - its, "answer"),
        ):
            first, second = fork_positions(rollout, two_context)
            if second is None:
                raise ValueError(f"a 2-hop plan that does not go on ({rollout.uid})")
            _expect(rollout, first, ids[","])
            _expect(rollout, second, ids[token])
            demonstrations.append(followed(rollout, {first: emphasis / 2, second: emphasis * target}, then))
    return demonstrations


def _expect(rollout: Rollout, position: int, token_id: int) -> None:
    if int(rollout.token_ids[position]) != token_id:
        raise ValueError(
            f"{rollout.uid}: token {position} is {int(rollout.token_ids[position])}, not {token_id}"
        )


def _weighted(rollout: Rollout, forks: dict[int, float]) -> Rollout:
    """``rollout`` with NLL weight 1 on its generated tokens and, at each fork position, the fork's weight
    times the number of generated tokens (the per-sequence mean then weighs the fork by its weight)."""
    weights = rollout.loss_mask.astype(np.float32)
    generated = float(weights.sum())
    for position, weight in forks.items():
        weights[position] = weight * generated
    return replace(rollout, nll_weights=weights)


def calibrate_forks(
    sft: Any,
    demonstrations: list[Rollout],
    read_forks: Callable[[], dict[int, dict[str, float]]],
    calibration: ForkCalibration,
    window: ForkWindow | None = None,
    on_step: Callable[[int, float, dict[int, dict[str, float]], bool], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the calibration phase on the SFT algorithm ``sft`` (``SearchSFT``): train on
    ``demonstrations`` (``calibration_demonstrations``) in order, ``3 * questions_per_step`` a step,
    without momentum at ``calibration.lr``, and after each step read the forks (``read_forks``: on
    questions it does not train on); stop at the first step from ``min_steps`` on inside ``window``, or
    after ``max_steps``.
    ``on_step(step, nll, forks, inside)`` reports each step. Returns each step's record."""
    window = window or ForkWindow()
    sft.set_demonstrations(demonstrations, batch_size=3 * calibration.questions_per_step, shuffle=False)
    sft.retune_optimizer(lr=calibration.lr, momentum=False)
    steps = []
    for step in range(1, calibration.max_steps + 1):
        nll = float(sft.train()["learners"]["default_policy"]["sft_nll"])
        forks = read_forks()
        inside = window.contains(forks)
        steps.append({"step": step, "nll": nll, "forks": forks, "in_window": inside})
        if on_step is not None:
            on_step(step, nll, forks, inside)
        if inside and step >= calibration.min_steps:
            break
    return steps
