"""How well a policy reads each hop's answer from the observations, teacher-forced.

After each search the main job's teacher writes "The results say X" with X the hop's answer, which the
retrieved passages show (``env/teacher.py``). Fed the teacher's trajectory as token ids (its prompt, turns
and the real observations), a model's probability of X's tokens at that place says how well it reads the
hop, apart from whether it would have planned, searched or phrased the query that way: the stage that
``algos/sampled_plans.py`` can count only where sampled episodes happen to ask the teacher's query. With
two passages an observation, warm starts read the second hop of a 2-hop question worst (they name an entity
of the first observation; ``docs/main_job.md``, stops 56-57).

One forward pass per trajectory gives every hop's reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rllib_search.algos.demonstrations import reading_tokens
from rllib_search.algos.rollout import Rollout
from rllib_search.data.records import QARecord
from rllib_search.env.teacher import TeacherPolicy


def reading_probabilities(
    model: Any,
    tokenizer: Any,
    rollouts: Sequence[Rollout],
    records: Sequence[QARecord],
    teacher: TeacherPolicy,
) -> list[dict[str, Any]]:
    """For each teacher trajectory in ``rollouts`` (of ``records``, written by ``teacher``) and each turn
    after a search: ``{"hops", "turn", "probability", "greedy"}``, the model's probability of the hop's
    answer tokens where the turn reads them and whether its argmax is each of those tokens."""
    import torch

    device = next(model.parameters()).device
    rows = []
    for rollout, record in zip(rollouts, records, strict=True):
        positions = reading_tokens(rollout, record, teacher, tokenizer)
        if not positions:
            continue
        ids = torch.as_tensor(rollout.token_ids[None, : max(positions) + 1].astype(np.int64), device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        for turn, (start, end) in enumerate(rollout.turn_spans):
            inside = [p for p in positions if start <= p < end]
            if not inside:
                continue
            targets = [int(rollout.token_ids[p]) for p in inside]
            before = [p - 1 for p in inside]  # the logits at p - 1 predict token p
            rows.append(
                {
                    "hops": int(record.extra["num_hops"]),
                    "turn": turn,
                    "probability": float(np.exp(sum(float(logprobs[b, t]) for b, t in zip(before, targets)))),
                    "greedy": all(int(logits[b].argmax()) == t for b, t in zip(before, targets)),
                }
            )
    return rows


def summarize_readings(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per hop count and turn (key "<hops>-hop turn <turn>"): the readings' mean probability, how many the
    argmax reads right, and how many there are."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["hops"], row["turn"]), []).append(row)
    return {
        f"{hops}-hop turn {turn}": {
            "mean": float(np.mean([r["probability"] for r in group])),
            "greedy_right": sum(r["greedy"] for r in group),
            "count": len(group),
        }
        for (hops, turn), group in sorted(groups.items())
    }
