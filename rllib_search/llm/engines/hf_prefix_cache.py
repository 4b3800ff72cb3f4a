"""PrefixCachingHFEngine: the HF engine for multi-turn rollouts, keeping each episode's KV cache between
turns and dropping finished rows from the batch.

A rollout calls ``generate`` once per turn with every active episode's whole token sequence. The plain
``HFEngine`` (``transformers.generate``) re-reads that whole prefix each turn and keeps computing rows that
already stopped until the last row stops. This engine runs its own decode loop instead:

- after a call, it keeps each row's keys and values (prefix + kept tokens but the last); the next call finds
  the longest kept sequence that prefixes a new prefix (by prefix hashes, :class:`_KeptCaches`) and feeds
  only the tokens after it (the last sampled token and the observation the env appended);
- the uncovered tokens are prefilled first, rows with the same prefix once (a prompt's G samples), the
  start that prefixes without a kept cache share once (a prompt template before each question), the
  distinct prefixes in passes of similar new-token counts (a row continuing with one token is not padded
  to another's 200-token observation); within a pass the rows' kept caches are left-padded into one batch
  cache, the new tokens are left-padded after it, an attention mask hides both paddings and explicit
  position ids keep every row's positions contiguous, so a row's logits are those of its unpadded
  sequence;
- the decode batch then holds every row's whole prefix, left-padded; a row that reaches its limit, EOS or
  a stop string stops generating (its cache is kept) and waits in the batch until a quarter of the batch
  has stopped, when the rest is copied into a smaller batch without the columns that only pad it
  (compacting at every stop would copy the whole cache each time: 10% of a tiny model's rollout);
- keys and values are appended in place into buffers with room for the call's tokens
  (:class:`_AppendInPlaceLayer`): transformers' ``DynamicCache`` concatenates, copying the whole cache
  at every step (13% of a tiny model's rollout, growing with the context);
- only the last position of a forward pass goes through the vocabulary projection (``logits_to_keep``),
  also when a turn prefills the observation (7% of a SmolLM2 rollout);
- on a CPU, each forward pass's fp32 matrix products of a few rows run as the fastest formulation checked
  bitwise equal to ``F.linear`` for their shape (``exact_products.py``): the same logits, faster;
- the stop-string check decodes a row's last tokens only after a token whose text holds a stop string's
  last character (or a partial UTF-8 byte): other tokens cannot complete a stop string.

Models with sliding-window layers (Gemma-3) run here too. Their caches are kept whole, and the model's
sliding-window mask, which compares a query's and a key's column in the batch, hides the keys out of the
window, so the outputs are exactly the sliding-window model's as long as a row's columns are its positions
shifted by its left padding. The decode batch is built that way; a prefill pass, whose rows feed different
numbers of new tokens, would leave padding between a row's kept cache and its new tokens, so each such row
instead feeds again the last kept tokens that the padding would take (the pass is as wide either way), or
its whole prefix when its cache is shorter than the padding.

All rows of a call share one decode batch (``max_batch_size`` is not used here; ``prefill_tokens`` bounds
a prefill pass). Only the caches made by the latest call are kept: in a lock-step rollout every next
prefix extends one of them. ``load_weights`` (and ``reset_cache``) drop them, since they were computed
with the old weights. Sampling, log-probs, stop strings and EOS follow
:class:`~rllib_search.llm.engines.base.Segment` exactly as ``HFEngine`` does (same sampler and
``finish_segment``).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from rllib_search.llm.engines.base import SamplingParams, Segment, decode, finish_segment
from rllib_search.llm.engines.exact_products import ExactProducts
from rllib_search.llm.engines.hf import HFEngine, _Sampler


@dataclass
class _Row:
    index: int  # position in the caller's list of prefixes
    prefix: list[int]
    limit: int
    generated: list[int]
    logprobs: list[float]
    ended_with_eos: bool = False


class _AppendInPlaceLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with spare positions: ``update`` writes
    the new positions in place, and reallocates (with ``spare`` more positions) only when they are full."""

    def __init__(self, spare: int) -> None:
        super().__init__()
        self.spare = spare
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def hold(self, keys: torch.Tensor, values: torch.Tensor, used: int) -> None:
        """Take ``keys``/``values`` (batch, heads, capacity, dim) as buffers whose first ``used`` positions
        are the cache."""
        self.lazy_initialization(keys, values)
        self._key_buffer, self._value_buffer = keys, values
        self._expose(used)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.get_seq_length()
        total = used + key_states.shape[-2]
        if self._key_buffer is None or total > self._key_buffer.shape[-2]:
            batch, heads, _, dim = key_states.shape
            keys = key_states.new_empty((batch, heads, total + self.spare, dim))
            values = value_states.new_empty((batch, heads, total + self.spare, dim))
            if used:
                keys[:, :, :used], values[:, :, :used] = self.keys, self.values
            self._key_buffer, self._value_buffer = keys, values
        self._key_buffer[:, :, used:total] = key_states
        self._value_buffer[:, :, used:total] = value_states
        self._expose(total)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keep_rows(indices, start=0)

    def keep_rows(self, indices: torch.Tensor, start: int) -> None:
        """Keep only the rows ``indices`` and the positions from ``start`` on (earlier ones pad every kept
        row); copies only what is kept, spare room included."""
        if self._key_buffer is not None:
            used = self.get_seq_length() - start
            self._key_buffer = self._key_buffer[:, :, start:].index_select(0, indices)
            self._value_buffer = self._value_buffer[:, :, start:].index_select(0, indices)
            self._expose(used)

    def _expose(self, used: int) -> None:
        self.keys = self._key_buffer[:, :, :used]
        self.values = self._value_buffer[:, :, :used]


