"""PrefixCachingHFEngine: the HF engine for multi-turn rollouts, keeping each episode's KV cache between
turns and dropping finished rows from the batch.

A rollout calls ``generate`` once per turn with every active episode's whole token sequence. The plain
``HFEngine`` (``transformers.generate``) re-reads that whole prefix each turn and keeps computing rows that
already stopped until the last row stops. This engine runs its own decode loop instead:

- after a call, it keeps each row's keys and values (prefix + kept tokens but the last); the next call finds
  the longest kept sequence that prefixes a new prefix and feeds only the tokens after it (the last sampled
  token and the observation the env appended);
- the rows' caches have different lengths: they are left-padded into one batch cache, the new tokens are
  left-padded after it, an attention mask hides both paddings and explicit position ids keep every row's
  positions contiguous, so a row's logits are those of its unpadded sequence;
- a row leaves the batch (its cache is kept) as soon as it reaches its limit, EOS or a stop string;
- keys and values are appended in place into buffers with room for the call's tokens
  (:class:`_AppendInPlaceLayer`): transformers' ``DynamicCache`` concatenates, copying the whole cache
  at every step (13% of a tiny model's rollout, growing with the context);
- only the last position of a forward pass goes through the vocabulary projection (``logits_to_keep``),
  also when a turn prefills the observation (7% of a SmolLM2 rollout);
- the stop-string check decodes a row's last tokens only after a token whose text holds a stop string's
  last character (or a partial UTF-8 byte): other tokens cannot complete a stop string.

All rows of a call share one decode batch (``max_batch_size`` is not used here). Only the caches made by the
latest call are kept: in a lock-step rollout every next prefix extends one of
them. ``load_weights`` (and ``reset_cache``) drop them, since they were computed with the old weights.
Sampling, log-probs, stop strings and EOS follow :class:`~rllib_search.llm.engines.base.Segment` exactly as
``HFEngine`` does (same sampler and ``finish_segment``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rllib_search.llm.engines.base import SamplingParams, Segment, decode, finish_segment, row_limits
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
        if self._key_buffer is not None:
            used = self.get_seq_length()
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self._expose(used)

    def _expose(self, used: int) -> None:
        self.keys = self._key_buffer[:, :, :used]
        self.values = self._value_buffer[:, :, :used]


class PrefixCachingHFEngine(HFEngine):
    """An :class:`HFEngine` that reuses each episode's KV cache across turns (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._caches: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.cached_tokens = 0  # tokens whose keys and values were reused instead of recomputed
        self.fed_tokens = 0  # tokens fed through the model (prefill of uncached tokens + decoding)
        self._stop_enders: dict[tuple[str, ...], torch.Tensor] = {}
        # Project only the last position onto the vocabulary, prefill included, where the model allows it.
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        accepts = "logits_to_keep" in inspect.signature(base.forward).parameters
        self._forward_options = {"logits_to_keep": 1} if accepts else {}

    def reset_cache(self) -> None:
        self._caches = {}

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        super().load_weights(state_dict)
        self.reset_cache()

    def generate(
        self,
        prefixes: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Segment]:
        """Continue each prefix by one segment, feeding only the tokens no kept cache covers."""
        limits = row_limits(prefixes, params, max_new_tokens)
        rows = [
            _Row(i, list(p), limit, [], []) for i, (p, limit) in enumerate(zip(prefixes, limits)) if limit > 0
        ]
        generator = (
            torch.Generator(device=self.device).manual_seed(params.seed) if params.seed is not None else None
        )
        new_caches: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                if rows:
                    self._decode(
                        rows, params, _Sampler(params.temperature, params.top_p, generator), new_caches
                    )
        finally:
            self.model.train(was_training)
        self._caches = new_caches
        segments = [Segment([], [], "length") for _ in prefixes]
        for row in rows:
            segments[row.index] = finish_segment(
                row.generated, row.logprobs, self.tokenizer, params.stop, row.ended_with_eos
            )
        return segments

    # --- the decode loop ------------------------------------------------------------------------------
    def _decode(self, rows: list[_Row], params: SamplingParams, sampler: _Sampler, new_caches: dict) -> None:
        cached = [self._longest_cached(row.prefix) for row in rows]
        suffixes = [row.prefix[len(key) :] for row, (key, _) in zip(rows, cached)]
        past_len = max(len(key) for key, _ in cached)
        width = max(len(s) for s in suffixes)
        batch = len(rows)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, past_len + width), dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for b, ((key, _), suffix) in enumerate(zip(cached, suffixes)):
            input_ids[b, width - len(suffix) :] = torch.tensor(suffix)
            attention[b, past_len - len(key) : past_len] = 1
            attention[b, past_len + width - len(suffix) :] = 1
            positions[b, width - len(suffix) :] = torch.arange(len(key), len(key) + len(suffix))
        self.cached_tokens += sum(len(key) for key, _ in cached)
        self.fed_tokens += sum(len(s) for s in suffixes)
        cache = self._batch_cache(cached, past_len, room=width + max(row.limit for row in rows))
        next_position = positions[:, -1] + 1
        logits = self._forward(input_ids, attention, positions, cache)
        window = 4 * max((len(stop) for stop in params.stop), default=0) + 1
        may_end_stop = self._stop_enders_for(params.stop).tolist()  # a list: indexed per row and step
        active = list(range(batch))
        while active:
            chosen = sampler(None, logits)
            tokens = chosen.argmax(dim=-1).tolist()
            step_logprobs = sampler.logprobs.pop().tolist()
            still = []
            for slot, b in enumerate(active):
                row = rows[b]
                row.generated.append(tokens[slot])
                row.logprobs.append(step_logprobs[slot])
                if self._row_done(row, params, window, may_end_stop):
                    new_caches[tuple(row.prefix + row.generated[:-1])] = self._row_cache(
                        cache, attention, slot
                    )
                else:
                    still.append(slot)
            if not still:
                break
            if len(still) < len(active):  # compact: finished rows leave the batch
                keep = torch.tensor(still)
                cache.batch_select_indices(keep.to(self.device))
                attention, next_position = attention[keep], next_position[keep]
            attention = torch.cat([attention, torch.ones((len(still), 1), dtype=torch.long)], dim=1)
            feed = torch.tensor([[tokens[slot]] for slot in still])
            self.fed_tokens += len(still)
            logits = self._forward(feed, attention, next_position[:, None], cache)
            next_position = next_position + 1
            active = [active[slot] for slot in still]

    def _forward(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            use_cache=True,
            **self._forward_options,
        )
        return out.logits[:, -1, :]

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
    def _longest_cached(self, prefix: list[int]) -> tuple[tuple[int, ...], list]:
        """The longest kept sequence that is a proper prefix of ``prefix`` (one token at least is fed)."""
        best: tuple[tuple[int, ...], list] = ((), [])
        for key, layers in self._caches.items():
            if len(best[0]) < len(key) < len(prefix) and tuple(prefix[: len(key)]) == key:
                best = (key, layers)
        return best

    def _batch_cache(
        self, cached: list[tuple[tuple[int, ...], list]], past_len: int, room: int
    ) -> DynamicCache:
        """The rows' kept caches, left-padded to ``past_len`` into one batch cache with ``room`` free
        positions for this call's tokens (empty without any kept cache)."""
        cache = DynamicCache(config=self.model.config)
        for index, layer in enumerate(cache.layers):
            if type(layer) is DynamicLayer:  # full attention; sliding-window layers keep their own update
                cache.layers[index] = _AppendInPlaceLayer(spare=room)
        if past_len == 0:
            return cache
        reference = next(layers for key, layers in cached if key)
        for index, (ref_k, _) in enumerate(reference):
            layer = cache.layers[index]
            capacity = past_len + (room if isinstance(layer, _AppendInPlaceLayer) else 0)
            shape = (len(cached), ref_k.shape[1], capacity, ref_k.shape[3])
            keys = torch.zeros(shape, dtype=ref_k.dtype, device=ref_k.device)
            values = torch.zeros_like(keys)
            for b, (key, row_layers) in enumerate(cached):
                if key:
                    keys[b, :, past_len - len(key) : past_len] = row_layers[index][0][0]
                    values[b, :, past_len - len(key) : past_len] = row_layers[index][1][0]
            if isinstance(layer, _AppendInPlaceLayer):
                layer.hold(keys, values, used=past_len)
            else:
                layer.update(keys, values)
        return cache

    @staticmethod
    def _row_cache(
        cache: DynamicCache, attention: torch.Tensor, slot: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One row's keys and values at its unpadded positions, in order."""
        real = attention[slot].nonzero().squeeze(1).to(cache.layers[0].keys.device)
        return [
            (layer.keys[slot : slot + 1, :, real].clone(), layer.values[slot : slot + 1, :, real].clone())
            for layer in cache.layers
        ]
