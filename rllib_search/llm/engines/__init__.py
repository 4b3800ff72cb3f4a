"""Generation engines behind one interface: :class:`HFEngine` (transformers, any device) and
:class:`VLLMEngine` (vLLM, GPU only; vllm is imported when one is built, so this package never needs it)."""

from rllib_search.llm.engines.base import Engine, SamplingParams, Segment, finish_segment, truncate_at_stop
from rllib_search.llm.engines.hf import HFEngine
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine
from rllib_search.llm.engines.vllm import VLLMEngine

__all__ = [
    "Engine",
    "HFEngine",
    "PrefixCachingHFEngine",
    "SamplingParams",
    "Segment",
    "VLLMEngine",
    "finish_segment",
    "truncate_at_stop",
]
