"""SearchFSDPLearner: :class:`SearchTorchLearner` with the policy and the reference sharded by torch FSDP2.

``training(sharding="fsdp2")`` selects it (``SearchConfig.get_default_learner_class``); the loss, the
micro-batches, the warmup and the step guard are the torch learner's. What differs:

- ``_make_module``: after RLlib builds the module (and before it registers the optimizers, which must see
  the sharded parameters), the frozen reference is copied, then ``fully_shard`` is applied to each
  transformer block and then to the root, for the policy (root: the ``LLMRLModule``; it keeps the
  embeddings, the final norm, the vocabulary projection and the value head) and for the reference (root: a
  :class:`ReferenceScorer` around the copy). Every forward pass enters through a root, so FSDP's hooks
  gather each block's parameters just before it runs and free them after. The policy sits in the
  MultiRLModule inside :class:`FSDPRLModule`, as RLlib puts a ``TorchDDPRLModule`` there. The mesh is the
  learners' process group (Ray Train's: gloo on CPU, nccl on GPU), or a world of one for a local learner.
- Mixed precision follows ``autocast`` (None: on GPU only): fp32 master weights with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; fp32 throughout otherwise.
- Gradients: each micro-batch's backward reduce-scatters into the sharded gradients, which accumulate
  (the gradients never exist whole on one rank); FSDP averages over the learners as DDP does.
  ``postprocess_gradients_for_module`` clips by the norm of the whole gradient (local sums of squares,
  all-reduced); the non-finite guard is agreed by all learners, so all step or all skip.
- State: the module's state is the full, unsharded state dict (``get_model_state_dict(full_state_dict=True,
  cpu_offload=True)``: gathered to rank 0's CPU), so a checkpoint is the plain learner's layout and the
  EnvRunners get whole tensors; loading shards a full state dict back (``set_model_state_dict``). The
  optimizer's state is the full one keyed by parameter names (``get_optimizer_state_dict``), put back with
  ``set_optimizer_state_dict(broadcast_from_rank0=True)``. Gathering is a collective, so every learner must
  take part: :class:`FSDPLearnerGroup` asks all of them (``get_state``, ``save_to_path``,
  ``on_policy_module``) and keeps rank 0's answer, where RLlib asks learner 0 alone. Weights for a vLLM
  EnvRunner and :meth:`SearchFSDPLearner.on_full_policy` (export, module functions) load the gathered
  state into an unsharded CPU copy of the policy on rank 0.

Memory of each of N learners, for a policy of P parameters (what a resource planner can count on); a
parameter is chunked on dim 0, so "P/N" is rounded up to whole rows per rank:

- policy weights: fp32 masters, P/N x 4 bytes (frozen ones too: LoRA's base, ``train_top_layers``' rest);
- gradients: fp32, P/N x 4 bytes of the trainable parameters, accumulated across micro-batches as shards;
- AdamW's two moments: fp32, P/N x 8 bytes of the trainable parameters;
- reference (``kl_coeff > 0`` without LoRA): a frozen fp32 copy, P/N x 4 bytes;
- gathered parameters, in ``param_dtype`` (bf16 on GPU, 2 bytes a parameter; fp32 on CPU): one
  transformer block at a time (two while FSDP prefetches the next), plus the root's own parameters
  (embeddings, vocabulary projection, final norm, value head), which stay gathered from the root's forward
  to the end of its backward (freed right after a scoring pass); in backward, one block's unsharded
  gradients in ``param_dtype`` and their fp32 copy for the reduce-scatter;
- activations as without sharding (per micro-batch; ``gradient_checkpointing`` cuts them);
- while state is gathered (weight sync, checkpoint, export): one whole fp32 parameter at a time on the
  device, and on rank 0's host the full fp32 state dict (P x 4 bytes; with the optimizer's, for a
  checkpoint, P x 12 bytes of the trainable parameters more); rank 0's host also keeps the unsharded CPU
  copy of the policy once a vLLM weight sync or ``on_full_policy`` has needed it (P x 4 bytes).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import torch
from ray.rllib.core import COMPONENT_LEARNER, DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.utils.annotations import override
from ray.rllib.utils.numpy import convert_to_numpy
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rllib_search.algos.learners.torch_learner import SearchTorchLearner

FULL_TO_RANK0_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)


def ensure_process_group(device: torch.device) -> None:
    """The learners' process group, or a world of one for a local learner (on a free loopback port)."""
    if torch.distributed.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a (possibly peft-wrapped) Hugging Face causal LM: the units FSDP shards."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(base.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(base).__name__} has no decoder.layers to shard block by block")
    return list(layers)


