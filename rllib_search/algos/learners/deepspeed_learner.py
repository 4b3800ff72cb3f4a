"""SearchDeepSpeedLearner: :class:`SearchTorchLearner` with DeepSpeed ZeRO instead of DDP.

For models whose optimizer state does not fit one device (``deepspeed={...}`` in ``training()``, e.g.
``{"zero_optimization": {"stage": 2}}``): ZeRO-2 partitions gradients and optimizer state across learners
(ZeRO-3 the parameters too). The differences from the torch learner sit in the same override points:

- ``configure_optimizers_for_module``: DeepSpeed takes ONE optimizer, so the value head becomes a second
  param group of the policy's AdamW, with its own ``base_lr`` (``critic_lr``); the warmup writes each
  group from its own base.
- ``_make_modules_ddp_if_necessary``: ``deepspeed.initialize`` wraps the module and its optimizer instead
  of DDP (after the reference copy, so that it carries none of DeepSpeed's hooks), and the module is
  replaced in the MultiRLModule by :class:`DeepSpeedRLModule`, as RLlib puts a ``TorchDDPRLModule``
  there: training forward passes go through the engine.
- ``compute_gradients``: ``engine.backward`` with the micro-batch's weight; DeepSpeed is told where the
  accumulation boundary is (micro-batch counts vary, so its own counter is off).
- ``postprocess_gradients``: nothing (DeepSpeed clips per its config; ZeRO keeps gradients partitioned).
- ``apply_gradients``: the guard looks at the loss, from which every bad gradient comes; then the
  warmup's learning rates and ``engine.step()``.

- ``get_state`` / ``set_state``: RLlib checkpoints the module and the (base) optimizer's state; ZeRO also
  keeps fp32 master partitions of the weights, which are saved beside them and put back on resume (or,
  when only module weights arrive, rebuilt from them: ``refresh_fp32_params``). RLlib checkpoints learner
  0 only, and ZeRO partitions the optimizer state per learner, so resuming a multi-learner DeepSpeed run
  is refused with an error rather than loading learner 0's partition everywhere.

ZeRO-3 is refused at config validation (``SearchConfig.validate_training``): scoring, the frozen reference,
the weight sync and the export read the policy's whole parameters, which ZeRO-3 partitions.

On CPU it runs with ``DS_ACCELERATOR=cpu`` over gloo (a world of one for a local learner).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import torch
from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.utils.annotations import override

from rllib_search.algos.learners.search_learner import POLICY_OPTIMIZER
from rllib_search.algos.learners.torch_learner import SearchTorchLearner

FP32_MASTER = "deepspeed_fp32_master"


def _init_distributed() -> None:
    """A process group for DeepSpeed: the learners' own, or a world of one for a local learner."""
    if not torch.distributed.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    # DeepSpeed reads the launcher's LOCAL_RANK; Ray places one learner per slot on a node.
    os.environ.setdefault("LOCAL_RANK", str(torch.distributed.get_rank() % max(1, torch.cuda.device_count())))


