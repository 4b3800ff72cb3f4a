"""The vLLM engine: the GPU path (written against vLLM 0.33's offline ``LLM`` API).

GPU-path code: it needs CUDA and ``pip install rllib-search[gpu]``; vllm is imported when an engine is
built, so this module imports anywhere. Its tests skip without both (``tests/test_vllm_engine.py``).

How it maps the :class:`Engine` contract onto vLLM:

- prefixes go in as token ids (``{"prompt_token_ids": ids}``), one ``vllm.SamplingParams`` per row so each
  row has its own token limit and seed (``params.seed + row``: rows with the same prefix, like a GRPO
  group, still get different samples);
- ``logprobs=0`` returns the sampled token's log-probability, and the engine runs with
  ``logprobs_mode="processed_logprobs"`` so that it is taken after temperature and top-p, as
  :class:`Segment` promises;
- stop strings are vLLM's own (``include_stop_str_in_output=True``, special tokens kept in the text),
  then the output goes through the same :func:`finish_segment` as the HF engine; EOS is vLLM's
  ``finish_reason == "stop"`` with no ``stop_reason``;
- the model is a hub name or a local path; a bundled alias (``smollm2-135m-instruct``) is resolved to the
  plain Hugging Face copy that ``llm/models.py`` converts once and caches, never passed to vLLM as is;
- weights are updated in place through ``LLM.collective_rpc`` and a worker extension
  (:class:`WeightLoaderExtension`): they travel as ONE flat buffer
  (:class:`~rllib_search.llm.weight_sync.FlatWeights`, one raw tensor for vLLM's serialiser instead of
  one pickled tensor per parameter), which the worker moves to its GPU in one copy and hands, as views
  named like the plain Hugging Face model's parameters, to the model's own ``load_weights`` (it maps them
  onto vLLM's fused layers and shards them). LoRA policies arrive merged (the learner merges them), so
  vLLM runs the plain architecture at full speed and needs no ``enable_lora``. The prefix cache is reset
  afterwards, since cached keys and values belong to the old weights;
- sleep mode (``enable_sleep_mode=True``, vLLM's documented RL pattern): :meth:`sleep` releases the GPU
  memory while a colocated learner trains. vLLM's level 1 keeps a copy of the weights in CPU memory and
  discards the KV cache; level 2 discards the weights too (the model's buffers, such as rotary tables,
  stay in CPU memory), which vLLM documents for RL weight updates. The default here is 2: every weight
  sync after an update sends all of the policy's weights, so level 1's host copy would only be
  overwritten, and the host memory it takes is where the colocated learner's offloaded state goes.
  :meth:`load_weights` while asleep first wakes the weights only (``wake_up(tags=["weights"])``: memory
  for them, no KV cache yet), loads, and :meth:`wake_up` then brings the KV cache back
  (``wake_up(tags=["kv_cache"])``), so the new weights and the KV cache are never both being allocated
  while the learner still holds its GPU memory. At level 2 nothing generates between :meth:`sleep` and
  the next :meth:`load_weights` (the weights are gone): :meth:`wake_up` refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rllib_search.llm.engines.base import Engine, SamplingParams, Segment, finish_segment
from rllib_search.llm.weight_sync import FlatWeights


def llm_arguments(model: str, **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``model``: a bundled alias resolved to its converted
    copy (exported once, then cached), the processed log-probs mode and our worker extension."""
    from rllib_search.llm.models import resolve_model_path

    return {
        "model": resolve_model_path(model),
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": f"{__name__}.WeightLoaderExtension",
        **kwargs,
    }


