"""What a policy's sampled plans go on to do: the funnel from the stated plan to a right answer.

``plan_forks.py`` reads a warm start's forks teacher-forced; GRPO learns from what its sampled episodes then
do. With the lazy echo teacher (``env/teacher.py``) an episode's first thought states the plan, and the
greedy turns after each search restate its next clause and act on it, so a sampled 2-hop episode reaches a
right answer through four stages, each counted here per hop count:

1. the plan goes on after the first query (", then its <relation>") rather than stopping (".") or
   hesitating (", then answer.");
2. a plan that goes on closes its second clause with ", then answer" (the teacher always does; a plan that
   ends "..., then its country." is answered after one search: the agent follows a plan's last clause with
   the answer, ``docs/main_job.md`` stop 55);
3. the episode searches twice;
4. the answer is right (exact match).

Given the questions' hop chains, it also counts the **readings**: each search that asked a hop's query in
the teacher's words (whose passage the embedded world's BM25 ranks first), and whether the next turn
names that hop's answer. On the fork-reading questions, seed 0's and seed 1's warm starts (stop 56) read
a first hop right 92-100% of the time and a second one 17 of 28 times: they answer with the bridge
entity's other relation (its alma mater for its birthplace), which the top-2 passages also show, and RL
that credits the first turn alone never trains that turn.

Questions whose samples are partly right are the GRPO groups with an advantage (a group of equal rewards
has none), so their count says how much a warm start leaves RL to learn from. The plan is read from the
first turn's text: decoding here only classifies, it never rebuilds a trajectory.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_search.algos.rollout import Rollout
from rllib_search.env.protocols import Protocol
from rllib_search.env.rewards import exact_match

PLAN_KINDS = ("stops", "hesitates", "goes_on_closed", "goes_on_open", "other")


def plan_kind(first_turn: str) -> str:
    """The kind of plan the first turn's thought states (``PLAN_KINDS``): "stops" (no clause after the first
    query), "hesitates" (", then answer" alone), "goes_on_closed" (", then its ..." and later ", then
    answer"), "goes_on_open" (", then its ..." never closed), "other" (a later clause of another form)."""
    plan = first_turn.split("</think>")[0]
    if ", then its" in plan:
        after = plan.split(", then its", 1)[1]
        return "goes_on_closed" if ", then answer" in after else "goes_on_open"
    if ", then answer" in plan:
        return "hesitates"
    return "other" if "then" in plan else "stops"


def hop_readings(
    turns: Sequence[str], chain: Sequence[Mapping[str, str]], protocol: Protocol
) -> list[tuple[int, bool]]:
    """For each turn that searched a hop's query in the teacher's words (``chain``: the question's hops,
    each with its ``query`` and ``answer``), the hop (1-based) and whether the next turn names its answer."""
    queries = {hop["query"].strip().lower(): i for i, hop in enumerate(chain)}
    readings = []
    for turn, after in itertools.pairwise(turns):
        action = protocol.parse_action(turn)
        hop = queries.get((action.query or "").lower()) if action.kind == "search" else None
        if hop is not None:
            readings.append((hop + 1, chain[hop]["answer"].lower() in after.lower()))
    return readings


def sampled_funnel(
    rollouts: Sequence[Rollout],
    tokenizer: Any,
    hops_by_uid: Mapping[str, int],
    chains_by_uid: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
    protocol: Protocol | None = None,
) -> dict[int, dict[str, Any]]:
    """Per hop count (``hops_by_uid``: each rollout's question -> its hop count): episodes, right answers,
    episodes that searched twice, questions and how many have partly right samples (``mixed_questions``),
    and per plan kind the episodes, those that searched twice and those answered right. With the
    questions' hop chains and the ``protocol`` also ``readings``: per hop, the searches that asked its
    teacher's query and how many of them the next turn read right (``hop_readings``)."""
    by_hops: dict[int, dict[str, Any]] = {}
    right_by_question: dict[str, list[bool]] = defaultdict(list)
    for rollout in rollouts:
        hops = int(hops_by_uid[rollout.uid])
        row = by_hops.setdefault(
            hops,
            {
                "episodes": 0,
                "right": 0,
                "searched_twice": 0,
                "plans": {kind: Counter() for kind in PLAN_KINDS},
            },
        )
        turns = [tokenizer.decode(rollout.token_ids[start:end].tolist()) for start, end in rollout.turn_spans]
        kind = plan_kind(turns[0])
        right = exact_match(rollout.answer, rollout.golden_answers) > 0
        twice = int(rollout.stats.get("searches", 0)) >= 2
        row["episodes"] += 1
        row["right"] += right
        row["searched_twice"] += twice
        row["plans"][kind].update({"episodes": 1, "searched_twice": int(twice), "right": int(right)})
        if chains_by_uid is not None and protocol is not None:
            readings = row.setdefault("readings", defaultdict(Counter))
            for hop, read in hop_readings(turns, chains_by_uid[rollout.uid], protocol):
                readings[hop].update({"asked": 1, "read": int(read)})
        right_by_question[rollout.uid].append(right)
    for hops, row in by_hops.items():
        questions = [uid for uid in right_by_question if hops_by_uid[uid] == hops]
        row["questions"] = len(questions)
        row["mixed_questions"] = sum(
            1 for uid in questions if 0 < sum(right_by_question[uid]) < len(right_by_question[uid])
        )
        row["plans"] = {
            kind: {key: int(counts[key]) for key in ("episodes", "searched_twice", "right")}
            for kind, counts in row["plans"].items()
        }
        if "readings" in row:
            row["readings"] = {
                str(hop): {"asked": int(c["asked"]), "read": int(c["read"])}
                for hop, c in sorted(row["readings"].items())
            }
    return by_hops


def describe_funnel(hops: int, row: Mapping[str, Any]) -> str:
    """One line of ``sampled_funnel``'s row for ``hops``: the plans by kind (searched twice, right), the
    episodes searching twice and right, and the questions with partly right samples."""
    plans = ", ".join(
        f"{kind} {p['episodes']} ({p['searched_twice']} twice, {p['right']} right)"
        for kind, p in row["plans"].items()
        if p["episodes"]
    )
    line = (
        f"{hops}-hop: {row['episodes']} episodes, right {row['right']}, searched twice "
        f"{row['searched_twice']}, partly right questions {row['mixed_questions']} of {row['questions']}; "
        f"plans: {plans}"
    )
    if row.get("readings"):
        read = ", ".join(f"hop {hop} {c['read']} of {c['asked']}" for hop, c in row["readings"].items())
        line += f"; the teacher's queries read right: {read}"
    return line
