"""The generation interface every engine implements, and the stop-string rule they all share.

A rollout calls :meth:`Engine.generate` once per turn with the token ids of every active episode; the
engine returns one :class:`Segment` per prefix: the new token ids, the log-probability of each under the
distribution it was sampled from, and why it ended. Token ids in, token ids out: never text.

Whatever an engine does internally (transformers' stopping criteria, vLLM's detokenizer), its raw output
goes through :func:`finish_segment`, so every engine keeps the same promise: no token is kept past the
first stop string, and the finish reason is derived from the kept tokens the same way.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

FinishReason = Literal["stop", "length", "eos"]


@dataclass
class SamplingParams:
    """How to sample one turn.

    ``temperature == 0`` means greedy decoding (``top_p`` is then ignored). ``max_new_tokens`` is the
    per-turn limit; ``Engine.generate`` may lower it per row. ``stop`` holds the stop strings (the
    protocol's closing tags). ``seed`` makes sampling reproducible for the same prefixes and parameters
    (HFEngine draws a whole call from one generator seeded with it; VLLMEngine seeds row i with seed + i).
    ``ignore_eos`` keeps generating past EOS tokens, as vLLM's option of that name (benchmarks use it to
    generate an exact number of tokens).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 500
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


@dataclass
class Segment:
    """What one prefix got from one ``generate`` call.

    ``token_ids``: the new tokens, without padding. A segment that ends at EOS includes the EOS token (the
    policy must learn to emit it); one that ends at a stop string ends with the token that completes the
    stop string, and nothing follows it.

    ``logprobs``: one per token, the log-probability of that token under the distribution it was drawn
    from: the model's logits divided by the temperature, restricted to the top-p nucleus and renormalised.
    With greedy decoding (temperature 0) it is the model's own log-softmax at temperature 1, without top-p.

    ``finish_reason``: ``"stop"`` (a stop string, given in ``stop_string``), ``"eos"`` (the EOS token) or
    ``"length"`` (the row's token limit).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_string: str | None = None


class Engine(abc.ABC):
    """Batched turn generation over token ids, with in-place weight updates.

    ``weights_version`` counts the ``load_weights`` calls, so a trajectory can record which policy
    version produced it.
    """

    weights_version: int = 0

    def generate(
        self,
        prefixes: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Segment]:
        """Continue every prefix by one segment. ``max_new_tokens`` gives a token limit per row (the
        remaining whole-trajectory budget) that replaces ``params.max_new_tokens`` for that row; a row
        with a limit of 0 gets an empty segment with finish reason ``"length"``.

        The opening every engine shares: each row's limit (:func:`row_limits`), empty segments for rows
        without room; the rows with room go to :meth:`_generate_rows`."""
        limits = row_limits(prefixes, params, max_new_tokens)
        segments = [Segment([], [], "length") for _ in prefixes]
        rows = [i for i, limit in enumerate(limits) if limit > 0]
        if rows:
            for i, segment in zip(rows, self._generate_rows(prefixes, limits, rows, params), strict=True):
                segments[i] = segment
        return segments

    @abc.abstractmethod
    def _generate_rows(
        self,
        prefixes: Sequence[Sequence[int]],
        limits: Sequence[int],
        rows: Sequence[int],
        params: SamplingParams,
    ) -> list[Segment]:
        """One segment for each index of ``rows`` (ascending, never empty; each with ``limits[i] > 0``), in
        the order of ``rows``. ``prefixes`` and ``limits`` are the whole call's, indexed by row."""

    @abc.abstractmethod
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` into the engine's model in place and increment ``weights_version``."""

    def sleep(self, level: int | None = None) -> None:  # noqa: B027 (an optional hook: a no-op by default)
        """Release accelerator memory while the learner trains (no-op unless the engine supports it);
        ``level`` is vLLM's sleep level (None: the engine's own)."""

    def reset_cache(self) -> None:  # noqa: B027 (an optional hook: a no-op by default)
        """Forget any cached keys and values (the weights changed outside ``load_weights``, or no later
        call continues the sequences cached)."""

    def wake_up(self) -> None:  # noqa: B027
        """Take back what :meth:`sleep` released (no-op unless the engine supports it)."""


def row_limits(
    prefixes: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: Sequence[int] | None
) -> list[int]:
    """Each row's token limit: ``max_new_tokens`` when given, else ``params.max_new_tokens``.
    :meth:`Engine.generate` calls this first for every engine; it also rejects an empty prefix (there is
    nothing to continue)."""
    if any(len(prefix) == 0 for prefix in prefixes):
        raise ValueError("every prefix needs at least one token")
    n = len(prefixes)
    if max_new_tokens is None:
        return [params.max_new_tokens] * n
    if len(max_new_tokens) != n:
        raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {n} prefixes")
    return [max(0, int(limit)) for limit in max_new_tokens]


def decode(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """The text of ``token_ids`` as stop strings see it: special tokens kept, no space clean-up."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _first_stop(text: str, stop_strings: Sequence[str]) -> str | None:
    """The stop string that occurs first in ``text`` (the longer one on a tie), or None."""
    hits = [(text.find(stop), -len(stop), stop) for stop in stop_strings if stop in text]
    return min(hits)[2] if hits else None


def truncate_at_stop(
    token_ids: Sequence[int], tokenizer: Any, stop_strings: Sequence[str]
) -> tuple[list[int], str | None]:
    """Cut ``token_ids`` right after the token that completes the first stop string.

    Returns the shortest prefix whose decoded text contains a stop string, and that string; or all tokens
    and None when no stop string occurs. The token completing the stop string is kept (it may carry text
    past the stop string: tokens are never split). Whatever the tokenizer, the result's text contains a
    stop string and the result without its last token contains none. A binary search over prefix lengths
    keeps this to O(log n) decodes; the prefix it finds is the shortest one when decoded text only grows as
    tokens are appended, as with byte-level BPE (a partial UTF-8 character shows as U+FFFD until its last
    byte arrives, and no stop string contains U+FFFD).
    """
    ids = list(token_ids)
    stops = [stop for stop in stop_strings if stop]
    if not stops or _first_stop(decode(tokenizer, ids), stops) is None:
        return ids, None
    without, with_stop = 0, len(ids)  # the empty prefix holds no stop string; the whole sequence does
    while with_stop - without > 1:
        middle = (without + with_stop) // 2
        if _first_stop(decode(tokenizer, ids[:middle]), stops) is None:
            without = middle
        else:
            with_stop = middle
    kept = ids[:with_stop]
    return kept, _first_stop(decode(tokenizer, kept), stops)


def finish_segment(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    tokenizer: Any,
    stop_strings: Sequence[str],
    ended_with_eos: bool,
) -> Segment:
    """Build a :class:`Segment` from an engine's raw output for one row.

    ``token_ids`` must already end at the EOS token when ``ended_with_eos`` (EOS included) and be cut to
    the row's limit. A stop string anywhere in the tokens wins: the segment is cut there (dropping any EOS
    after it) and ends with ``"stop"``; otherwise it ends with ``"eos"`` or ``"length"``.
    """
    kept, stop = truncate_at_stop(token_ids, tokenizer, stop_strings)
    if stop is not None:
        reason: FinishReason = "stop"
    elif ended_with_eos:
        reason = "eos"
    else:
        reason = "length"
    return Segment(kept, [float(lp) for lp in logprobs[: len(kept)]], reason, stop)
