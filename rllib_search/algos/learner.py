"""SearchLearner: the TorchLearner of PPO, GRPO, REINFORCE++ and masked SFT over token sequences.

One ``update`` call gets a padded batch of whole episodes (``batching.pad_rollouts`` plus the per-episode
``episode_advantages`` that the Algorithm computed over whole groups before the batch was sharded) and:

1. **prepares** it once, under ``no_grad`` and in micro-batches: the reference model's log-probs (for the
   KL term), the critic's values (PPO), the current policy's log-probs where the sampler's are not used;
   then token-level advantages: GRPO broadcasts each episode's advantage to its generated tokens; PPO runs
   GAE over generated tokens on rewards that carry the outcome on the last generated token and, as in
   Search-R1, ``-kl_coeff * KL`` on every generated token; REINFORCE++ sums the same rewards into returns
   (R1-Searcher). Whitening statistics are taken over generated tokens of ALL learners (all-reduced).
2. hands it to RLlib's ``Learner.update`` (epochs, mini-batches, metrics), whose per-mini-batch
   ``_update`` is replaced here by **gradient accumulation over micro-batches**: RLlib does one
   optimizer step per mini-batch with no accumulation, so sequences that do not fit at once would not train.
   Each micro-batch is cut to its own longest row. Under DDP only the last micro-batch all-reduces.
3. guards the step: a non-finite loss or gradient skips the optimizer step (counted in ``skipped_updates``),
   so one bad batch never corrupts the weights or Adam's moments.

The loss (``compute_loss_for_module``): clipped surrogate + ``kl_coeff`` * KL (when the KL is in the loss,
GRPO) - ``entropy_coeff`` * entropy + ``vf_loss_coeff`` * clipped value loss (PPO), or the masked negative
log-likelihood for SFT. The loss mask (1 on generated tokens) applies to every term, the advantage
whitening included; ``mask_retrieved_tokens=False`` uses every response token instead (Search-R1's
ablation, Table 4).

Reference model: a frozen copy of the policy's initial weights held by this learner (on its device),
or, with LoRA, the same model with its adapters switched off (no copy). It is built from
``model_config["model"]``, so a run that starts from a warm-started export uses that export as reference.

Precision: the module's weights stay in their dtype (fp32 on CPU); forward passes run under bf16 autocast
on GPU (``autocast``: None = on GPU only, True, False); RLlib applies no autocast itself.

DeepSpeed (``deepspeed={...}`` in ``training()``, e.g. ``{"zero_optimization": {"stage": 2}}``): for
models whose optimizer state does not fit one device, the module and its AdamW go through
``deepspeed.initialize`` instead of DDP; ZeRO-2 partitions gradients and optimizer state across learners
(ZeRO-3 the parameters too). The update is the same: micro-batches accumulate (DeepSpeed is told where
the accumulation boundary is), then one guarded ``engine.step()``. On CPU it runs with
``DS_ACCELERATOR=cpu`` over gloo (a world of one for a local learner).

Learning rate: AdamW with linear warmup over ``warmup_ratio * total_training_steps`` optimizer steps,
then constant (verl's default); the step count is part of the learner's checkpointed state.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import socket
from typing import Any

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_search.algos.advantages import gae, place_on_last_token, returns_to_go
from rllib_search.algos.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    kl_estimate,
    masked_mean,
)

logger = logging.getLogger(__name__)

POLICY_OPTIMIZER = "policy"
CRITIC_OPTIMIZER = "critic"
# Columns whose time axis is the full sequence (B, T); every other 2-D column is (B, T-1).
FULL_LENGTH_COLUMNS = ("input_ids", "attention_mask")


class SearchLearner(TorchLearner):
    """Masked policy-gradient (or SFT) learner for :class:`~rllib_search.algos.rl_module.LLMRLModule`."""

    def build(self) -> None:
        super().build()
        self._optimizer_steps = 0
        self._reference: torch.nn.Module | None = None
        if self.config.kl_coeff > 0 and self.config.advantage_estimator != "sft":
            policy = self._policy()
            if not policy.uses_lora:  # with LoRA the reference is the base model, adapters off
                self._reference = copy.deepcopy(policy.model).eval().requires_grad_(False)
        # After the reference copy, so that the copy carries none of DeepSpeed's gradient hooks.
        self._deepspeed = self._init_deepspeed() if self.config.deepspeed else None

    def _make_modules_ddp_if_necessary(self) -> None:
        if not self.config.deepspeed:  # DeepSpeed does its own data parallelism
            super()._make_modules_ddp_if_necessary()

    def _init_deepspeed(self) -> Any:
        """Wrap the policy and its optimizer in a DeepSpeed engine (see the module docstring)."""
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        if not torch.distributed.is_initialized():  # a local learner: a world of one
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            torch.distributed.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
            )
        # DeepSpeed reads the launcher's LOCAL_RANK; Ray places one learner per slot on a node.
        os.environ.setdefault(
            "LOCAL_RANK", str(torch.distributed.get_rank() % max(1, torch.cuda.device_count()))
        )
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
        ds_config = {
            "train_micro_batch_size_per_gpu": int(self.config.micro_batch_size),
            "gradient_accumulation_steps": 1,  # we mark the boundary ourselves, micro-batch counts vary
            "gradient_clipping": float(self.config.grad_clip or 0.0),
            **self.config.deepspeed,
        }
        engine, *_ = deepspeed.initialize(
            model=self._policy(),
            optimizer=self.get_optimizer(DEFAULT_MODULE_ID, POLICY_OPTIMIZER),
            config=ds_config,
        )
        return engine

    def _policy(self) -> Any:
        """The unwrapped LLMRLModule (DDP wraps it when there are several learners)."""
        return self.module[DEFAULT_MODULE_ID].unwrapped()

    # --- optimizers ---------------------------------------------------------------------------------
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        """AdamW for the policy's trainable weights and, if the module has one, another for the value
        head at ``critic_lr``. Registered explicitly: RLlib gives no optimizer to a module that lacks a
        learner's required APIs, and a critic-free LLM module would silently not train."""
        module = self.module[module_id].unwrapped()
        critic = list(module.value_head.parameters()) if module.value_head is not None else []
        critic_ids = {id(p) for p in critic}
        policy = [p for p in module.parameters() if p.requires_grad and id(p) not in critic_ids]
        decay = float(self.config.weight_decay)
        wanted = [(POLICY_OPTIMIZER, policy, self.config.lr)]
        if critic:
            wanted.append((CRITIC_OPTIMIZER, critic, self.config.critic_lr))
        # Each param group keeps its ``base_lr``: the warmup scales it (``_set_learning_rates``).
        if self.config.deepspeed:  # DeepSpeed takes one optimizer: the critic becomes a param group of it
            groups = [{"params": params, "lr": lr, "base_lr": lr} for _, params, lr in wanted]
            optimizers = [(POLICY_OPTIMIZER, policy + critic, self.config.lr, groups)]
        else:
            optimizers = [
                (name, params, lr, [{"params": params, "lr": lr, "base_lr": lr}])
                for name, params, lr in wanted
            ]
        for name, params, lr, groups in optimizers:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name=name,
                optimizer=torch.optim.AdamW(groups, weight_decay=decay),
                params=params,
                lr_or_lr_schedule=lr,
            )

    @staticmethod
    def _set_learning_rates(param_groups: Any, factor: float) -> None:
        for group in param_groups:
            group["lr"] = group["base_lr"] * factor

    def warmup_factor(self) -> float:
        """The learning-rate multiplier at the current optimizer step (linear warmup, then 1)."""
        total = self.config.total_training_steps
        if not total or self.config.warmup_ratio <= 0:
            return 1.0
        warmup = max(1, math.ceil(self.config.warmup_ratio * total))
        return min(1.0, (self._optimizer_steps + 1) / warmup)

    # --- update: prepare once, then RLlib's epochs and mini-batches ------------------------------------
    def update(self, batch: MultiAgentBatch | None = None, *, training_data: Any = None, **kwargs: Any):
        if training_data is not None:
            training_data.solve_refs()
            batch, training_data = training_data.batch, None
        if batch is not None:
            batch = self.prepare_batch(batch)
        return super().update(batch=batch, **kwargs)

    def prepare_batch(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        """Add ``ref_logprobs``, ``old_values``, ``advantages`` and ``returns`` (all (B, T-1)) to the
        module's batch (see the module docstring)."""
        cfg = self.config
        columns = {
            k: torch.as_tensor(np.asarray(v)) for k, v in batch.policy_batches[DEFAULT_MODULE_ID].items()
        }
        mask = columns["loss_mask"] if cfg.mask_retrieved_tokens else columns["response_mask"]
        estimator = cfg.advantage_estimator
        if estimator != "sft":
            scores = self.score(columns)
            columns.update(scores)
            columns.update(self.token_advantages(columns, mask))
        return MultiAgentBatch(
            {DEFAULT_MODULE_ID: SampleBatch({k: v.numpy() for k, v in columns.items()})},
            env_steps=batch.env_steps(),
        )

    @torch.no_grad()
    def score(self, columns: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reference log-probs, critic values and (when not taken from the sampler) the current policy's
        log-probs of the batch, computed in micro-batches without gradients."""
        cfg, policy = self.config, self._policy()
        recompute = cfg.old_logprobs == "recompute" or not cfg.mask_retrieved_tokens
        wanted: dict[str, list[torch.Tensor]] = {}
        mask_key = "loss_mask" if cfg.mask_retrieved_tokens else "response_mask"
        for rows in self._micro_batches(columns):
            chunk = {k: v.to(self._device) for k, v in rows.items()}
            chunk["score_mask"] = chunk[mask_key] > 0
            width = chunk["input_ids"].shape[1]
            pieces: dict[str, torch.Tensor] = {}
            if cfg.kl_coeff > 0:
                with self.autocast():
                    pieces["ref_logprobs"] = self.reference_logprobs(chunk)
            if recompute or policy.value_head is not None:
                with self.autocast():
                    out = policy.forward_train(chunk)
                if recompute:
                    pieces["old_logprobs"] = out["logprobs"]
                if policy.value_head is not None:
                    pieces["old_values"] = out["values"][:, :-1]
            for key, value in pieces.items():
                full = torch.zeros(value.shape[0], columns["loss_mask"].shape[1], dtype=torch.float32)
                full[:, : width - 1] = value.float().cpu()
                wanted.setdefault(key, []).append(full)
        return {key: torch.cat(parts) for key, parts in wanted.items()}

    def reference_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, T-1) log-probs of the batch's next tokens under the frozen reference policy."""
        policy = self._policy()
        if self._reference is not None:
            return policy.sequence_logprobs(batch, self._reference)
        with policy.model.disable_adapter():
            return policy.sequence_logprobs(batch)

    def token_advantages(
        self, columns: dict[str, torch.Tensor], mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Token-level ``advantages`` (and ``returns`` for PPO) from the episodes' advantages or rewards."""
        cfg = self.config
        episode = columns["episode_advantages"].double().numpy()
        mask_np = mask.numpy()
        if cfg.advantage_estimator == "grpo":
            return {"advantages": (torch.from_numpy(episode[:, None]) * mask.double()).float()}
        token_rewards = place_on_last_token(episode, mask_np)
        if cfg.kl_in_reward and cfg.kl_coeff > 0:
            kl = kl_estimate(columns["old_logprobs"], columns["ref_logprobs"], cfg.kl_estimator)
            token_rewards = token_rewards - cfg.kl_coeff * (kl * mask).double().numpy()
        if cfg.advantage_estimator == "gae":
            advantages, returns = gae(
                token_rewards, columns["old_values"].double().numpy(), mask_np, cfg.gamma, cfg.lambda_
            )
            advantages = torch.from_numpy(advantages)
            if cfg.whiten_advantages:
                advantages = self.whiten(advantages, mask)
            return {"advantages": advantages.float(), "returns": torch.from_numpy(returns).float()}
        if cfg.advantage_estimator == "reinforce_pp":
            returns = torch.from_numpy(returns_to_go(token_rewards, mask_np, cfg.gamma))
            return {"advantages": self.whiten(returns, mask).float()}
        raise ValueError(f"unknown advantage_estimator {cfg.advantage_estimator!r}")

    def whiten(self, values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """(values - mean) / std over masked entries of every learner's shard; 0 off the mask."""
        mask = mask.double()
        values = values.double()
        moments = torch.stack([(values * mask).sum(), (values**2 * mask).sum(), mask.sum()])
        if self.config.num_learners > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(moments)
        total, total_sq, count = moments.tolist()
        if count == 0:
            return torch.zeros_like(values)
        mean = total / count
        std = math.sqrt(max(total_sq / count - mean**2, 0.0))
        return (values - mean) / (std + eps) * mask

    def autocast(self) -> Any:
        """bf16 autocast around forward passes: on by default on GPU (``autocast=None``), off on CPU
        unless asked for. Log-probs, entropies and values come out in float32 either way."""
        enabled = self.config.autocast
        if enabled is None:
            enabled = self._device.type == "cuda"
        return torch.autocast(device_type=self._device.type, dtype=torch.bfloat16, enabled=bool(enabled))

    def _micro_batches(self, columns: dict[str, Any]):
        """Slices of ``micro_batch_size`` rows, each cut to its own longest sequence."""
        rows = int(columns["input_ids"].shape[0])
        size = int(self.config.micro_batch_size or rows)
        for start in range(0, rows, size):
            part = {k: v[start : start + size] for k, v in columns.items()}
            width = max(2, int(part["attention_mask"].sum(-1).max()))
            yield {
                k: (v[:, :width] if k in FULL_LENGTH_COLUMNS else v[:, : width - 1]) if v.ndim == 2 else v
                for k, v in part.items()
            }

    # --- one mini-batch: micro-batches with gradient accumulation, then one guarded step ----------------
    def _update(self, batch: dict[str, Any], **kwargs: Any) -> tuple[Any, Any, Any]:
        module_id = DEFAULT_MODULE_ID
        columns = dict(batch[module_id])
        module = self.module[module_id]
        cfg = self.config
        mask_key = "loss_mask" if cfg.mask_retrieved_tokens else "response_mask"
        micro_batches = list(self._micro_batches(columns))
        weights = self._micro_batch_weights([m[mask_key] for m in micro_batches])
        for optimizer in self._optimizer_parameters:
            optimizer.zero_grad(set_to_none=True)
        total_loss = torch.zeros((), device=self._device)
        stats: dict[str, float] = {}
        engine = self._deepspeed
        for index, (micro, weight) in enumerate(zip(micro_batches, weights)):
            last = index == len(micro_batches) - 1
            inputs = {**micro, "score_mask": micro[mask_key] > 0}
            if engine is not None:
                engine.set_gradient_accumulation_boundary(last)
                with self.autocast():
                    fwd_out = engine(inputs)
                loss, micro_stats = self.masked_loss(micro, fwd_out)
                engine.backward(loss * weight, scale_wrt_gas=False)
            else:
                no_sync = module.no_sync() if cfg.num_learners > 1 and not last else contextlib.nullcontext()
                with no_sync:
                    with self.autocast():
                        fwd_out = module.forward_train(inputs)
                    loss, micro_stats = self.masked_loss(micro, fwd_out)
                    (loss * weight).backward()
            total_loss = total_loss + loss.detach() * weight
            for key, value in micro_stats.items():
                stats[key] = stats.get(key, 0.0) + float(value) * weight

        if engine is not None:
            return self._deepspeed_step(engine, total_loss, stats)
        grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        finite = bool(torch.isfinite(total_loss)) and all(
            bool(torch.isfinite(g).all()) for g in grads.values()
        )
        self.metrics.log_value((module_id, "skipped_updates"), 0 if finite else 1, reduce="sum")
        if not finite:
            logger.warning("non-finite loss or gradient: update skipped (loss=%s)", float(total_loss))
            for optimizer in self._optimizer_parameters:
                optimizer.zero_grad(set_to_none=True)
            return {}, {module_id: total_loss}, {}

        factor = self.warmup_factor()
        for optimizer in self._optimizer_parameters:
            self._set_learning_rates(optimizer.param_groups, factor)
        self.apply_gradients(self.postprocess_gradients(grads))
        return self._after_step(total_loss, stats, factor)

    def _deepspeed_step(self, engine: Any, total_loss: torch.Tensor, stats: dict[str, float]) -> tuple:
        """One DeepSpeed step (clipping per its config), or none if the loss is not finite. ZeRO keeps
        gradients partitioned, so the guard looks at the loss, whose non-finiteness every bad gradient
        comes from."""
        finite = bool(torch.isfinite(total_loss))
        self.metrics.log_value((DEFAULT_MODULE_ID, "skipped_updates"), 0 if finite else 1, reduce="sum")
        if not finite:
            logger.warning("non-finite loss: DeepSpeed update skipped (loss=%s)", float(total_loss))
            engine.optimizer.zero_grad()
            return {}, {DEFAULT_MODULE_ID: total_loss}, {}
        factor = self.warmup_factor()
        self._set_learning_rates(engine.optimizer.param_groups, factor)
        engine.step()
        return self._after_step(total_loss, stats, factor)

    def _after_step(self, total_loss: torch.Tensor, stats: dict[str, float], factor: float) -> tuple:
        module_id = DEFAULT_MODULE_ID
        self._optimizer_steps += 1
        for key, value in stats.items():
            self.metrics.log_value((module_id, key), value, window=1)
        self.metrics.log_value((module_id, "learning_rate"), self.config.lr * factor, window=1)
        self.metrics.log_value((module_id, "optimizer_steps"), self._optimizer_steps, window=1)
        return {}, {module_id: total_loss}, {}

    def _micro_batch_weights(self, masks: list[torch.Tensor]) -> list[float]:
        """Each micro-batch's share of the mini-batch loss, so accumulated gradients equal the gradient
        of the whole mini-batch's loss: by sequences with tokens ("sequence") or by tokens ("token")."""
        if self.config.loss_aggregation == "token":
            sizes = [float(m.sum()) for m in masks]
        else:
            sizes = [float((m.sum(-1) > 0).sum()) for m in masks]
        total = sum(sizes)
        return [size / total if total else 1.0 / len(sizes) for size in sizes]

    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict, fwd_out: dict
    ) -> torch.Tensor:
        return self.masked_loss(batch, fwd_out)[0]

    def masked_loss(
        self, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The total loss of one micro-batch and its components (see the module docstring)."""
        cfg = self.config
        mask = batch["loss_mask"] if cfg.mask_retrieved_tokens else batch["response_mask"]
        agg = cfg.loss_aggregation
        logprobs = fwd_out["logprobs"]
        entropy = masked_mean(fwd_out["entropy"].detach(), mask, "token")
        if cfg.advantage_estimator == "sft":
            loss = masked_mean(-logprobs, mask, agg)
            return loss, {"sft_nll": loss.detach(), "entropy": entropy}
        policy_loss, stats = clipped_policy_loss(
            logprobs, batch["old_logprobs"], batch["advantages"], mask, cfg.clip_param, agg
        )
        stats = {"policy_loss": policy_loss.detach(), "entropy": entropy, **stats}
        loss = policy_loss
        if "ref_logprobs" in batch:
            kl = masked_mean(kl_estimate(logprobs, batch["ref_logprobs"], cfg.kl_estimator), mask, agg)
            stats["kl"] = kl.detach()
            if not cfg.kl_in_reward:
                loss = loss + cfg.kl_coeff * kl
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * masked_mean(fwd_out["entropy"], mask, agg)
        if "returns" in batch:
            values = fwd_out["values"][:, :-1]
            value_loss = clipped_value_loss(
                values, batch["old_values"], batch["returns"], mask, cfg.vf_clip_param, agg
            )
            stats["value_loss"] = value_loss.detach()
            loss = loss + cfg.vf_loss_coeff * value_loss
        return loss, stats

    # --- state: the optimizer step count drives the schedule -----------------------------------------
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["optimizer_steps"] = self._optimizer_steps
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "optimizer_steps" in state:
            self._optimizer_steps = int(state["optimizer_steps"])