def shard(root: nn.Module, model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None) -> None:
    """``fully_shard`` each transformer block of ``model``, then ``root`` (everything left: embeddings,
    final norm, vocabulary projection, value head). The root's inputs are not cast: they carry the batch."""
    block_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    root_policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False
    )
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=block_policy)
    fully_shard(root, mesh=mesh, mp_policy=root_policy)


def reshard_all(root: nn.Module) -> None:
    """Free every gathered parameter under ``root`` (FSDP keeps a root's parameters gathered after a
    forward pass for its backward; after a forward without gradients nothing frees them)."""
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


class ReferenceScorer(nn.Module):
    """The frozen reference model as an FSDP root: ``forward(batch)`` is the policy's ``sequence_logprobs``
    under the reference's weights, so that FSDP gathers them as the pass goes."""

    def __init__(self, reference: nn.Module, sequence_logprobs: Any) -> None:
        super().__init__()
        self.reference = reference
        self.sequence_logprobs = sequence_logprobs  # a bound method of the policy: not a submodule

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.sequence_logprobs(batch, self.reference)


class FSDPRLModule(RLModule, nn.Module):
    """The sharded policy in the MultiRLModule (RLlib's ``TorchDDPRLModule`` for FSDP): training forward
    passes enter through the FSDP root; the state is the full, unsharded one (see the module docstring)."""

    def __init__(self, module: RLModule) -> None:
        nn.Module.__init__(self)  # as TorchDDPRLModule: RLModule's interface, not its __init__
        self.module = module
        self.observation_space, self.action_space = module.observation_space, module.action_space
        self.inference_only, self.learner_only = module.inference_only, module.learner_only
        self.model_config, self.catalog = module.model_config, module.catalog

    @override(RLModule)
    def unwrapped(self) -> RLModule:
        return self.module

    @override(RLModule)
    def is_stateful(self) -> bool:
        return self.module.is_stateful()

    @override(RLModule)
    def get_initial_state(self) -> Any:
        return self.module.get_initial_state()

    @override(RLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.module(batch, **kwargs)

    @override(RLModule)
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.module._forward_inference(batch, **kwargs)

    @override(RLModule)
    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.module._forward_exploration(batch, **kwargs)

    @override(RLModule)
    def get_state(self, *args: Any, inference_only: bool = False, **kwargs: Any) -> dict[str, Any]:
        """The full state dict on rank 0 (as the plain module's ``get_state``: with LoRA the trainable
        tensors only), empty on the other ranks. A collective: every learner calls it."""
        full = get_model_state_dict(self.module, options=FULL_TO_RANK0_CPU)
        if not full:
            return {}
        if self.module.uses_lora:
            trainable = {name for name, p in self.module.named_parameters() if p.requires_grad}
            return {name: tensor for name, tensor in full.items() if name in trainable}
        return convert_to_numpy(full)

    @override(RLModule)
    def set_state(self, state: dict[str, Any]) -> None:
        """Shard a full state dict (every rank holds it) into the module; with LoRA a partial one."""
        tensors = {name: torch.as_tensor(value) for name, value in state.items()}
        options = StateDictOptions(full_state_dict=True, strict=not self.module.uses_lora)
        set_model_state_dict(self.module, tensors, options=options)

    @override(RLModule)
    def save_to_path(self, *args: Any, **kwargs: Any) -> Any:
        """The plain module's files (its constructor arguments and the full state it is given)."""
        return self.module.save_to_path(*args, **kwargs)

    def no_sync(self) -> Any:
        """FSDP reduce-scatters every micro-batch (gradients stay sharded); RLlib's ``no_sync`` is a no-op."""
        return contextlib.nullcontext()


class SearchFSDPLearner(SearchTorchLearner):
    """The torch learner with FSDP2-sharded policy and reference (see the module docstring)."""

    reference_scorer: ReferenceScorer | None = None
    _replica: Any = None

    # --- building: copy the reference, shard, then RLlib registers the optimizers ---------------------
    @override(TorchLearner)
    def _make_module(self) -> Any:
        module = super()._make_module()
        self._module = module  # build_reference reads the policy through self.module
        self.build_reference()
        ensure_process_group(self.device)
        mesh = init_device_mesh(self.device.type, (torch.distributed.get_world_size(),))
        param_dtype = torch.bfloat16 if self.autocast_enabled() else None  # bf16 gathers under autocast
        policy = module[DEFAULT_MODULE_ID]
        shard(policy, policy.model, mesh, param_dtype)
        if self.reference is not None:
            self.reference_scorer = ReferenceScorer(self.reference, policy.sequence_logprobs)
            shard(self.reference_scorer, self.reference, mesh, param_dtype)
        module.add_module(DEFAULT_MODULE_ID, FSDPRLModule(policy), override=True)
        return module

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        """Nothing: the module was sharded in ``_make_module``."""

    @override(SearchTorchLearner)
    def reference_in_bf16(self) -> bool:
        """No: the sharded reference keeps fp32 shards, which FSDP gathers in its ``param_dtype``."""
        return False

    # --- scoring: every pass through an FSDP root --------------------------------------------------
    @override(SearchTorchLearner)
    def score_batch(self, columns: dict[str, Any]) -> dict[str, Any]:
        try:
            return super().score_batch(columns)
        finally:
            reshard_all(self.module[DEFAULT_MODULE_ID])
            if self.reference_scorer is not None:
                reshard_all(self.reference_scorer)

    @override(SearchTorchLearner)
    def policy_forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.module[DEFAULT_MODULE_ID].forward_train(batch)

    @override(SearchTorchLearner)
    def reference_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.reference_scorer is not None:
            return self.reference_scorer(batch)
        with self.policy().model.disable_adapter():  # LoRA: the base model is the reference
            return self.policy_forward(batch)["logprobs"]

    # --- gradients: clipped by the whole gradient's norm, one step decision for all learners --------
    @override(Learner)
    def postprocess_gradients_for_module(
        self, *, module_id: str, config: Any = None, module_gradients_dict: dict
    ) -> dict:
        config = config or self.config
        if config.grad_clip is None:
            return dict(module_gradients_dict)
        for optimizer_name, optimizer in self.get_optimizers_for_module(module_id):
            grads = list(self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer).values())
            if config.grad_clip_by == "value":
                for grad in grads:
                    grad.clamp_(-config.grad_clip, config.grad_clip)
                continue
            norms = [sharded_norm(grad) for grad in grads]
            if config.grad_clip_by == "norm":
                for grad, norm in zip(grads, norms, strict=True):
                    grad.mul_(torch.clamp(config.grad_clip / (norm + 1e-6), max=1.0))
                continue
            total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
            clip = float(config.grad_clip)
            coefficient = torch.clamp(clip / torch.clamp(total + 1e-6, min=clip), max=1.0)
            for grad in grads:
                grad.mul_(coefficient)
            self.metrics.log_value(
                (module_id, f"gradients_{optimizer_name}_global_norm"), float(total), window=1
            )
        return dict(module_gradients_dict)

    @override(SearchTorchLearner)
    def gradients_are_finite(self, gradients_dict: dict) -> bool:
        local = bool(torch.isfinite(torch.as_tensor(self.accumulation.loss))) and all(
            bool(torch.isfinite(local_tensor(g)).all()) for g in gradients_dict.values()
        )
        flag = torch.tensor(1.0 if local else 0.0, device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item() > 0)

    @override(SearchTorchLearner)
    def step_optimizers(self, gradients_dict: dict) -> None:
        """Each optimizer steps on its sharded parameters (the gradients are already in place)."""
        for _, optimizer in self.optimizers():
            optimizer.step()

    # --- state: full tensors gathered to rank 0, sharded back on load ------------------------------
    @override(TorchLearner)
    def _get_optimizer_state(self) -> dict[str, Any]:
        policy = self.policy()
        state = {}
        for name, optimizer in self._named_optimizers.items():
            full = get_optimizer_state_dict(policy, optimizer, options=FULL_TO_RANK0_CPU)
            state[name] = {"module_id": self._optimizer_name_to_module[name], "state": convert_to_numpy(full)}
        return state if rank() == 0 else {}

    @override(TorchLearner)
    def _set_optimizer_state(self, state: dict[str, Any]) -> None:
        policy = self.policy()
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        for name, optimizer in self._named_optimizers.items():
            saved = state[name]["state"]
            full = {**saved, "state": tensors_of(saved["state"])} if rank() == 0 else {}
            set_optimizer_state_dict(policy, optimizer, optim_state_dict=full, options=options)

    @override(SearchTorchLearner)
    def inference_weights(self) -> Any:
        """The vLLM EnvRunners' packed weights, from the unsharded copy on rank 0 (None elsewhere)."""
        from rllib_search.llm.models import engine_weights
        from rllib_search.llm.weight_sync import engine_dtype_of

        replica = self.full_policy()
        if replica is None:
            return None
        dtype = engine_dtype_of(self.config)
        with torch.no_grad():
            return engine_weights(replica.model, dtype)

    def full_policy(self) -> Any:
        """An unsharded CPU copy of the policy holding the current weights, on rank 0 (None elsewhere).
        A collective: every learner calls it. The copy is built once and refreshed at each call."""
        full = get_model_state_dict(self.policy(), options=FULL_TO_RANK0_CPU)
        if rank() != 0:
            return None
        if self._replica is None:
            spec = self._module_spec.rl_module_specs[DEFAULT_MODULE_ID]
            cpu_spec = type(spec)(
                module_class=spec.module_class,
                observation_space=spec.observation_space,
                action_space=spec.action_space,
                inference_only=spec.inference_only,
                learner_only=spec.learner_only,
                model_config={**dict(spec.model_config or {}), "device": "cpu"},
                catalog_class=spec.catalog_class,
            )
            self._replica = cpu_spec.build().eval()
        self._replica.load_state_dict(full)
        return self._replica

    def on_full_policy(self, fn: Any) -> Any:
        """``fn(policy)`` on rank 0's unsharded copy of the policy (its result; None on other ranks)."""
        replica = self.full_policy()
        return fn(replica) if replica is not None else None


