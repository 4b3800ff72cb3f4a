"""LLMRLModule: a Hugging Face causal LM as an RLlib ``TorchRLModule`` (with an optional value head).

The learner sees token sequences, never one token per env step: ``_forward_train`` takes padded token
ids and returns, for every position t, the log-probability of token t+1 given tokens <= t (and the entropy
of that next-token distribution), plus one value per position when the module has a value head (PPO).
Generation does not go through this module's forward: the rollout's engine (``llm/engines``) samples, and
on the CPU path the HF engine shares this module's model, so a weight update is visible to it at once.

Memory: the vocabulary projection is computed in chunks of positions under activation checkpointing, so
float32 logits of the whole batch over the whole vocabulary never exist at once, not even for backward.
Compute: a batch may carry ``score_mask`` (B, T-1), the positions whose next token the loss uses (the
generated tokens); only those go through the vocabulary projection, the others read 0. In a search
episode most positions are prompt and retrieved text, so this skips most of the projection and softmax.

``model_config`` keys (defaults in :data:`DEFAULT_MODEL_CONFIG`): ``model`` (hub name, local path or
bundled alias), ``dtype`` (default float32: the learner's weights are the fp32 master weights, and bf16
compute comes from the learner's autocast; an EnvRunner's HF inference copy on a GPU loads in bf16),
``device`` (default: the GPU when there is one), ``gradient_checkpointing`` (the plain forward's decoder
layers recompute their activations in backward: the same gradients, about half the activation memory;
batches that share prompts checkpoint layer by layer, see ``shared_prompt.py``),
``lora`` (None, or ``apply_lora`` keyword arguments: only the adapters train and sync),
``train_top_layers`` (None, or N: only the top N blocks and the final norm train; see ``train_top_layers``
in ``llm/models.py``), ``value_head``,
``logprob_chunk`` (positions per chunk of the vocabulary projection, over the whole micro-batch: the
chunk's float32 logits and their softmax, about 18 bytes per position per vocabulary entry, are the
update's largest transient), ``share_prompts`` (default True:
when a batch carries ``prompt_lengths`` and rows share a prompt, the decoder reads each distinct prompt once;
see ``shared_prompt.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn
from torch.utils.checkpoint import checkpoint

from rllib_search.algos.model import shared_prompt
from rllib_search.llm.models import apply_lora, load_causal_lm, train_top_layers

DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "dtype": None,
    "device": None,
    "gradient_checkpointing": False,
    "lora": None,
    "train_top_layers": None,
    "value_head": False,
    "logprob_chunk": 512,
    "share_prompts": True,
}


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The transformer stack and the vocabulary projection of a (possibly peft-wrapped) causal LM."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return causal_lm.get_decoder(), causal_lm.get_output_embeddings()


def _token_logprobs_and_entropy(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    logp = torch.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


class LLMRLModule(TorchRLModule, ValueFunctionAPI):
    """A causal LM policy over token sequences; see the module docstring for ``model_config``."""

    def setup(self) -> None:
        config = {**DEFAULT_MODEL_CONFIG, **(self.model_config or {})}
        self.llm_config = config
        model, self.tokenizer = load_causal_lm(
            config["model"],
            device=config["device"],
            dtype=config["dtype"] or torch.float32,
            gradient_checkpointing=config["gradient_checkpointing"],
        )
        if config["train_top_layers"] is not None:
            if config["lora"] is not None:
                raise ValueError(
                    "train_top_layers and lora are exclusive: LoRA already freezes the base model"
                )
            model = train_top_layers(model, int(config["train_top_layers"]))
        if config["lora"] is not None:
            model = apply_lora(model, **config["lora"])
        self.model = model
        self.value_head = None
        if config["value_head"]:
            hidden_size = model.config.get_text_config().hidden_size
            self.value_head = nn.Linear(hidden_size, 1, device=model.device, dtype=torch.float32)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    @property
    def uses_lora(self) -> bool:
        return self.llm_config["lora"] is not None

    # --- forward passes ---------------------------------------------------------------------------------
    def hidden_states(self, batch: dict[str, Any], model: nn.Module | None = None) -> torch.Tensor:
        """Last-layer hidden states (B, T, H) of ``batch["input_ids"]`` under ``batch["attention_mask"]``
        (of ``model``, by default this module's)."""
        model = model if model is not None else self.model
        decoder, _ = _decoder_and_head(model)
        attention_mask = batch["attention_mask"]
        groups = self.prompt_groups(batch, model)
        if groups is not None:
            return shared_prompt.hidden_states(
                decoder, batch["input_ids"], attention_mask, batch["prompt_lengths"], groups
            )
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = decoder(
            input_ids=batch["input_ids"],
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,  # one pass over whole sequences: no keys and values to keep
        )
        return out.last_hidden_state

    def prompt_groups(self, batch: dict[str, Any], model: nn.Module) -> shared_prompt.PromptGroups | None:
        """The rows' shared prompts when the shared-prompt forward applies to this batch and ``model``
        (``share_prompts`` on, ``prompt_lengths`` in the batch, two rows sharing a prompt), else None."""
        if not self.llm_config["share_prompts"] or "prompt_lengths" not in batch:
            return None
        if not shared_prompt.supports(_decoder_and_head(model)[0]):
            return None
        groups = shared_prompt.group_prompts(
            batch["input_ids"].detach().cpu().numpy(), batch["prompt_lengths"].detach().cpu().numpy()
        )
        return groups if groups.shares else None

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        """Per position t: ``logprobs``/``entropy`` of token t+1 (B, T-1); ``values`` (B, T) if any."""
        hidden = self.hidden_states(batch)
        logprobs, entropy = self.token_logprobs(
            hidden, batch["input_ids"], score_mask=batch.get("score_mask")
        )
        out = {"logprobs": logprobs, "entropy": entropy}
        if self.value_head is not None:
            out["values"] = self.compute_values(batch, embeddings=hidden)
        return out

    def token_logprobs(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        model: nn.Module | None = None,
        score_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of each next token (B, T-1), ``logprob_chunk`` positions of the
        batch projected at a time; with ``score_mask`` only the masked positions (0 elsewhere)."""
        _, head = _decoder_and_head(model if model is not None else self.model)
        hidden, targets = hidden[:, :-1], input_ids[:, 1:]
        where = score_mask.bool() if score_mask is not None else torch.ones_like(targets, dtype=torch.bool)
        flat_logp, flat_entropy = self._chunked(head, hidden[where], targets[where])
        logprobs = hidden.new_zeros(targets.shape, dtype=torch.float32).index_put((where,), flat_logp)
        entropy = hidden.new_zeros(targets.shape, dtype=torch.float32).index_put((where,), flat_entropy)
        return logprobs, entropy

    def _chunked(
        self, head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of flat (N, H) hidden states, ``logprob_chunk`` positions at a time (a
        position's result does not depend on the chunk it is in)."""
        chunk = max(1, int(self.llm_config["logprob_chunk"]))
        pieces = []
        for start in range(0, hidden.shape[0], chunk):
            h, t = hidden[start : start + chunk], targets[start : start + chunk]
            if torch.is_grad_enabled():  # recompute the chunk's logits in backward instead of keeping them
                pieces.append(checkpoint(_token_logprobs_and_entropy, head, h, t, use_reentrant=False))
            else:
                pieces.append(_token_logprobs_and_entropy(head, h, t))
        if not pieces:
            empty = hidden.new_zeros(0, dtype=torch.float32)
            return empty, empty
        return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])

    def sequence_logprobs(self, batch: dict[str, Any], model: nn.Module | None = None) -> torch.Tensor:
        """(B, T-1) log-probabilities of each next token under ``model`` (a frozen reference, say), which
        must share this module's tokenizer; by default this module's own model."""
        hidden = self.hidden_states(batch, model)
        return self.token_logprobs(hidden, batch["input_ids"], model, batch.get("score_mask"))[0]

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """One value per position (B, T) from the value head."""
        if self.value_head is None:
            raise ValueError("this LLMRLModule has no value head (model_config['value_head'] = False)")
        hidden = embeddings if embeddings is not None else self.hidden_states(batch)
        return self.value_head(hidden.float()).float().squeeze(-1)

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        """Next-token logits at each row's last position (generation itself goes through an engine)."""
        hidden = self.hidden_states(batch)
        _, head = _decoder_and_head(self.model)
        last = batch["attention_mask"].long().sum(-1) - 1
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return {"action_dist_inputs": head(hidden[rows, last]).float()}

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        return self._forward_inference(batch, **kwargs)

    # --- state: with LoRA, only what trains ---------------------------------------------------------
    def get_state(self, *args: Any, inference_only: bool = False, **kwargs: Any) -> dict[str, Any]:
        """Module weights. With LoRA only the trainable tensors (adapters, value head): the frozen base
        model is rebuilt from ``model_config["model"]``, so syncs and checkpoints stay small."""
        if not self.uses_lora:
            return super().get_state(*args, inference_only=inference_only, **kwargs)
        return {name: p.detach().cpu() for name, p in self.named_parameters() if p.requires_grad}

    def set_state(self, state: dict[str, Any]) -> None:
        if not self.uses_lora:
            super().set_state(state)
            return
        params = dict(self.named_parameters())
        unknown = [name for name in state if name not in params]
        if unknown:
            raise KeyError(f"state has tensors this module does not: {unknown[:5]}")
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(torch.as_tensor(value, device=params[name].device))
