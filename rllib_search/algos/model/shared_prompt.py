"""Shared-prompt forward: the episodes of a group share their prompt, so the decoder reads it once.

A GRPO batch holds ``group_size`` episodes per question, and the first ``prompt_length`` tokens of those
episodes are the same token ids. The plain forward runs the decoder over every row's whole sequence, so a
prompt of P tokens is processed G times: in the policy's forward and backward and in the reference's (and
critic's) forward. Here the decoder runs twice instead:

1. over the distinct prompts (U rows, right-padded to the longest), keeping their keys and values;
2. over every row's continuation (the rest of its sequence: generated and retrieved tokens, B rows), each
   attending to its own prompt's keys and values, picked row by row from step 1 with ``Cache.reorder_cache``
   (an ``index_select``: the gradient of a shared key is the sum over the rows that read it, as it is when
   each row recomputes it).

The hidden states are gathered back into the batch's own right-padded (B, T, H) layout, so the vocabulary
projection, the value head and every loss term are unchanged: the result is the same function of the
weights as the plain forward (tested to float tolerance for full fine-tuning, LoRA and a value head).
Positions past a row's end hold finite filler, as in the plain forward; no loss reads them.

Written here because neither transformers nor TRL trains over a shared prefix (TRL's GRPOTrainer repeats the
prompt per generation); the pieces are transformers' public ones: a decoder call with ``use_cache=True``
returning a ``DynamicCache``, ``reorder_cache``, and a decoder call with ``past_key_values``.

When it applies (:func:`supports`): a 2-D mask with padding between a prompt and its continuation needs an
attention that takes arbitrary masks (``sdpa`` or ``eager``, transformers' defaults on CPU and GPU; not
flash-attention's varlen kernels) and a cache of full-attention layers (no sliding window). Otherwise, or
when no two rows share a prompt, the caller runs the plain forward.

Under gradient checkpointing (:func:`hidden_states` picks): transformers drops the cache of a checkpointed
layer, so the two decoder calls above cannot checkpoint. For the decoders whose forward is transformers'
plain loop (Llama, Qwen2: :data:`LAYERED_MODEL_TYPES`) the same computation runs layer by layer instead
(:func:`layer_by_layer`): each decoder layer reads the prompts, keeps their keys and
values in a cache of its own, then reads the continuations, all inside one ``torch.utils.checkpoint``
call, so backward keeps only each layer's two inputs and recomputes the rest. Same operations, same
order: the same log-probs and gradients bit for bit, with the activation memory of checkpointing. Other
decoders run the two-call forward with checkpointing paused (:func:`checkpointing_paused`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import create_causal_mask

MASK_FRIENDLY_ATTENTION = ("sdpa", "eager")
# Decoders whose forward is embed -> rotary -> causal mask -> layers -> norm, as the layered forward runs it.
LAYERED_MODEL_TYPES = ("llama", "qwen2")


@dataclass(frozen=True)
class PromptGroups:
    """Rows grouped by identical prompts: ``prompt_rows`` (U,) one row holding each distinct prompt,
    ``group_of_row`` (B,) the index into ``prompt_rows`` of each row's prompt."""

    prompt_rows: np.ndarray
    group_of_row: np.ndarray

    @property
    def shares(self) -> bool:
        """Whether any two rows share a prompt (otherwise sharing saves nothing)."""
        return len(self.prompt_rows) < len(self.group_of_row)


def group_prompts(input_ids: np.ndarray, prompt_lengths: np.ndarray) -> PromptGroups:
    """Group the rows of ``input_ids`` (B, T) whose first ``prompt_lengths[b]`` token ids are identical
    (same length, same ids: the token ids are the truth, not the group labels of the sampler)."""
    first_row: dict[tuple[int, bytes], int] = {}
    prompt_rows: list[int] = []
    group_of_row = np.empty(len(input_ids), dtype=np.int64)
    for row, (ids, length) in enumerate(zip(input_ids, prompt_lengths, strict=True)):
        key = (int(length), np.ascontiguousarray(ids[: int(length)], dtype=np.int64).tobytes())
        if key not in first_row:
            first_row[key] = len(prompt_rows)
            prompt_rows.append(row)
        group_of_row[row] = first_row[key]
    return PromptGroups(np.asarray(prompt_rows, dtype=np.int64), group_of_row)


def supports(decoder: nn.Module) -> bool:
    """Whether :func:`hidden_states` is exact for ``decoder`` (see the module docstring)."""
    config = decoder.config.get_text_config()
    if getattr(config, "_attn_implementation", None) not in MASK_FRIENDLY_ATTENTION:
        return False
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


