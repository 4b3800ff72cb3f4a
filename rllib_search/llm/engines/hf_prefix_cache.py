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
- a row leaves the batch (its cache is kept) as soon as it reaches its limit, EOS or a stop string.

All rows of a call share one decode batch (``max_batch_size`` is not used here). Only the caches made by the
latest call are kept: in a lock-step rollout every next prefix extends one of
them. ``load_weights`` (and ``reset_cache``) drop them, since they were computed with the old weights.
Sampling, log-probs, stop strings and EOS follow :class:`~rllib_search.llm.engines.base.Segment` exactly as
``HFEngine`` does (same sampler and ``finish_segment``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

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


class PrefixCachingHFEngine(HFEngine):
    """An :class:`HFEngine` that reuses each episode's KV cache across turns (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._caches: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.cached_tokens = 0  # tokens whose keys and values were reused instead of recomputed
        self.fed_tokens = 0  # tokens fed through the model (prefill of uncached tokens + decoding)

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
        cache = self._batch_cache(cached, past_len)
        next_position = positions[:, -1] + 1
        logits = self._forward(input_ids, attention, positions, cache)
        window = 4 * max((len(stop) for stop in params.stop), default=0) + 1
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
                if self._row_done(row, params.stop, window):
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
        )
        return out.logits[:, -1, :]

    def _row_done(self, row: _Row, stops: Sequence[str], window: int) -> bool:
        if row.generated[-1] in self.eos_token_ids:
            row.ended_with_eos = True
            return True
        if len(row.generated) >= row.limit:
            return True
        return bool(stops) and any(stop in decode(self.tokenizer, row.generated[-window:]) for stop in stops)

    # --- caches -------------------------------------------------------------------------------------
    def _longest_cached(self, prefix: list[int]) -> tuple[tuple[int, ...], list]:
        """The longest kept sequence that is a proper prefix of ``prefix`` (one token at least is fed)."""
        best: tuple[tuple[int, ...], list] = ((), [])
        for key, layers in self._caches.items():
            if len(best[0]) < len(key) < len(prefix) and tuple(prefix[: len(key)]) == key:
                best = (key, layers)
        return best

    def _batch_cache(self, cached: list[tuple[tuple[int, ...], list]], past_len: int) -> DynamicCache:
        """The rows' kept caches, left-padded to ``past_len`` into one batch cache (empty without any)."""
        if past_len == 0:
            return DynamicCache(config=self.model.config)
        reference = next(layers for key, layers in cached if key)
        layers = []
        for layer, (ref_k, _) in enumerate(reference):
            shape = (len(cached), ref_k.shape[1], past_len, ref_k.shape[3])
            keys = torch.zeros(shape, dtype=ref_k.dtype, device=ref_k.device)
            values = torch.zeros_like(keys)
            for b, (key, row_layers) in enumerate(cached):
                if key:
                    keys[b, :, past_len - len(key) :] = row_layers[layer][0][0]
                    values[b, :, past_len - len(key) :] = row_layers[layer][1][0]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

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
