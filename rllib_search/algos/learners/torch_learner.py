"""SearchTorchLearner: the torch half of :class:`~rllib_search.algos.learners.search_learner.SearchLearner`.

It runs on RLlib's own update path; what it adds sits in RLlib's documented override points:

- ``_update`` (per mini-batch) cuts the mini-batch into micro-batches (``micro_batch_size`` episodes, each
  cut to its longest row, ``score_mask`` added so that only loss positions reach the vocabulary
  projection) and hands each to ``TorchLearner._update``: RLlib's forward, ``compute_losses``,
  ``compute_gradients``, ``postprocess_gradients`` and ``apply_gradients``, compiled when
  ``torch_compile_learner`` asks for it.
- ``compute_loss_for_module``: the masked loss (see :mod:`rllib_search.algos.learners.losses`).
- ``compute_gradients``: gradient accumulation. Grads are zeroed on the first micro-batch only; each
  micro-batch's loss is weighted by its share of the mini-batch (``batching.micro_batch_weights``), so the
  accumulated gradient is the whole mini-batch's; under DDP only the last micro-batch all-reduces
  (``no_sync``); RLlib's AMP grad scaler (``_torch_grad_scaler_class``) scales each micro-batch's loss.
  Gradients are returned on the last micro-batch only.
- ``postprocess_gradients`` (clipping) and ``apply_gradients`` act on the last micro-batch only.
  After the step the gradients are freed (``zero_grad(set_to_none=True)``), not held until the next
  update. ``apply_gradients`` guards the step: a non-finite loss or gradient skips it (zeroed grads, Adam
  moments untouched) and counts it in ``skipped_updates``; otherwise it writes the warmup learning rate
  into every param group and lets RLlib's ``apply_gradients`` step the optimizers.
- ``configure_optimizers_for_module``: AdamW for the policy's trainable weights and another at
  ``critic_lr`` for a value head, registered explicitly (RLlib gives no optimizer to a module lacking a
  learner's required APIs) and without an RLlib lr schedule (the warmup is the one writer).

Reference model: a frozen copy of the initial policy held by this learner (on its device), or with LoRA
the same model with its adapters switched off (no copy). Under bf16 autocast the copy's Linear weights are
stored in bf16, as autocast reads them (``llm.models.linears_in_autocast_dtype``: the same bits, half the
memory). It is built from ``model_config["model"]``, so a
run that starts from a warm-started export uses that export as reference.

Precision (mixed, as torch AMP): the trainable weights and so AdamW's moments are float32 master weights on
every device (the module loads in fp32; ``optimizer_groups`` refuses anything else, since at Search-R1's lr
of 1e-6 an update to a bf16 weight of magnitude 1e-2 is under half its ulp and rounds away); each
micro-batch's forward and backward run under bf16 autocast on GPU (``autocast``: None = on GPU only, True,
False); log-probs, entropies and values are float32. Sharded learners (``fsdp.py``) keep the same fp32
masters and gather bf16 copies of them for compute.

Weights for a vLLM EnvRunner (``get_state(inference_only=True)`` with ``engine="vllm"``): one
:class:`~rllib_search.llm.weight_sync.FlatWeights` of the plain model's own parameter names (LoRA merged),
in the engine's dtype, instead of the module's state dict (see ``inference_weights``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import tree
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.numpy import convert_to_numpy

from rllib_search.algos.learners.batching import micro_batch_weights, micro_batches
from rllib_search.algos.learners.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    contiguous_actions,
    kl_estimate,
    llds_penalty,
    masked_mean,
    sequence_policy_loss,
)
from rllib_search.algos.learners.search_learner import CRITIC_OPTIMIZER, POLICY_OPTIMIZER, SearchLearner
from rllib_search.algos.model.shared_prompt import computed_positions
from rllib_search.llm.models import linears_in_autocast_dtype

logger = logging.getLogger(__name__)


@dataclass
class Accumulation:
    """The micro-batches of the mini-batch being trained: their loss weights and what they summed."""

    weights: list[float]
    index: int = 0
    loss: torch.Tensor | float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == len(self.weights) - 1

    @property
    def weight(self) -> float:
        return self.weights[self.index]


class SearchTorchLearner(SearchLearner, TorchLearner):
    """Masked policy-gradient (or SFT) loss for
    :class:`~rllib_search.algos.model.rl_module.LLMRLModule`."""

    @override(TorchLearner)
    def build(self) -> None:
        self.accumulation = Accumulation(weights=[1.0])
        self.keep_first_moments = True  # retune_optimizer(momentum=False) clears them before each step
        self.reference: torch.nn.Module | None = None
        self._reference_built = False
        super().build()
        self.build_reference()
        self.write_learning_rates()
        self.build_disk_offload()

    def build_disk_offload(self) -> None:
        """With ``disk_offload`` (a CPU learner): the reference and AdamW's moments in a file between their
        uses (``learners/disk_offload.py``); the reference goes there now."""
        from rllib_search.algos.learners.disk_offload import (
            DiskOffload,
            optimizer_state_slots,
            parameter_slots,
        )

        self.reference_offload: DiskOffload | None = None
        self.moments_offload: DiskOffload | None = None
        if not self.config.disk_offload:
            return
        if self.device.type != "cpu":
            raise ValueError(f"disk_offload is for CPU learners; this one runs on {self.device}")
        self.moments_offload = DiskOffload(lambda: optimizer_state_slots(self._named_optimizers.values()))
        if self.reference is not None:
            reference = self.reference
            self.reference_offload = DiskOffload(lambda: parameter_slots(reference), frozen=True)
            self.reference_offload.offload()

    def reference_in_memory(self) -> contextlib.AbstractContextManager[None]:
        """The frozen reference in memory for the block (read back from its file with ``disk_offload``)."""
        return self.reference_offload.loaded() if self.reference_offload else contextlib.nullcontext()

    def moments_in_memory(self) -> None:
        """AdamW's moments in memory (read back from their file with ``disk_offload``) until
        :meth:`offload_moments`."""
        if self.moments_offload is not None:
            self.moments_offload.load()

    def offload_moments(self) -> None:
        """AdamW's moments to their file (with ``disk_offload``) until the next step reads them."""
        if self.moments_offload is not None:
            self.moments_offload.offload()

    def policy(self) -> Any:
        """The unwrapped LLMRLModule (DDP wraps it when there are several learners)."""
        return self.module[DEFAULT_MODULE_ID].unwrapped()

    def colocation(self, phase: str) -> None:
        """``"offload"``: weights, gradients and optimizer state off the GPU a colocated EnvRunner shares;
        ``"onload"``: back for the update (``learners/offload.py``)."""
        from rllib_search.algos.learners.offload import colocation_phase

        colocation_phase(self, phase)

    def build_reference(self) -> None:
        """The frozen reference policy for the KL term (idempotent; see the module docstring)."""
        if self._reference_built:
            return
        self._reference_built = True
        if self.config.kl_coeff > 0 and self.config.advantage_estimator != "sft":
            policy = self.policy()
            if not policy.uses_lora:  # with LoRA the reference is the base model, adapters off
                self.reference = copy.deepcopy(policy.model).eval().requires_grad_(False)
                if self.reference_in_bf16():  # it only runs under autocast: its products' weights in bf16
                    linears_in_autocast_dtype(self.reference, torch.bfloat16)

    def reference_in_bf16(self) -> bool:
        """Whether the reference's Linear weights are stored in bf16: under autocast, whose products read
        them in bf16 anyway (the same bits, half their memory)."""
        return self.autocast_enabled()

    # --- weights for the EnvRunners -------------------------------------------------------------------
    @override(SearchLearner)
    def get_state(
        self,
        components: Any = None,
        *,
        not_components: Any = None,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """RLlib's state; for a vLLM EnvRunner (``inference_only`` and ``engine="vllm"``: every weight sync,
        restore and runner recovery goes through here) the module's part is :meth:`inference_weights`."""
        vllm = inference_only and self.config.engine == "vllm"
        if vllm and self._check_component(COMPONENT_RL_MODULE, components, not_components):
            skip = [not_components] if isinstance(not_components, str) else list(not_components or [])
            state = super().get_state(
                components, not_components=[*skip, COMPONENT_RL_MODULE], inference_only=True, **kwargs
            )
            state[COMPONENT_RL_MODULE] = {DEFAULT_MODULE_ID: self.inference_weights()}
            return state
        return super().get_state(
            components, not_components=not_components, inference_only=inference_only, **kwargs
        )

    def inference_weights(self) -> Any:
        """The policy as vLLM loads it: the plain model's own parameter names (LoRA merged, no value head),
        cast to the engine's dtype and packed into one buffer (``llm/weight_sync.py`` says why)."""
        from rllib_search.llm.models import engine_weights
        from rllib_search.llm.weight_sync import engine_dtype_of

        with torch.no_grad():
            return engine_weights(self.policy().model, engine_dtype_of(self.config))

    @override(TorchLearner)
    def _get_optimizer_state(self) -> dict[str, Any]:
        """RLlib's optimizer state without its copy: RLlib's ``convert_to_numpy`` copies every float32
        moment into a new float32 array (``astype``), a second AdamW state (1 GB for SmolLM2) held while a
        checkpoint is written. Float32 state in host memory comes as numpy views of the live tensors,
        which a checkpoint writes before the next step changes them; the rest as RLlib converts it."""

        self.moments_in_memory()  # with disk_offload they stay in memory until the next step offloads them

        def to_numpy(value: Any) -> Any:
            host = isinstance(value, torch.Tensor) and value.device.type == "cpu"
            if host and value.dim() and value.dtype == torch.float32:
                return value.detach().numpy()
            return convert_to_numpy(value)

        return {
            name: {
                "module_id": self._optimizer_name_to_module[name],
                "state": tree.map_structure(to_numpy, optimizer.state_dict()),
            }
            for name, optimizer in self._named_optimizers.items()
        }

    @override(TorchLearner)
    def _set_optimizer_state(self, state: dict[str, Any]) -> None:
        if self.moments_offload is not None:  # the loaded state replaces the offloaded moments
            self.moments_offload.discard()
        super()._set_optimizer_state(state)

    # --- optimizers and the learning rate -------------------------------------------------------------
    def optimizer_groups(self, module: Any) -> list[tuple[str, list[torch.Tensor], float]]:
        """(name, parameters, base lr) of the policy's trainable weights and of the value head, if any."""
        critic = list(module.value_head.parameters()) if module.value_head is not None else []
        critic_ids = {id(p) for p in critic}
        policy = [p for p in self.get_parameters(module) if p.requires_grad and id(p) not in critic_ids]
        low = sorted({str(p.dtype) for p in policy + critic if p.dtype != torch.float32})
        if low:
            raise ValueError(
                f"trainable weights in {low}: the learner keeps float32 master weights (bf16 compute comes "
                "from autocast, or from FSDP's bf16 gathers); leave model_config['dtype'] unset"
            )
        groups = [(POLICY_OPTIMIZER, policy, float(self.config.lr))]
        if critic:
            groups.append((CRITIC_OPTIMIZER, critic, float(self.config.critic_lr)))
        return groups

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        """One AdamW per group of :meth:`optimizer_groups`; each param group keeps its ``base_lr``."""
        module = self.module[module_id].unwrapped()
        for name, params, lr in self.optimizer_groups(module):
            optimizer = torch.optim.AdamW(
                [{"params": params, "lr": lr, "base_lr": lr}], weight_decay=float(self.config.weight_decay)
            )
            self.register_optimizer(
                module_id=module_id, optimizer_name=name, optimizer=optimizer, params=params
            )

    def param_groups(self) -> list[dict[str, Any]]:
        """Every param group of every registered optimizer."""
        return [group for _, optimizer in self.optimizers() for group in optimizer.param_groups]

    def retune_optimizer(self, lr: float | None = None, momentum: bool = True) -> None:
        """Every param group's ``base_lr`` set to ``lr`` (None: unchanged). ``momentum=False`` clears
        AdamW's first moments before each later step, so a step follows its own gradient (scaled by the
        second moments gathered so far) rather than the steps before it: a short phase that pulls a few
        probabilities toward targets then settles near them instead of overshooting."""
        if lr is not None:
            for group in self.param_groups():
                group["base_lr"] = float(lr)
        self.keep_first_moments = momentum

    def clear_first_moments(self) -> None:
        """Zero AdamW's running mean of the gradients (its second moments stay)."""
        for _, optimizer in self.optimizers():
            for state in optimizer.state.values():
                if "exp_avg" in state:
                    state["exp_avg"].zero_()

    def write_learning_rates(self) -> float:
        """The one learning-rate writer: each param group at its ``base_lr`` times the warmup factor."""
        factor = self.learning_rate_factor()
        for group in self.param_groups():
            group["lr"] = group["base_lr"] * factor
        return factor

    # --- preparation (no gradients) -----------------------------------------------------------------
    def autocast_enabled(self) -> bool:
        """bf16 autocast: on by default on GPU (``autocast=None``), off on CPU unless asked for."""
        enabled = self.config.autocast
        return bool(self.device.type == "cuda" if enabled is None else enabled)

    def autocast(self) -> Any:
        """The forward passes' bf16 autocast context (see :meth:`autocast_enabled`)."""
        return torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16, enabled=self.autocast_enabled()
        )

    @override(SearchLearner)
    @torch.no_grad()
    def score_batch(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.reference_in_memory():
            return self._score_batch(columns)

    def _score_batch(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cfg, policy = self.config, self.policy()
        recompute = cfg.old_logprobs == "recompute" or not cfg.mask_retrieved_tokens
        mask_key = self.loss_mask_key()
        width = columns["loss_mask"].shape[1]
        rows_total = columns["loss_mask"].shape[0]
        wanted: dict[str, np.ndarray] = {}
        tensors = {k: torch.as_tensor(v) for k, v in columns.items()}
        for index, rows in micro_batches(tensors, cfg.micro_batch_size):
            chunk = {k: v.to(self.device) for k, v in rows.items()}
            chunk["score_mask"] = chunk[mask_key] > 0
            pieces: dict[str, torch.Tensor] = {}
            with self.autocast():
                if cfg.kl_coeff > 0:
                    pieces["ref_logprobs"] = self.reference_logprobs(chunk)
                if recompute or policy.value_head is not None:
                    out = self.policy_forward(chunk)
                    if recompute:
                        pieces["old_logprobs"] = out["logprobs"]
                    if policy.value_head is not None:
                        pieces["old_values"] = out["values"][:, :-1]
            for key, value in pieces.items():
                full = wanted.setdefault(key, np.zeros((rows_total, width), dtype=np.float32))
                full[index, : value.shape[1]] = value.float().cpu().numpy()
        return wanted

    def policy_forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The policy's training forward pass on ``batch`` outside RLlib's update (scoring)."""
        return self.policy().forward_train(batch)

    def reference_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, T-1) log-probs of the batch's next tokens under the frozen reference policy."""
        policy = self.policy()
        if self.reference is not None:
            return policy.sequence_logprobs(batch, self.reference)
        with policy.model.disable_adapter():
            return policy.sequence_logprobs(batch)

    @override(SearchLearner)
    def token_kl(self, logprobs: np.ndarray, ref_logprobs: np.ndarray) -> np.ndarray:
        kl = kl_estimate(torch.as_tensor(logprobs), torch.as_tensor(ref_logprobs), self.config.kl_estimator)
        return kl.double().numpy()

    @override(SearchLearner)
    def reduce_sums(self, sums: np.ndarray) -> np.ndarray:
        if not (self.distributed and torch.distributed.is_initialized()):
            return sums
        tensor = torch.as_tensor(sums, dtype=torch.float64)
        torch.distributed.all_reduce(tensor)
        return tensor.numpy()

    # --- one mini-batch: micro-batches through RLlib's update step ------------------------------------
    @override(TorchLearner)
    def _update(self, batch: dict[str, Any]) -> tuple[Any, Any, Any]:
        mask_key = self.loss_mask_key()
        columns = dict(batch[DEFAULT_MODULE_ID])
        micros = [micro for _, micro in micro_batches(columns, self.config.micro_batch_size)]
        weights = micro_batch_weights([m[mask_key] for m in micros], self.config.loss_aggregation)
        self.accumulation = Accumulation(weights=weights)
        self.log_padding(micros)
        fwd_out: Any = None
        for index, micro in enumerate(micros):
            self.accumulation.index = index
            micro = {**micro, "score_mask": micro[mask_key] > 0}
            with self.autocast():
                fwd_out, _, _ = super()._update({DEFAULT_MODULE_ID: micro})
        return fwd_out, {DEFAULT_MODULE_ID: self.accumulation.loss}, {}

    def log_padding(self, micros: list[dict[str, Any]]) -> None:
        """``padding_fraction``: the share of the positions the decoder computes for these micro-batches
        that are padding (each distinct prompt counted once where prompts are shared); and
        ``shared_prompt_savings``: the share of the plain forward's positions that sharing skipped."""
        policy = self.policy()
        computed = real = plain = 0
        for micro in micros:
            lengths = micro["attention_mask"].sum(-1).cpu().numpy()
            prompts = micro["prompt_lengths"].cpu().numpy() if "prompt_lengths" in micro else lengths
            groups = policy.prompt_groups(micro, policy.model)
            positions, tokens = computed_positions(lengths, prompts, groups)
            computed, real = computed + positions, real + tokens
            plain += computed_positions(lengths, prompts, None)[0]
        key = DEFAULT_MODULE_ID
        self.metrics.log_value((key, "padding_fraction"), 1.0 - real / max(computed, 1), window=1)
        self.metrics.log_value((key, "shared_prompt_savings"), 1.0 - computed / max(plain, 1), window=1)

    @override(TorchLearner)
    def compute_loss_for_module(
        self, *, module_id: str, config: Any = None, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        loss, stats = self.masked_loss(batch, fwd_out)
        step = self.accumulation
        step.loss = step.loss + loss.detach() * step.weight
        for key, value in stats.items():
            step.stats[key] = step.stats.get(key, 0.0) + float(value) * step.weight
        return loss

    def masked_loss(
        self, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The total loss of one micro-batch and its components: clipped surrogate + ``llds_coeff`` * LLDS
        + ``kl_coeff`` * KL (when the KL is in the loss) - ``entropy_coeff`` * entropy + ``vf_loss_coeff``
        * clipped value loss, or the masked NLL for SFT; every term under the loss mask. The NLL terms (SFT,
        PPO-ptx) weight each token by ``nll_weights`` where the batch has them (decision tokens of
        demonstrations)."""
        cfg = self.config
        agg = cfg.loss_aggregation
        norm = cfg.response_token_budget() if agg == "constant" else None  # Dr. GRPO's one normaliser
        logprobs = fwd_out["logprobs"]
        nll = -logprobs * batch["nll_weights"] if "nll_weights" in batch else -logprobs
        if cfg.advantage_estimator == "sft":
            mask = batch[self.loss_mask_key()]
            loss = masked_mean(nll, mask, agg, norm)
            entropy = masked_mean(fwd_out["entropy"].detach(), mask, "token")
            return loss, {"sft_nll": loss.detach(), "entropy": entropy}
        mask, ptx_mask = self.split_ptx(batch)
        entropy = masked_mean(fwd_out["entropy"].detach(), mask, "token")
        policy_loss, stats = self.policy_loss(logprobs, batch, mask)
        stats = {"policy_loss": policy_loss.detach(), "entropy": entropy, **stats}
        loss = policy_loss
        if cfg.llds_coeff > 0:
            penalty, llds_stats = self.llds_term(logprobs, batch, mask)
            stats.update(llds_penalty=penalty.detach(), **llds_stats)
            loss = loss + cfg.llds_coeff * penalty
        else:  # the share of displaced actions is a collapse monitor whether LLDS acts on it or not
            with torch.no_grad():
                _, llds_stats = self.llds_term(logprobs.detach(), batch, mask)
            stats["llds_displaced_actions"] = llds_stats["llds_displaced_actions"]
        if "ref_logprobs" in batch:
            token_kl = kl_estimate(logprobs, batch["ref_logprobs"], cfg.kl_estimator)
            kl = masked_mean(token_kl, mask, agg, norm)
            stats["kl"] = kl.detach()
            if not cfg.kl_in_reward:
                loss = loss + cfg.kl_coeff * kl
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * masked_mean(fwd_out["entropy"], mask, agg, norm)
        if "returns" in batch:
            values = fwd_out["values"][:, :-1]
            value_loss = clipped_value_loss(
                values, batch["old_values"], batch["returns"], mask, cfg.vf_clip_param, agg, norm
            )
            stats["value_loss"] = value_loss.detach()
            loss = loss + cfg.vf_loss_coeff * value_loss
        if ptx_mask is not None:
            ptx_nll = masked_mean(nll, ptx_mask, agg, norm)
            stats["ptx_nll"] = ptx_nll.detach()
            loss = loss + cfg.ptx_coeff * ptx_nll
        return loss, stats

    def llds_term(
        self, logprobs: torch.Tensor, batch: dict[str, Any], mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """LLDS's penalty (``losses.llds_penalty``, before ``llds_coeff``) with the model's turns as actions
        (``turn_index``; runs of generated tokens where the batch has none), or each response as one
        action (``llds_gate="response"``); under ``loss_aggregation`` like the surrogate."""
        cfg = self.config
        generated = batch["loss_mask"] > 0
        if cfg.llds_gate == "response":
            actions = generated.long()
        elif "turn_index" in batch:
            actions = batch["turn_index"].long() * generated
        else:
            actions = contiguous_actions(generated)
        normaliser = cfg.response_token_budget() if cfg.loss_aggregation == "constant" else None
        old, advantages = batch["old_logprobs"], batch["advantages"]
        return llds_penalty(logprobs, old, advantages, mask, actions, cfg.loss_aggregation, normaliser)

    def policy_loss(
        self, logprobs: torch.Tensor, batch: dict[str, Any], mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The configured surrogate (``training(policy_loss=...)``): GSPO's sequence ratios, or per-token
        ratios clipped at [1 - ``clip_param``, 1 + ``clip_param_high``] under ``loss_aggregation``."""
        cfg = self.config
        old, advantages = batch["old_logprobs"], batch["advantages"]
        if cfg.policy_loss == "gspo":
            return sequence_policy_loss(logprobs, old, advantages, mask, cfg.clip_param, cfg.clip_param_high)
        normaliser = cfg.response_token_budget() if cfg.loss_aggregation == "constant" else None
        return clipped_policy_loss(
            logprobs,
            old,
            advantages,
            mask,
            cfg.clip_param,
            cfg.loss_aggregation,
            cfg.clip_param_high,
            normaliser,
        )

    # --- gradient accumulation ------------------------------------------------------------------------
    def optimizers(self) -> list[tuple[str, Any]]:
        """(name, optimizer) of every module, through RLlib's public accessor."""
        module_ids = list(self.module.keys())
        return [pair for mid in module_ids for pair in self.get_optimizers_for_module(mid)]

    def zero_grads(self) -> None:
        for _, optimizer in self.optimizers():
            optimizer.zero_grad(set_to_none=True)

    def no_sync(self) -> Any:
        """DDP's ``no_sync`` for every wrapped module before the last micro-batch; a no-op otherwise."""
        stack = contextlib.ExitStack()
        if self.distributed and not self.accumulation.last:
            for module in self.module.values():
                if isinstance(module, torch.nn.parallel.DistributedDataParallel):
                    stack.enter_context(module.no_sync())
        return stack

    @override(TorchLearner)
    def compute_gradients(self, loss_per_module: dict[str, torch.Tensor], **kwargs: Any) -> dict:
        step = self.accumulation
        if step.first:
            self.zero_grads()
        scalers = self._grad_scalers  # RLlib's AMP scalers (None unless configured)
        total = sum(
            (scalers[mid].scale(loss) if scalers is not None else loss) * step.weight
            for mid, loss in loss_per_module.items()
        )
        if isinstance(total, torch.Tensor) and total.grad_fn is not None:
            with self.no_sync():
                total.backward()
        if not step.last:
            return {}
        return {
            self.get_param_ref(p): p.grad
            for module in self.module.values()
            for p in self.get_parameters(module)
            if p.grad is not None
        }

    @override(TorchLearner)
    def postprocess_gradients(self, gradients_dict: dict) -> dict:
        if not self.accumulation.last:
            return {}
        return super().postprocess_gradients(gradients_dict)

    def gradients_are_finite(self, gradients_dict: dict) -> bool:
        """Whether the mini-batch's loss and every gradient are finite."""
        return bool(torch.isfinite(torch.as_tensor(self.accumulation.loss))) and all(
            bool(torch.isfinite(g).all()) for g in gradients_dict.values()
        )

    def skip_step(self) -> None:
        """Drop the accumulated gradients of a non-finite mini-batch."""
        self.zero_grads()

    def step_optimizers(self, gradients_dict: dict) -> None:
        """RLlib's step of every registered optimizer (AMP scaler and lr schedulers included)."""
        TorchLearner.apply_gradients(self, gradients_dict)

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict) -> None:
        step = self.accumulation
        if not step.last:
            return
        finite = self.gradients_are_finite(gradients_dict)
        self.metrics.log_value((DEFAULT_MODULE_ID, "skipped_updates"), 0 if finite else 1, reduce="sum")
        if not finite:
            logger.warning("non-finite loss or gradient: update skipped (loss=%s)", float(step.loss))
            self.skip_step()
            return
        factor = self.write_learning_rates()
        self.moments_in_memory()
        if not self.keep_first_moments:
            self.clear_first_moments()
        self.step_optimizers(gradients_dict)
        self.zero_grads()  # read by the step: freed now rather than held through the next rollouts
        self.offload_moments()
        self.optimizer_steps += 1
        for key, value in step.stats.items():
            self.metrics.log_value((DEFAULT_MODULE_ID, key), value, window=1)
        self.metrics.log_value((DEFAULT_MODULE_ID, "learning_rate"), self.config.lr * factor, window=1)
        self.metrics.log_value((DEFAULT_MODULE_ID, "optimizer_steps"), self.optimizer_steps, window=1)