class _KeptCaches:
    """Token sequences with their per-layer keys and values, and a lookup of the longest one that is a
    proper prefix of a given sequence in O(length + kept) numpy work.

    Comparing a prefix against every kept sequence costs rows x kept x length: about 10 s a turn for
    Search-R1's 2,560 rows (measured 0.6 s for 640 rows of up to 2,000 tokens; it grows as the square).
    Instead every sequence gets a hash of each of its prefixes at once, a wrapping uint64 sum of token x a
    random weight per position (a cumulative sum), and the kept sequences' hashes are looked up among a
    prefix's with ``np.isin`` (1.4 s for the 2,560 rows); a hit is then compared token by token, so a hash
    collision only costs a missed reuse, never a wrong cache.
    """

    def __init__(self) -> None:
        self.layers: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._by_hash: dict[int, tuple[int, ...]] = {}
        self._hashes = np.zeros(0, dtype=np.uint64)
        self._weights = np.zeros(0, dtype=np.uint64)

    def replace(self, layers: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
        """Keep exactly ``layers`` (sequence -> keys and values per layer)."""
        self.layers = layers
        self._by_hash = {int(self.prefix_hashes(key)[-1]): key for key in layers}
        self._hashes = np.fromiter(self._by_hash, dtype=np.uint64, count=len(self._by_hash))

    def longest_prefix_of(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], list]:
        """The longest kept sequence that is a proper prefix of ``tokens`` and its layers (``((), [])``
        without one)."""
        if not self.layers or len(tokens) < 2:
            return (), []
        hashes = self.prefix_hashes(tokens)[:-1]  # proper prefixes only: one token at least is fed
        for position in np.flatnonzero(np.isin(hashes, self._hashes))[::-1]:
            key = self._by_hash[int(hashes[position])]
            if len(key) == position + 1 and tuple(tokens[: position + 1]) == key:
                return key, self.layers[key]
        return (), []

    def prefix_hashes(self, tokens: Sequence[int]) -> np.ndarray:
        """The hash of ``tokens[:n]`` at index ``n - 1``, for every ``n``."""
        if len(tokens) > len(self._weights):  # the same weights for every sequence, grown as needed
            grown = np.random.default_rng(0).integers(0, 2**64, size=2 * len(tokens), dtype=np.uint64)
            grown[: len(self._weights)] = self._weights
            self._weights = grown
        return np.cumsum(np.asarray(tokens, dtype=np.uint64) * self._weights[: len(tokens)], dtype=np.uint64)