def tensors_of(tree: Any) -> Any:
    """Numpy arrays (a saved optimizer state) back to CPU tensors, nested dicts and lists kept."""
    if isinstance(tree, dict):
        return {key: tensors_of(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(tensors_of(value) for value in tree)
    if hasattr(tree, "__array__") and not isinstance(tree, torch.Tensor):
        return torch.as_tensor(tree)
    return tree


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a plain tensor as it is)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def sharded_norm(grad: torch.Tensor) -> torch.Tensor:
    """The 2-norm of a whole (sharded) gradient: local sums of squares, summed over the ranks."""
    squares = local_tensor(grad).detach().float().pow(2).sum()
    if hasattr(grad, "to_local"):
        torch.distributed.all_reduce(squares)
    return squares.sqrt().nan_to_num(neginf=-10e8, posinf=10e8)


def _rank_and_state(learner: Any, components: Any, not_components: Any, kwargs: dict[str, Any]) -> Any:
    return rank(), learner.get_state(components, not_components=not_components, **kwargs)


class FSDPLearnerGroup(LearnerGroup):
    """RLlib's LearnerGroup, except that a remote group's state comes from every learner at once (a sharded
    learner gathers its full state with a collective) and rank 0's is kept."""

    @override(LearnerGroup)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict:
        if self.is_local or not self._check_component(COMPONENT_LEARNER, components, not_components):
            return super().get_state(components, not_components=not_components, **kwargs)
        comps = self._get_subcomponents(COMPONENT_LEARNER, components)
        not_comps = self._get_subcomponents(COMPONENT_LEARNER, not_components)
        results = self._get_results(
            self.foreach_learner(lambda learner: _rank_and_state(learner, comps, not_comps, kwargs))
        )
        return {COMPONENT_LEARNER: next(state for learner_rank, state in results if learner_rank == 0)}

    @override(LearnerGroup)
    def save_to_path(self, path: Any = None, *, state: dict | None = None, **kwargs: Any) -> str:
        """RLlib's save, with the state gathered from every learner first (RLlib's own would ask learner 0
        alone; an Algorithm's save already passes the state)."""
        return super().save_to_path(path, state=state if state is not None else self.get_state(), **kwargs)

    def on_policy_module(self, fn: Any) -> Any:
        """``fn`` on an unsharded copy of the policy (``SearchFSDPLearner.on_full_policy``): its result."""
        if self.is_local:
            return self._learner.on_full_policy(fn)
        calls = self.foreach_learner(lambda learner: (rank(), learner.on_full_policy(fn)))
        results = self._get_results(calls)
        return next(result for learner_rank, result in results if learner_rank == 0)