class DeepSpeedRLModule(RLModule, torch.nn.Module):
    """An RLModule whose training forward pass runs through a DeepSpeed engine (RLlib's
    ``TorchDDPRLModule`` for DeepSpeed); everything else is the wrapped module's."""

    def __init__(self, engine: Any) -> None:
        torch.nn.Module.__init__(self)  # as TorchDDPRLModule: RLModule's interface, not its __init__
        self.engine = engine
        inner = engine.module
        self.observation_space, self.action_space = inner.observation_space, inner.action_space
        self.inference_only, self.learner_only = inner.inference_only, inner.learner_only
        self.model_config, self.catalog = inner.model_config, inner.catalog

    @override(RLModule)
    def unwrapped(self) -> RLModule:
        return self.engine.module

    @override(RLModule)
    def is_stateful(self) -> bool:
        return self.unwrapped().is_stateful()

    @override(RLModule)
    def get_initial_state(self) -> Any:
        return self.unwrapped().get_initial_state()

    @override(RLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.engine(batch)

    @override(RLModule)
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.unwrapped()._forward_inference(batch, **kwargs)

    @override(RLModule)
    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.unwrapped()._forward_exploration(batch, **kwargs)

    @override(RLModule)
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.unwrapped().get_state(*args, **kwargs)

    @override(RLModule)
    def set_state(self, *args: Any, **kwargs: Any) -> None:
        self.unwrapped().set_state(*args, **kwargs)

    def no_sync(self) -> Any:
        """DeepSpeed reduces at the boundary it is told; RLlib's DDP ``no_sync`` calls find a no-op."""
        return contextlib.nullcontext()


class SearchDeepSpeedLearner(SearchTorchLearner):
    """The torch learner on a DeepSpeed engine (see the module docstring)."""

    engine: Any = None

    @override(SearchTorchLearner)
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        groups = self.optimizer_groups(self.module[module_id].unwrapped())
        params = [p for _, group_params, _ in groups for p in group_params]
        optimizer = torch.optim.AdamW(
            [{"params": group_params, "lr": lr, "base_lr": lr} for _, group_params, lr in groups],
            weight_decay=float(self.config.weight_decay),
        )
        self.register_optimizer(
            module_id=module_id, optimizer_name=POLICY_OPTIMIZER, optimizer=optimizer, params=params
        )

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        self.build_reference()
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        _init_distributed()
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
        ds_config = {
            "train_micro_batch_size_per_gpu": int(self.config.micro_batch_size),
            "gradient_accumulation_steps": 1,  # the boundary is set per micro-batch
            "gradient_clipping": float(self.config.grad_clip or 0.0),
            **self.config.deepspeed,
        }
        self.engine, *_ = deepspeed.initialize(
            model=self.policy(),
            optimizer=self.get_optimizer(DEFAULT_MODULE_ID, POLICY_OPTIMIZER),
            config=ds_config,
        )
        self.module.add_module(DEFAULT_MODULE_ID, DeepSpeedRLModule(self.engine), override=True)

    @override(SearchTorchLearner)
    def param_groups(self) -> list[dict[str, Any]]:
        if self.engine is None:
            return super().param_groups()
        return list(self.engine.optimizer.param_groups)

    @override(SearchTorchLearner)
    def compute_gradients(self, loss_per_module: dict[str, torch.Tensor], **kwargs: Any) -> dict:
        step = self.accumulation
        self.engine.set_gradient_accumulation_boundary(step.last)
        self.engine.backward(sum(loss_per_module.values()) * step.weight, scale_wrt_gas=False)
        return {}

    @override(SearchTorchLearner)
    def postprocess_gradients(self, gradients_dict: dict) -> dict:
        return gradients_dict

    @override(SearchTorchLearner)
    def skip_step(self) -> None:
        self.engine.optimizer.zero_grad()

    @override(SearchTorchLearner)
    def retune_optimizer(self, lr: float | None = None, momentum: bool = True) -> None:
        if not momentum:
            raise NotImplementedError(
                "retune_optimizer(momentum=False) is not supported under DeepSpeed (its optimizer's states "
                "live in ZeRO's partitions): use the Torch learner for a momentum-free phase"
            )
        super().retune_optimizer(lr, momentum)

    @override(SearchTorchLearner)
    def step_optimizers(self, gradients_dict: dict) -> None:
        self.engine.step()

    # --- state: ZeRO's fp32 master partitions ---------------------------------------------------------
    def _fp32_partitions(self) -> list[torch.Tensor]:
        """This learner's fp32 master partitions (ZeRO-1/2's, or the bf16 optimizer's)."""
        optimizer = self.engine.optimizer
        for name in ("single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
            if hasattr(optimizer, name):
                return list(getattr(optimizer, name))
        return []

    @override(SearchTorchLearner)
    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        wanted = self._check_component(COMPONENT_OPTIMIZER, components, not_components)
        if self.engine is not None and wanted and not kwargs.get("inference_only"):
            state[FP32_MASTER] = {
                "world_size": torch.distributed.get_world_size(),
                "partitions": [p.detach().cpu().clone() for p in self._fp32_partitions()],
            }
        return state

    @override(SearchTorchLearner)
    def set_state(self, state: dict[str, Any]) -> None:
        world = torch.distributed.get_world_size() if self.engine is not None else 1
        if self.engine is not None and world > 1 and (COMPONENT_OPTIMIZER in state or FP32_MASTER in state):
            raise ValueError(
                "resuming a DeepSpeed run with several learners is not supported: RLlib checkpoints learner "
                "0's state only, and ZeRO partitions the optimizer state across learners (resume with one "
                "learner, or load the module weights alone)"
            )
        super().set_state(state)
        if self.engine is None:
            return
        saved = state.get(FP32_MASTER)
        partitions = self._fp32_partitions()
        if saved is not None and len(saved["partitions"]) == len(partitions):
            with torch.no_grad():
                for target, value in zip(partitions, saved["partitions"], strict=True):
                    target.copy_(torch.as_tensor(value))
        elif COMPONENT_RL_MODULE in state and hasattr(self.engine.optimizer, "refresh_fp32_params"):
            self.engine.optimizer.refresh_fp32_params()  # the masters follow the weights just loaded