class PrefixCachingHFEngine(HFEngine):
    """An :class:`HFEngine` that reuses each episode's KV cache across turns (see the module docstring).

    ``prefill_tokens`` bounds the (padded) tokens of one prefill forward pass: a call's new tokens are fed
    in several passes when they exceed it. Prefixes with no kept cache that start alike for at least
    ``min_shared_tokens`` tokens (different questions after one prompt template) prefill that start once.
    Models with sliding-window layers are served exactly (see the module docstring); :meth:`supports`
    tells whether a model's cache layers are ones this engine knows.
    ``exact_products`` (default on; only CPU fp32 products are affected) serves each forward pass's linear
    layers by an :class:`~rllib_search.llm.engines.exact_products.ExactProducts`, kept as ``products``.
    """

    def __init__(
        self,
        *args,
        prefill_tokens: int = 16384,
        min_shared_tokens: int = 32,
        exact_products: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        if not self.supports(self.model):
            name = type(self.model).__name__
            raise ValueError(f"PrefixCachingHFEngine does not know the cache layers of {name}; use HFEngine")
        self.prefill_tokens = prefill_tokens
        self.min_shared_tokens = min_shared_tokens
        self._caches = _KeptCaches()
        self.cached_tokens = 0  # tokens whose keys and values were reused instead of recomputed
        # Tokens fed through the model: prefill of uncached tokens + decoding (padding and finished rows
        # waiting in the batch not counted).
        self.fed_tokens = 0
        # Where a call's wall time goes: forward passes that prefill uncovered tokens, forward passes that
        # decode, and the whole call (the rest is this engine's bookkeeping: caches, sampling, stops).
        self.seconds = {"prefill": 0.0, "decode": 0.0, "call": 0.0}
        self._stop_enders: dict[tuple[str, ...], torch.Tensor] = {}
        # Project only the last position onto the vocabulary, prefill included, where the model allows it.
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        accepts = "logits_to_keep" in inspect.signature(base.forward).parameters
        self._forward_options = {"logits_to_keep": 1} if accepts else {}
        on_cpu = self.device.type == "cpu"
        self.products = ExactProducts() if exact_products and on_cpu else None

    @staticmethod
    def supports(model) -> bool:
        """Whether ``model``'s cache layers all attend to every position or to a sliding window (others, such
        as linear attention's, hold state this engine cannot keep per row)."""
        layers = DynamicCache(config=model.config).layers
        return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)

    def reset_cache(self) -> None:
        self._caches.replace({})

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        super().load_weights(state_dict)
        self.reset_cache()

    def _generate_rows(
        self,
        prefixes: Sequence[Sequence[int]],
        limits: Sequence[int],
        rows: Sequence[int],
        params: SamplingParams,
    ) -> list[Segment]:
        """Continue each row by one segment, feeding only the tokens no kept cache covers."""
        started = time.perf_counter()
        call = [_Row(i, list(prefixes[i]), limits[i], [], []) for i in rows]
        new_caches: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        with self.inference():
            sampler = _Sampler(params.temperature, params.top_p, self.generator(params.seed))
            self._decode(call, params, sampler, new_caches)
        self._caches.replace(new_caches)
        segments = [
            finish_segment(row.generated, row.logprobs, self.tokenizer, params.stop, row.ended_with_eos)
            for row in call
        ]
        self.seconds["call"] += time.perf_counter() - started
        return segments

    # --- prefill: the tokens no kept cache covers -------------------------------------------------------
    def _prefill(self, rows: list[_Row]) -> tuple[list[list], torch.Tensor]:
        """Feed each row's uncovered tokens; return each row's keys and values over its whole prefix and
        the logits of its last position (one row per ``rows``).

        Rows with the same prefix (a prompt's G samples) are fed once. The distinct prefixes go through the
        model in passes of similar new-token counts (longest first), so that a row continuing with one
        token is not padded to another's 200-token observation, each pass at most ``prefill_tokens``
        padded tokens wide.
        """
        distinct: dict[tuple[int, ...], int] = {}
        for row in rows:
            distinct.setdefault(tuple(row.prefix), len(distinct))
        prefixes = list(distinct)
        cached = [self._caches.longest_prefix_of(prefix) for prefix in prefixes]
        # The kept caches are read through ``cached`` from here on: each is freed once its pass copied it,
        # rather than all of them held beside this call's new copies.
        self._caches.replace({})
        sharing = self._share_common_start(prefixes, cached)
        new_counts = [len(prefix) - len(key) for prefix, (key, _) in zip(prefixes, cached)]
        layers: list[list] = [[] for _ in prefixes]
        logits: list[torch.Tensor | None] = [None] * len(prefixes)
        for group in self._prefill_passes(new_counts):
            width = max(new_counts[i] for i in group)
            for i in group:  # no padding between a row's kept cache and its new tokens
                cached[i] = self._without_last(cached[i], width - new_counts[i])
            self.cached_tokens += sum(len(cached[i][0]) for i in group)
            self.fed_tokens += sum(len(prefixes[i]) - len(cached[i][0]) for i in group)
            group_cached = [cached[i] for i in group]
            past_len = max(len(key) for key, _ in group_cached)
            input_ids = torch.full((len(group), width), self.pad_token_id, dtype=torch.long)
            attention = torch.zeros((len(group), past_len + width), dtype=torch.long)
            positions = torch.zeros((len(group), width), dtype=torch.long)
            for b, i in enumerate(group):
                key, new = cached[i][0], prefixes[i][len(cached[i][0]) :]
                input_ids[b, width - len(new) :] = torch.tensor(new)
                attention[b, past_len - len(key) : past_len] = 1
                attention[b, past_len + width - len(new) :] = 1
                positions[b, width - len(new) :] = torch.arange(len(key), len(prefixes[i]))
            cache = self._batch_cache(
                [layers_ for _, layers_ in group_cached],
                [len(key) for key, _ in group_cached],
                past_len,
                width,
            )
            del group_cached
            for i in group:  # copied into the pass's cache: only the token count is read after the passes
                cached[i] = (cached[i][0], [])
            group_logits = self._forward(input_ids, attention, positions, cache, phase="prefill")
            for b, i in enumerate(group):
                real = attention[b].nonzero().squeeze(1).to(self.device)
                # Indexing with a tensor copies: the row's keys and values, unpadded, in order.
                layers[i] = [
                    (layer.keys[b : b + 1, :, real], layer.values[b : b + 1, :, real])
                    for layer in cache.layers
                ]
                logits[i] = group_logits[b]
        # The shared start was computed once, for the row that kept most of it: that row reused none.
        self.cached_tokens -= max((len(cached[i][0]) for i in sharing), default=0)
        order = [distinct[tuple(row.prefix)] for row in rows]
        return [layers[i] for i in order], torch.stack([logits[i] for i in order])

    @staticmethod
    def _without_last(cached: tuple, count: int) -> tuple:
        """A kept cache (tokens, per-layer keys and values) without its last ``count`` positions, which the
        row then feeds again in place of padding; none at all when it is not longer than ``count``."""
        key, layers = cached
        if count == 0:
            return cached
        if len(key) <= count:
            return (), []
        keep = len(key) - count
        return key[:keep], [(k[:, :, :keep], v[:, :, :keep]) for k, v in layers]

    def _share_common_start(self, prefixes: list[tuple[int, ...]], cached: list[tuple]) -> set[int]:
        """Prefill once the tokens that every prefix without a kept cache starts with (a prompt template's
        instructions before each question), and give it to them as their kept cache; return which prefixes
        got it. Skipped under ``min_shared_tokens``, where one more forward pass would cost more than it
        saves."""
        fresh = [i for i, (key, _) in enumerate(cached) if not key]
        if len(fresh) < 2:
            return set()
        width = min(len(prefixes[i]) for i in fresh) - 1  # each prefix keeps one token at least to feed
        starts = np.array([prefixes[i][:width] for i in fresh])
        same = (starts == starts[0]).all(axis=0)
        shared = width if same.all() else int(same.argmin())
        if shared < self.min_shared_tokens:
            return set()
        tokens = list(prefixes[fresh[0]][:shared])
        cache = self._batch_cache([], [], past_len=0, room=shared)
        self._forward(
            torch.tensor([tokens]),
            torch.ones((1, shared), dtype=torch.long),
            torch.arange(shared)[None],
            cache,
            phase="prefill",
        )
        self.fed_tokens += shared
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for i in fresh:
            cached[i] = (tuple(tokens), layers)
        return set(fresh)

    def _prefill_passes(self, new_counts: list[int]) -> list[list[int]]:
        """Group prefixes (indices into ``new_counts``) into forward passes: longest first, a new pass when
        a prefix has less than half the pass's width to feed or the pass would exceed ``prefill_tokens``."""
        passes: list[list[int]] = []
        width = 0
        for i in sorted(range(len(new_counts)), key=lambda i: -new_counts[i]):
            if not passes or 2 * new_counts[i] < width or (len(passes[-1]) + 1) * width > self.prefill_tokens:
                passes.append([])
                width = new_counts[i]
            passes[-1].append(i)
        return passes

    # --- the decode loop ------------------------------------------------------------------------------
    def _decode(self, rows: list[_Row], params: SamplingParams, sampler: _Sampler, new_caches: dict) -> None:
        row_layers, logits = self._prefill(rows)
        lengths = [len(row.prefix) for row in rows]
        past_len, batch = max(lengths), len(rows)
        cache = self._batch_cache(
            row_layers, lengths, past_len, room=max(row.limit for row in rows), consume=True
        )
        del row_layers
        attention = torch.zeros((batch, past_len), dtype=torch.long)
        for b, length in enumerate(lengths):
            attention[b, past_len - length :] = 1
        next_position = torch.tensor(lengths)
        window = 4 * max((len(stop) for stop in params.stop), default=0) + 1
        may_end_stop = self._stop_enders_for(params.stop).tolist()  # a list: indexed per row and step
        slot_rows = list(range(batch))  # the row in each slot of the batch
        live = list(range(batch))  # the slots still generating; finished rows leave the batch in groups
        while True:
            if len(live) < len(slot_rows):
                logits = logits[torch.tensor(live, device=logits.device)]
            drawn, drawn_logprobs = sampler.draw(logits)
            tokens, step_logprobs = drawn.tolist(), drawn_logprobs.tolist()
            still = []
            for token, logprob, slot in zip(tokens, step_logprobs, live):
                row = rows[slot_rows[slot]]
                row.generated.append(token)
                row.logprobs.append(logprob)
                if self._row_done(row, params, window, may_end_stop):
                    new_caches[tuple(row.prefix + row.generated[:-1])] = self._row_cache(
                        cache, attention, slot
                    )
                else:
                    still.append((slot, token))
            if not still:
                break
            live = [slot for slot, _ in still]
            if 4 * (len(slot_rows) - len(live)) >= len(slot_rows):
                # A quarter of the batch has finished: copy the rest into a smaller batch. Finished rows stay
                # (fed a token, their outputs unused) until then: compacting at every finish copied the
                # whole cache each time (10% of a tiny model's rollout).
                keep = torch.tensor(live)
                attention, next_position = attention[keep], next_position[keep]
                start = int(attention.any(dim=0).int().argmax())  # columns before it pad every kept row
                attention = attention[:, start:]
                keep_on_device = keep.to(self.device)
                for layer in cache.layers:
                    layer.keep_rows(keep_on_device, start)
                slot_rows = [slot_rows[slot] for slot in live]
                live = list(range(len(live)))
            feed = torch.full((len(slot_rows), 1), self.pad_token_id, dtype=torch.long)
            feed[live, 0] = torch.tensor([token for _, token in still])
            attention = torch.cat([attention, torch.ones((len(slot_rows), 1), dtype=torch.long)], dim=1)
            self.fed_tokens += len(live)
            logits = self._forward(feed, attention, next_position[:, None], cache, phase="decode")
            next_position = next_position + 1

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        phase: str,
    ) -> torch.Tensor:
        """The logits of each row's last position; the pass's wall time counts in ``seconds[phase]``."""
        started = time.perf_counter()
        with self.products.serving(self.model) if self.products is not None else contextlib.nullcontext():
            out = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                position_ids=positions.to(self.device),
                past_key_values=cache,
                use_cache=True,
                **self._forward_options,
            )
        logits = out.logits[:, -1, :]
        self.seconds[phase] += time.perf_counter() - started
        return logits

    def _row_done(self, row: _Row, params: SamplingParams, window: int, may_end_stop: list[bool]) -> bool:
        last, stops = row.generated[-1], params.stop
        if last in self.eos_token_ids and not params.ignore_eos:
            row.ended_with_eos = True
            return True
        if len(row.generated) >= row.limit:
            return True
        if not stops or (last < len(may_end_stop) and not may_end_stop[last]):
            return False
        return any(stop in decode(self.tokenizer, row.generated[-window:]) for stop in stops)

    def _stop_enders_for(self, stops: Sequence[str]) -> torch.Tensor:
        """Per token id: may this token complete one of ``stops``? True when its text holds a stop string's
        last character or U+FFFD (a partial UTF-8 character). Computed once per set of stop strings."""
        key = tuple(stop for stop in stops if stop)
        if key not in self._stop_enders:
            enders = {stop[-1] for stop in key}
            texts = self.tokenizer.batch_decode(
                [[i] for i in range(len(self.tokenizer))],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            self._stop_enders[key] = torch.tensor(
                [("\ufffd" in text) or any(c in text for c in enders) for text in texts], dtype=torch.bool
            )
        return self._stop_enders[key]

    # --- caches -------------------------------------------------------------------------------------
    def _batch_cache(
        self, row_layers: list[list], lengths: list[int], past_len: int, room: int, consume: bool = False
    ) -> DynamicCache:
        """Rows' keys and values (``lengths[b]`` positions each, none for an empty list), left-padded to
        ``past_len`` into one batch cache with ``room`` free positions for this call's tokens. ``consume``:
        the rows' lists are this call's alone, and each layer of them is released once copied, so the rows
        and the batch are not both held whole."""
        cache = DynamicCache(config=self.model.config)
        cache.layers = [_AppendInPlaceLayer(spare=room) for _ in cache.layers]
        if past_len == 0:
            return cache
        reference = next(layers for layers in row_layers if layers)
        for index, (ref_k, _) in enumerate(reference):
            shape = (len(row_layers), ref_k.shape[1], past_len + room, ref_k.shape[3])
            # Uninitialised but for the left padding, which attention masks out yet multiplies by 0: it must
            # not hold NaN. The room after ``past_len`` is written before attention reads it.
            keys = torch.empty(shape, dtype=ref_k.dtype, device=ref_k.device)
            values = torch.empty_like(keys)
            for b, (layers, length) in enumerate(zip(row_layers, lengths)):
                keys[b, :, : past_len - length] = 0
                values[b, :, : past_len - length] = 0
                if length:
                    keys[b, :, past_len - length : past_len] = layers[index][0][0]
                    values[b, :, past_len - length : past_len] = layers[index][1][0]
            cache.layers[index].hold(keys, values, used=past_len)
            if consume:  # rows with one prefix share a list: released after every row is copied
                for layers in row_layers:
                    if layers:
                        layers[index] = None
        return cache

    @staticmethod
    def _row_cache(
        cache: DynamicCache, attention: torch.Tensor, slot: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A decoding row's keys and values: its positions after its left padding (a copy)."""
        start = int(attention[slot].argmax())  # the row's first real position: the rest are real too
        return [
            (layer.keys[slot : slot + 1, :, start:].clone(), layer.values[slot : slot + 1, :, start:].clone())
            for layer in cache.layers
        ]
