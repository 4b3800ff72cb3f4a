"""The one record a rollout produces and a learner consumes: token ids with a parallel loss mask.

Token ids are the truth. Each appended span keeps the ids exactly as the sampler produced them (generated
spans, loss mask 1) or as the env tokenised them (prompt and observations, loss mask 0); the text kept
beside them is for parsing and rewards only and is never turned back into ids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rllib_search.env.protocols import Turn

SpanKind = Literal["prompt", "generated", "observation"]


@dataclass(frozen=True)
class Span:
    """A contiguous piece of the trajectory: ``token_ids[start:end]`` with its text."""

    kind: SpanKind
    start: int
    end: int
    text: str


@dataclass
class Trajectory:
    """Prompt, generated and observation spans of one episode, flat and in order.

    ``logprobs`` holds the sampler's log-probability of each generated token where it was given, and NaN
    everywhere else (prompt, observations, or generated tokens whose log-probs were not recorded).
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)

    def append(self, kind: SpanKind, ids: Sequence[int], text: str, logprobs: Sequence[float] | None = None):
        """Append one span. ``logprobs`` (generated spans only) must have one value per id."""
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(logprobs)} log-probs for {len(ids)} tokens")
        if kind == "prompt" and self.spans:
            raise ValueError("the prompt must be the first span")
        start = len(self.token_ids)
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1 if kind == "generated" else 0] * len(ids))
        if logprobs is None:
            self.logprobs.extend([math.nan] * len(ids))
        else:
            self.logprobs.extend(float(lp) for lp in logprobs)
        self.spans.append(Span(kind, start, len(self.token_ids), text))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_length(self) -> int:
        return self.spans[0].end if self.spans and self.spans[0].kind == "prompt" else 0

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.prompt_length]

    @property
    def response_ids(self) -> list[int]:
        return self.token_ids[self.prompt_length :]

    @property
    def response_mask(self) -> list[int]:
        return self.loss_mask[self.prompt_length :]

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_observation_tokens(self) -> int:
        return sum(span.end - span.start for span in self.spans if span.kind == "observation")

    @property
    def turn_spans(self) -> list[tuple[int, int]]:
        """(start, end) of each generated segment in ``token_ids``: the model's turns."""
        return [(s.start, s.end) for s in self.spans if s.kind == "generated"]

    def response_turns(self) -> list[Turn]:
        """The response as text turns (what format checks and rewards read)."""
        return [Turn(s.kind, s.text) for s in self.spans if s.kind != "prompt"]  # type: ignore[arg-type]

    def response_text(self) -> str:
        return "".join(turn.text for turn in self.response_turns())

    def to_dict(self) -> dict[str, object]:
        """A plain-data copy (lists and dicts) for logging, pickling or Arrow."""
        return {
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs),
            "prompt_length": self.prompt_length,
            "spans": [(s.kind, s.start, s.end) for s in self.spans],
        }