class VLLMEngine(Engine):
    """Generate with vLLM on a GPU. ``model`` is a hub name, a local path or a bundled alias (resolved to
    its converted copy); ``sleep_level`` is what :meth:`sleep` asks of vLLM; ``llm_kwargs`` go to
    ``vllm.LLM``."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = True,
        sleep_level: int = 2,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        from transformers import AutoTokenizer
        from vllm import LLM

        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2 (vLLM's sleep levels), got {sleep_level}")
        self.dtype = dtype
        self.sleep_level = sleep_level
        self.sleep_mode = enable_sleep_mode
        self.asleep = False  # the KV cache (and, until load_weights or wake_up, the weights) released
        self.slept_level = sleep_level  # the level of the last sleep
        self.weights_asleep = False
        arguments = llm_arguments(
            model,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            **llm_kwargs,
        )
        self.llm = LLM(**arguments)
        model = arguments["model"]
        self.tokenizer = AutoTokenizer.from_pretrained(model)  # decodes for stop strings, as HFEngine does
        self.weights_version = 0

    def _generate_rows(
        self,
        prefixes: Sequence[Sequence[int]],
        limits: Sequence[int],
        rows: Sequence[int],
        params: SamplingParams,
    ) -> list[Segment]:
        """One ``LLM.generate`` for the rows, each with its own ``vllm.SamplingParams``."""
        from vllm import SamplingParams as VLLMSamplingParams

        self.wake_up()  # a no-op when awake: never generate from released memory

        sampling = [
            VLLMSamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=limits[i],
                stop=list(params.stop),
                include_stop_str_in_output=True,
                ignore_eos=params.ignore_eos,
                skip_special_tokens=False,
                logprobs=0,
                seed=None if params.seed is None else params.seed + i,
            )
            for i in rows
        ]
        prompts = [{"prompt_token_ids": list(prefixes[i])} for i in rows]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        segments = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids)]
            ended_with_eos = completion.finish_reason == "stop" and completion.stop_reason is None
            segments.append(finish_segment(ids, logprobs, self.tokenizer, params.stop, ended_with_eos))
        return segments

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | FlatWeights) -> None:
        """Load weights named like the plain Hugging Face model's parameters (a full or merged state dict,
        or the learner's :class:`FlatWeights`) into every worker, in place; asleep, the weights wake
        first (the KV cache stays released until :meth:`wake_up`)."""
        flat = state_dict if isinstance(state_dict, FlatWeights) else FlatWeights.pack(state_dict)
        if self.weights_asleep:
            self.llm.wake_up(tags=["weights"])
            self.weights_asleep = False
        buffer = torch.from_numpy(flat.buffer)
        shapes = [list(shape) for shape in flat.shapes]
        self.llm.collective_rpc(
            "rllib_search_load_flat_weights", args=(buffer, flat.names, flat.dtypes, shapes, flat.offsets)
        )
        self.llm.reset_prefix_cache()
        self.weights_version += 1

    def sleep(self, level: int | None = None) -> None:
        """Release the GPU memory (``LLM.sleep(level=...)``, default ``sleep_level``); a no-op without sleep
        mode or asleep. Level 1 where the same weights are wanted back (the Algorithm's checkpoints)."""
        if self.sleep_mode and not self.asleep:
            self.slept_level = int(level or self.sleep_level)
            self.llm.sleep(level=self.slept_level)
            self.asleep = self.weights_asleep = True

    def wake_up(self) -> None:
        """Reallocate what :meth:`sleep` released (the KV cache only, when ``load_weights`` already woke the
        weights); a no-op when awake. At sleep level 2 the weights must have been loaded first."""
        if self.asleep and self.weights_asleep and self.slept_level == 2:
            raise RuntimeError(
                "vLLM slept at level 2, which discards the weights: load_weights before wake_up "
                "(the weight sync after the update does), or use engine_options sleep_level=1"
            )
        if self.asleep:
            self.llm.wake_up(tags=None if self.weights_asleep else ["kv_cache"])
            self.asleep = self.weights_asleep = False


class WeightLoaderExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``); ``collective_rpc`` calls its method by name."""

    def rllib_search_load_flat_weights(
        self,
        buffer: torch.Tensor,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        offsets: list[int],
    ) -> None:
        """Move the flat buffer to this worker's GPU in one copy and hand views of it to the model's own
        loader (it places and shards them on this worker)."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        flat = FlatWeights(
            list(names), list(dtypes), [tuple(s) for s in shapes], list(offsets), buffer.numpy()
        )
        model.load_weights(weights=flat.tensors(device))
