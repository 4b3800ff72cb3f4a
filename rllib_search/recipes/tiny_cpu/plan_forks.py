"""Where a policy's stated plan parts, teacher-forced: the lazy-plan teacher's two forks.

The main job's teacher (``env/teacher.py``, ``state_plan`` with ``lazy_plan``) states its plan in the first
thought: "I need to search for X birthplace" then "." on a 1-hop question, ", then its country, then
answer." on a 2-hop one, and ", then answer." where it hesitates. So a model trained on it decides how many
hops to make at two tokens: "," against "." right after the first query (``goes_on``), and " its" against
" answer" after ", then" (``its``). This reads the model's probabilities there, the question's prompt and the
teacher's plan up to the first fork fed as token ids: one forward pass per question gives both forks,
since the plan's tokens followed by those of ", then" are the tokens of the two texts joined (checked for
every question of the embedded world with SmolLM2's tokenizer).

RL can lift the second search on 2-hop questions without touching 1-hop ones when the kinds part at ","
(low on 1-hop, high on 2-hop questions) and " its" is sampled sometimes but not chosen greedily;
``ForkWindow.contains`` says whether a warm start is there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rllib_search.data.records import QARecord
from rllib_search.env.search_env import MultiTurnSearchEnv
from rllib_search.env.teacher import TeacherPolicy, hops_of

FORKS = {"goes_on": (",", "."), "its": (" its", " answer")}  # each fork: (the token read, its alternative)


@dataclass(frozen=True)
class ForkContext:
    """A question's prompt and the teacher's plan up to its first fork, as token ids."""

    prompt_ids: list[int]
    plan_ids: list[int]  # "<think> I need to search for <first query>"
    then_ids: list[int]  # ", then"


@dataclass(frozen=True)
class ForkWindow:
    """Where a warm start leaves RL a second search to lift on 2-hop questions and none to spread to 1-hop
    ones: mean P(",") at most ``one_hop_goes_on`` on 1-hop and at least ``two_hop_goes_on`` on 2-hop
    questions, and mean P(" its") on 2-hop questions within ``its``."""

    one_hop_goes_on: float = 0.15
    two_hop_goes_on: float = 0.55
    its: tuple[float, float] = (0.15, 0.5)

    def contains(self, forks: dict[int, dict[str, float]]) -> bool:
        """Whether ``forks`` (``mean_forks``' result: hop count -> fork -> mean) lie in the window."""
        low, high = self.its
        return (
            forks[1]["goes_on"] <= self.one_hop_goes_on
            and forks[2]["goes_on"] >= self.two_hop_goes_on
            and low <= forks[2]["its"] <= high
        )


def fork_contexts(records: Sequence[QARecord], env: MultiTurnSearchEnv, tokenizer: Any) -> list[ForkContext]:
    """Each record's prompt (``env``'s protocol) and the stated plan up to its first fork."""
    teacher = TeacherPolicy(env.protocol, state_plan=True)
    then_ids = tokenizer(", then", add_special_tokens=False)["input_ids"]
    contexts = []
    for record in records:
        _, prompt_ids = env.render_prompt(record.question)
        plan = teacher.segment(record, 0, [])
        opening = f"I need to search for {hops_of(record)[0]['query']}"
        prefix = plan[: plan.index(opening) + len(opening)]
        plan_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        contexts.append(ForkContext(list(prompt_ids), plan_ids, then_ids))
    return contexts


def fork_probabilities(model: Any, tokenizer: Any, context: ForkContext) -> dict[str, float]:
    """P(the fork's token | it or its alternative) at both forks, from one forward pass."""
    return batch_fork_probabilities(model, tokenizer, [context])[0]


def batch_fork_probabilities(
    model: Any, tokenizer: Any, contexts: Sequence[ForkContext], batch_size: int = 16
) -> list[dict[str, float]]:
    """``fork_probabilities`` of each context, ``batch_size`` rows a forward pass. The contexts' common
    prefix (the protocol's instructions: about 60% of the main job's tokens) is read once and its KV cache
    shared; the rows' rests are padded on the right, so a causal model's logits at the forks are those of
    the row alone."""
    import copy

    import torch

    chosen_other = {
        fork: [tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in pair]
        for fork, pair in FORKS.items()
    }
    device = next(model.parameters()).device  # the learner's GPU when there is one
    ids = [c.prompt_ids + c.plan_ids + c.then_ids for c in contexts]
    goes_on = [len(c.prompt_ids) + len(c.plan_ids) - 1 for c in contexts]  # predicts the token after the plan
    shared = min(_common_prefix_length(ids), *goes_on) if ids else 0  # each fork read past the prefix
    cache = None
    if shared:
        with torch.no_grad():
            prefix = torch.tensor([ids[0][:shared]], device=device)
            cache = model(input_ids=prefix, use_cache=True).past_key_values
    results = []
    for start in range(0, len(ids), batch_size):
        rows = [row[shared:] for row in ids[start : start + batch_size]]
        width = max(len(row) for row in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention = torch.zeros((len(rows), shared + width), dtype=torch.long)
        attention[:, :shared] = 1
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = torch.tensor(row)
            attention[i, shared : shared + len(row)] = 1
        past = None
        if cache is not None:
            past = copy.deepcopy(cache)  # the forward pass appends to it
            past.batch_repeat_interleave(len(rows))
        with torch.no_grad():
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), past_key_values=past
            ).logits
        for i, row in enumerate(rows):
            positions = {"goes_on": goes_on[start + i] - shared, "its": len(row) - 1}
            result = {}
            for fork, (chosen, other) in chosen_other.items():
                probs = torch.softmax(logits[i, positions[fork]].float(), -1)
                result[fork] = float(probs[chosen] / (probs[chosen] + probs[other]))
            results.append(result)
    return results


def _common_prefix_length(rows: Sequence[list[int]]) -> int:
    first = rows[0]
    length = min(len(row) for row in rows)
    for row in rows[1:]:
        length = next((i for i in range(length) if row[i] != first[i]), length)
    return length


def summarize_forks(rows: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per fork: the mean probability and how many questions are above 0.5 (chosen greedily)."""
    return {
        fork: {"mean": sum(r[fork] for r in rows) / len(rows), "above_half": sum(r[fork] > 0.5 for r in rows)}
        for fork in FORKS
    }


def mean_forks(
    model: Any, tokenizer: Any, contexts: dict[int, Sequence[ForkContext]]
) -> dict[int, dict[str, float]]:
    """Mean P at each fork per hop count, for ``contexts`` keyed by hop count (``model`` left as it was)."""
    with _evaluating(model):
        return {
            hops: {
                fork: summary["mean"]
                for fork, summary in summarize_forks(batch_fork_probabilities(model, tokenizer, rows)).items()
            }
            for hops, rows in contexts.items()
        }


@contextlib.contextmanager
def _evaluating(model: Any) -> Iterator[None]:
    """``model`` in eval mode inside the block, back in its own mode after."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)