@contextlib.contextmanager
def checkpointing_paused(decoder: nn.Module) -> Iterator[None]:
    """``decoder``'s checkpointed layers run plainly inside the block (their own setting after it)."""
    checkpointed = [m for m in decoder.modules() if getattr(m, "gradient_checkpointing", False)]
    for module in checkpointed:
        module.gradient_checkpointing = False
    try:
        yield
    finally:
        for module in checkpointed:
            module.gradient_checkpointing = True


def is_checkpointed(decoder: nn.Module) -> bool:
    """Whether any of ``decoder``'s layers runs under gradient checkpointing."""
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


def hidden_states(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor,
    groups: PromptGroups,
) -> torch.Tensor:
    """Last-layer hidden states (B, T, H) of right-padded rows, each distinct prompt run once: layer by
    layer under checkpointing where the decoder allows it, else two decoder calls (see the module
    docstring)."""
    layout = prompt_layout(input_ids, attention_mask, prompt_lengths, groups)
    checkpointed = is_checkpointed(decoder) and decoder.training and torch.is_grad_enabled()
    if checkpointed and decoder.config.get_text_config().model_type in LAYERED_MODEL_TYPES:
        prompt, continuation = layer_by_layer(decoder, layout)
    else:
        with checkpointing_paused(decoder):
            prompt, continuation = two_decoder_calls(decoder, layout)
    return _batch_layout(prompt, continuation, layout, input_ids)


@dataclass(frozen=True)
class PromptLayout:
    """The two parts of a shared-prompt forward: the distinct prompts (U, P) and the rows' continuations
    (B, C), with their ids, 2-D masks (the continuation's over prompt then continuation) and positions."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_positions: torch.Tensor
    continuation_ids: torch.Tensor
    continuation_mask: torch.Tensor
    continuation_positions: torch.Tensor
    group_of_row: torch.Tensor
    prompt_lengths: torch.Tensor


def prompt_layout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: torch.Tensor, groups: PromptGroups
) -> PromptLayout:
    device = input_ids.device
    width = input_ids.shape[1]
    lengths = attention_mask.long().sum(-1)
    prompt_lengths = prompt_lengths.to(device=device, dtype=torch.long)
    prompt_rows = torch.as_tensor(groups.prompt_rows, device=device)
    group_of_row = torch.as_tensor(groups.group_of_row, device=device)
    # The distinct prompts, right-padded to the longest.
    unique_lengths = prompt_lengths[prompt_rows]
    prompt_width = int(unique_lengths.max())
    steps = torch.arange(prompt_width, device=device)
    prompt_mask = (steps[None, :] < unique_lengths[:, None]).long()
    # Every row's continuation at its own positions, attending to its prompt and then causally to itself.
    continuation_lengths = lengths - prompt_lengths
    offsets = torch.arange(max(1, int(continuation_lengths.max())), device=device)
    positions = prompt_lengths[:, None] + offsets[None, :]
    continuation_mask = (offsets[None, :] < continuation_lengths[:, None]).long()
    return PromptLayout(
        prompt_ids=input_ids[prompt_rows, :prompt_width],
        prompt_mask=prompt_mask,
        prompt_positions=steps[None, :].expand(len(prompt_rows), -1),
        continuation_ids=input_ids.gather(1, positions.clamp(max=width - 1)),
        continuation_mask=torch.cat([prompt_mask[group_of_row], continuation_mask], dim=1),
        continuation_positions=positions,
        group_of_row=group_of_row,
        prompt_lengths=prompt_lengths,
    )


def two_decoder_calls(decoder: nn.Module, layout: PromptLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-layer hidden states of the distinct prompts (U, P, H) and of the rows' continuations (B, C, H)
    in two decoder calls: the prompts (keeping their keys and values), then the continuations."""
    prompt_out = decoder(
        input_ids=layout.prompt_ids,
        attention_mask=layout.prompt_mask,
        position_ids=layout.prompt_positions,
        use_cache=True,
    )
    cache = prompt_out.past_key_values
    cache.reorder_cache(layout.group_of_row)  # (U, ...) -> (B, ...): each row reads its prompt's keys/values
    continuation_out = decoder(
        input_ids=layout.continuation_ids,
        attention_mask=layout.continuation_mask,
        position_ids=layout.continuation_positions,
        past_key_values=cache,
        use_cache=True,
    )
    return prompt_out.last_hidden_state, continuation_out.last_hidden_state


