"""The transformers engine: batched turn generation with ``model.generate`` on any device (the CPU path).

A batch of prefixes is left-padded into one tensor with an attention mask and continued with the KV cache.
Two hooks do the work transformers' own sampling would:

- :class:`_Sampler`, the last logits processor, applies the temperature and top-p, draws each row's token
  from a seeded ``torch.Generator`` and records the token's log-probability on the spot; it then hands
  transformers a distribution with all its mass on the drawn token, which greedy selection picks. Only
  one step of ``batch x vocab`` scores is alive at a time: no per-step logits are kept.
- :class:`_RowStops`, a stopping criterion, ends each row at its own token limit or as soon as its new
  text contains a stop string. EOS is transformers' own criterion.

The raw rows then go through :func:`finish_segment`, the rule every engine shares.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from rllib_search.llm.engines.base import (
    Engine,
    SamplingParams,
    Segment,
    decode,
    finish_segment,
)


class HFEngine(Engine):
    """Generate with a Hugging Face causal LM (a plain or a peft model) in this process.

    ``max_batch_size`` bounds how many prefixes share one ``generate`` call (memory grows with batch x
    longest prefix); rows are grouped by length so that short prefixes are not padded to long ones.
    ``None`` puts every prefix in one batch.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        self.model = model.to(device) if device is not None else model
        self.device = next(self.model.parameters()).device
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_token_ids = _eos_token_ids(self.model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (self.eos_token_ids[0] if self.eos_token_ids else 0)
        self.weights_version = 0

    def _generate_rows(
        self,
        prefixes: Sequence[Sequence[int]],
        limits: Sequence[int],
        rows: Sequence[int],
        params: SamplingParams,
    ) -> list[Segment]:
        """Rows sorted by prefix length into batches of ``max_batch_size``; reproducible with
        ``params.seed`` (one generator for the whole call)."""
        by_length = sorted(rows, key=lambda i: len(prefixes[i]))
        size = self.max_batch_size or len(by_length)
        generator = self.generator(params.seed)
        made: dict[int, Segment] = {}
        with self.inference():
            for start in range(0, len(by_length), size):
                batch = by_length[start : start + size]
                outputs = self._generate_batch(
                    [prefixes[i] for i in batch], [limits[i] for i in batch], params, generator
                )
                made.update(zip(batch, outputs))
        return [made[i] for i in rows]

    def generator(self, seed: int | None) -> torch.Generator | None:
        """The call's random generator on the model's device, seeded with ``seed`` (None: torch's global)."""
        return None if seed is None else torch.Generator(device=self.device).manual_seed(seed)

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """Eval mode and no autograd for a call; the model's training mode is restored afterwards."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.model.train(was_training)

    def _generate_batch(
        self,
        prefixes: list[Sequence[int]],
        limits: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[Segment]:
        width = max(len(prefix) for prefix in prefixes)
        input_ids = torch.full((len(prefixes), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prefixes), width), dtype=torch.long)
        for row, prefix in enumerate(prefixes):
            input_ids[row, width - len(prefix) :] = torch.as_tensor(list(prefix), dtype=torch.long)
            attention_mask[row, width - len(prefix) :] = 1
        sampler = _Sampler(params.temperature, params.top_p, generator)
        config = GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=False,  # _Sampler draws the token; greedy selection then takes it
            # An empty list, not None: transformers fills None from the model's generation config.
            eos_token_id=[] if params.ignore_eos else (self.eos_token_ids or None),
            pad_token_id=self.pad_token_id,
            use_cache=True,
        )
        output = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([_RowStops(limits, width, self.tokenizer, params.stop)]),
        )
        new_tokens = output[:, width:].tolist()
        logprobs = torch.stack(sampler.logprobs, dim=1).tolist()
        segments = []
        eos_ids = () if params.ignore_eos else self.eos_token_ids
        for row, limit in enumerate(limits):
            ids = new_tokens[row][:limit]
            eos_at = next((k for k, token in enumerate(ids) if token in eos_ids), None)
            if eos_at is not None:
                ids = ids[: eos_at + 1]
            segments.append(
                finish_segment(ids, logprobs[row], self.tokenizer, params.stop, eos_at is not None)
            )
        return segments

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Any) -> None:
        """Copy tensors into the model in place, by the names of ``model.state_dict()``.

        A full state dict, or any part of one: the adapter weights of a peft model (``lora_state_dict``),
        or merged weights for a plain model (``merged_state_dict``), also packed as ``FlatWeights``.
        Unknown names raise ``KeyError``.
        """
        from rllib_search.llm.weight_sync import FlatWeights

        if isinstance(state_dict, FlatWeights):
            state_dict = state_dict.state_dict()
        targets = self.model.state_dict(keep_vars=True)
        unknown = [name for name in state_dict if name not in targets]
        if unknown:
            raise KeyError(f"{len(unknown)} names not in the engine's model, e.g. {unknown[:3]}")
        with torch.no_grad():
            for name, tensor in state_dict.items():
                targets[name].copy_(tensor)
        self.weights_version += 1


def _eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The EOS ids of the tokenizer and of the model's generation config, in that order, without repeats."""
    ids = [tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += configured if isinstance(configured, list) else [configured]
    return list(dict.fromkeys(i for i in ids if i is not None))


class _Sampler(LogitsProcessor):
    """Draw each row's next token and record its log-probability (see :class:`Segment`).

    Returns scores that are 0 at the drawn token and -inf elsewhere, so greedy selection takes the draw.
    """

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator | None) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.generator = generator
        self.logprobs: list[torch.Tensor] = []  # one (batch,) tensor per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens, logprobs = self.draw(scores)
        self.logprobs.append(logprobs)
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens[:, None], 0.0)

    def draw(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's token drawn from ``scores`` (batch, vocab) and its log-probability."""
        logits = scores.float()
        if self.temperature == 0:
            logp = torch.log_softmax(logits, dim=-1)
            tokens = logits.argmax(dim=-1)
        else:
            # Shifted so the best logit is 0, and the temperature at least fp32's smallest normal (1e-308 is 0
            # in fp32): the same distribution, and a tiny temperature gives 0 / -inf, not the NaN of
            # inf - inf or 0 / 0 (which multinomial refuses).
            shifted = logits - logits.max(dim=-1, keepdim=True).values
            temperature = max(float(self.temperature), torch.finfo(logits.dtype).tiny)
            logp = torch.log_softmax(shifted / temperature, dim=-1)
            if self.top_p < 1.0:
                logp = _nucleus(logp, self.top_p)
            tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def _nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= top_p
    # The most likely token always stays: a top_p below fp32's smallest value (1e-133) compares as 0.
    drop[:, 0] = False
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(torch.full_like(logp, float("-inf")).scatter(1, order, sorted_logp), dim=-1)


class _RowStops(StoppingCriteria):
    """Finish a row at its own token limit, or once its new text contains a stop string.

    Only the last few new tokens are decoded each step: enough to hold the longest stop string even if
    each character took four byte tokens. The exact cut is made afterwards by ``truncate_at_stop``.
    """

    def __init__(self, limits: list[int], prompt_width: int, tokenizer: Any, stop_strings: Sequence[str]):
        self.limits = torch.tensor(limits)
        self.prompt_width = prompt_width
        self.tokenizer = tokenizer
        self.stop_strings = [stop for stop in stop_strings if stop]
        self.window = 4 * max((len(stop) for stop in self.stop_strings), default=0) + 1

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_width
        done = self.limits <= generated
        if self.stop_strings:
            tails = input_ids[:, max(self.prompt_width, input_ids.shape[1] - self.window) :].tolist()
            done |= torch.tensor(
                [any(stop in decode(self.tokenizer, tail) for stop in self.stop_strings) for tail in tails]
            )
        return done.to(input_ids.device)
