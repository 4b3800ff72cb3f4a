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
- weights are updated in place through ``LLM.collective_rpc`` and a worker extension
  (:class:`WeightLoaderExtension`) that hands ``(name, tensor)`` pairs to the model's own
  ``load_weights``, which maps Hugging Face names onto vLLM's fused layers; the prefix cache is reset
  afterwards, since cached keys and values belong to the old weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rllib_search.llm.engines.base import Engine, SamplingParams, Segment, finish_segment


class VLLMEngine(Engine):
    """Generate with vLLM on a GPU. ``model`` is a hub name or a local path (for a bundled alias, the
    converted copy that ``load_causal_lm`` saved); ``llm_kwargs`` go to ``vllm.LLM``."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = True,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        from transformers import AutoTokenizer
        from vllm import LLM

        self.llm = LLM(
            model=model,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WeightLoaderExtension",
            **llm_kwargs,
        )
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

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load Hugging Face-named weights (a full or merged state dict) into every worker, in place."""
        weights = [(name, tensor.detach().to("cpu")) for name, tensor in state_dict.items()]
        self.llm.collective_rpc("rllib_search_load_weights", args=(weights,))
        self.llm.reset_prefix_cache()
        self.weights_version += 1

    def sleep(self) -> None:
        """Offload the weights to CPU memory and drop the KV cache (vLLM sleep level 1)."""
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        """Bring the weights back and reallocate the KV cache."""
        self.llm.wake_up()


class WeightLoaderExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``); ``collective_rpc`` calls its method by name."""

    def rllib_search_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Hand the weights to the model's own loader (it places and shards them on this worker)."""
        self.model_runner.model.load_weights(weights=weights)