def layer_by_layer(decoder: nn.Module, layout: PromptLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`two_decoder_calls` computed layer by layer, each layer's prompt and continuation passes
    inside one activation checkpoint (for :data:`LAYERED_MODEL_TYPES`: transformers' own loop of their
    decoders, the embeddings, rotary embeddings and causal masks built as their forward builds them)."""
    config = decoder.config.get_text_config()
    prompt = decoder.embed_tokens(layout.prompt_ids)
    continuation = decoder.embed_tokens(layout.continuation_ids)
    prompt_mask = create_causal_mask(
        config=config,
        inputs_embeds=prompt,
        attention_mask=layout.prompt_mask,
        past_key_values=DynamicCache(config=config),
        position_ids=layout.prompt_positions,
    )
    continuation_mask = create_causal_mask(
        config=config,
        inputs_embeds=continuation,
        attention_mask=layout.continuation_mask,
        past_key_values=_cache_of_length(config, prompt, layout.prompt_ids.shape[1]),
        position_ids=layout.continuation_positions,
    )
    prompt_rotary = decoder.rotary_emb(prompt, position_ids=layout.prompt_positions)
    continuation_rotary = decoder.rotary_emb(continuation, position_ids=layout.continuation_positions)

    prompt_inputs = {
        "attention_mask": prompt_mask,
        "position_ids": layout.prompt_positions,
        "position_embeddings": prompt_rotary,
    }
    continuation_inputs = {
        "attention_mask": continuation_mask,
        "position_ids": layout.continuation_positions,
        "position_embeddings": continuation_rotary,
    }

    def layer_pass(layer: nn.Module, prompt: torch.Tensor, continuation: torch.Tensor) -> tuple[Any, Any]:
        cache = DynamicCache(config=config)  # this layer's prompt keys and values, read by the continuations
        with checkpointing_paused(layer):
            prompt = layer(prompt, past_key_values=cache, use_cache=True, **prompt_inputs)
            cache.reorder_cache(layout.group_of_row)
            continuation = layer(continuation, past_key_values=cache, use_cache=True, **continuation_inputs)
        return prompt, continuation

    for layer in decoder.layers[: config.num_hidden_layers]:
        prompt, continuation = checkpoint(layer_pass, layer, prompt, continuation, use_reentrant=False)
    return decoder.norm(prompt), decoder.norm(continuation)


def _cache_of_length(config: Any, like: torch.Tensor, length: int) -> DynamicCache:
    """A placeholder cache that reports ``length`` past positions: what ``create_causal_mask`` reads of the
    continuation pass's cache (its keys' length), with keys of one head of width one."""
    cache = DynamicCache(config=config)
    placeholder = like.new_zeros(like.shape[0], 1, length, 1)
    cache.update(placeholder, placeholder, 0)
    return cache


def _batch_layout(
    prompt_hidden: torch.Tensor,
    continuation_hidden: torch.Tensor,
    layout: PromptLayout,
    input_ids: torch.Tensor,
) -> torch.Tensor:
    """Back to the batch's (B, T, H) layout: position t of row b reads its prompt's state (t < P_b) or its
    continuation's."""
    device = input_ids.device
    rows, width = input_ids.shape
    prompt_lengths, group_of_row = layout.prompt_lengths, layout.group_of_row
    prompt_width, continuation_width = prompt_hidden.shape[1], continuation_hidden.shape[1]
    hidden_size = prompt_hidden.shape[-1]
    source = torch.cat([prompt_hidden.reshape(-1, hidden_size), continuation_hidden.reshape(-1, hidden_size)])
    t = torch.arange(width, device=device)[None, :]
    in_prompt = t < prompt_lengths[:, None]
    from_prompt = group_of_row[:, None] * prompt_width + t.clamp(max=prompt_width - 1)
    row_start = torch.arange(rows, device=device)[:, None] * continuation_width
    row_start = row_start + prompt_hidden.shape[0] * prompt_width
    step = (t - prompt_lengths[:, None]).clamp(0, continuation_width - 1)
    from_continuation = row_start + step
    return source[torch.where(in_prompt, from_prompt, from_continuation)]


def computed_positions(
    lengths: np.ndarray, prompt_lengths: np.ndarray, groups: PromptGroups | None
) -> tuple[int, int]:
    """(positions the decoder computes, of which real tokens) for one forward of these rows: padded to the
    longest row when ``groups`` is None, else the distinct prompts padded to the longest prompt plus the
    continuations padded to the longest continuation."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if groups is None:
        return int(len(lengths) * lengths.max()), int(lengths.sum())
    prompts = np.asarray(prompt_lengths, dtype=np.int64)
    unique = prompts[groups.prompt_rows]
    continuations = lengths - prompts
    computed = len(unique) * int(unique.max()) + len(lengths) * max(1, int(continuations.max()))
    return computed, int(unique.sum() + continuations.sum())
