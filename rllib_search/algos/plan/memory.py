"""Per-GPU memory of a learner and of a vLLM engine, term by term, from the model's shape and the config.

Every term is in bytes on ONE GPU. The learner's terms (:func:`learner_terms`):

- ``weights``: the policy's parameters, float32 (the learner keeps fp32 master weights and trains under
  bf16 autocast, ``learners/torch_learner.py``).
- ``gradients``: one float32 gradient per trainable parameter.
- ``optimizer``: AdamW's two float32 moments per trainable parameter (its ``step`` counters are scalars
  that torch keeps on the host).
- ``reference``: the frozen reference policy for the KL term, a float32 copy of the model, its Linear
  weights in bf16 under autocast without FSDP2 (none without KL, for SFT, or with LoRA, where the
  reference is the base model with its adapters off).
- ``ddp buckets``: DDP's gradient buckets, a float32 copy of the gradients (several learners, unless
  ``torch_ddp_kwargs`` sets ``gradient_as_bucket_view``).
- ``autocast cache``: autocast keeps a bf16 copy of every trainable weight a matmul reads until it exits,
  and the learner's autocast spans forward and backward: 2 bytes per such parameter (DDP; FSDP2 gathers
  bf16 parameters instead).
- ``fsdp2 gathered``: FSDP2 (``learners/fsdp.py``) gathers one transformer block at a time in its
  ``param_dtype`` (bf16 under autocast, else fp32), two with its prefetch, and the root's own parameters
  (embeddings, output head, final norm, value head) from the root's forward to the end of its backward;
  backward adds the unsharded gradients of one block and of the root, in ``param_dtype`` and again in
  float32 for the reduce-scatter.
- ``activations``: what backward keeps of one micro-batch of ``micro_batch_size`` episodes at the env's
  ``max_total_tokens`` (the longest an episode can be). Per token and decoder block, counting the tensors
  a Llama/Qwen2 block saves for backward the way Korthikanti et al. count a GPT block ("Reducing Activation
  Recomputation in Large Transformer Models", arXiv 2205.05198, section 4.1), adapted to RMSNorm, GQA,
  SwiGLU and fused attention (no s² term), with ``a`` bytes per activation (2 under bf16 autocast, 4
  without) and 4-byte float32 residuals::

      block = 16·H (two RMSNorms: fp32 input and output) + 2a·H (their casts into the projections)
              + 4a·Q (q, k and v repeated to all heads, attention output) + 2a·KV (k and v before the repeat)
              + 4a·I (gate, up, SiLU(gate), their product)

  with H the hidden size, Q = heads·head_dim, KV = kv_heads·head_dim, I the MLP's intermediate size.
  Without gradient checkpointing: ``layers · block`` per token. With it (each block recomputed in
  backward): each block's float32 input (``layers · 4·H``) plus one block being recomputed (``block``).
  Both add the last hidden states and their gathered copy (``2 · 4·H``).
- ``logits``: the vocabulary projection runs ``logprob_chunk`` positions of the micro-batch at a time
  (``model/rl_module.py``), so the logits take ``chunk · vocab · (a + 4·4)`` bytes: the chunk's projection
  and four float32 (chunk, vocab) tensors alive at once (logits, log-softmax, its exp, their product).
- ``cuda context``: :data:`PROCESS_OVERHEAD_GIB` per process on the GPU (the CUDA context, cuBLAS and
  NCCL workspaces, allocator fragmentation): an allowance, not a measurement.

The sum is an upper bound of the update's peak: gradients, activations and the logits are not all at
their largest at the same instant. Under FSDP2 (``training(sharding="fsdp2")``) the weights, gradients,
optimizer state and reference are divided by the number of learners; under DDP they are whole on each.

A vLLM engine (:func:`engine_terms`) takes ``gpu_memory_utilization`` of the GPU's memory (vLLM's own
budget for the instance: weights, activations and KV cache); its weights are ``2·P`` bytes in bf16, and the
KV cache holds ``2 · layers · kv_heads · head_dim · 2`` bytes a token. Asleep (vLLM sleep mode, both
levels) it keeps neither weights nor KV cache on the GPU, only its process overhead; level 1 holds its
weights in CPU memory meanwhile.

An EnvRunner's transformers engine on a GPU (:func:`hf_engine_terms`; ``rollouts(engine="hf")``, the
learner-only path) holds the runner's copy of the policy in its dtype (``engine_dtype``, bf16 on a GPU) for
the whole run (it never sleeps) and the KV caches of the episodes it rolls out at once
(``prompts_per_sample x group_size``: the prefix-caching engine keeps each episode's cache between turns),
each up to the env's ``max_total_tokens``.

A retriever replica's GPUs (:func:`retriever_terms`) hold its faiss index sharded over them in fp16 (flat:
``count x dim x 2`` bytes; IVF-PQ: ``pq_m`` code bytes and an 8-byte id a vector, and the coarse quantizer's
``nlist x dim`` fp16 centroids on every shard; HNSW, BM25 and random indexes stay on the CPU), faiss's
temporary memory (:data:`FAISS_TEMP_BYTES` a GPU), the query encoder in fp16 on the first GPU, and the
process overhead. The index's size comes from its ``manifest.json`` when the Serve config's ``index_dir``
is readable where the plan is made.

Host memory (:func:`host_terms`, over the cluster): a colocated learner's weights, AdamW moments and
reference wait in host memory while its engine samples; an engine asleep at level 1 keeps its weights
there; an FSDP2 run gathers the full fp32 state dict on rank 0's host for every weight sync and keeps an
unsharded fp32 copy of the policy there (``learners/fsdp.py``; a checkpoint adds the optimizer's state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rllib_search.algos.model.rl_module import DEFAULT_MODEL_CONFIG
from rllib_search.algos.plan.shapes import ModelShape

GIB = 1024**3
#: Per process on a GPU: the CUDA context, cuBLAS / NCCL workspaces and allocator slack (an allowance).
PROCESS_OVERHEAD_GIB = 1.0
#: faiss's temporary memory on each GPU of more than 8 GiB (``StandardGpuResources``' default, 1.5 GiB).
FAISS_TEMP_BYTES = 1536 * 1024**2
#: The id faiss keeps beside each vector of an IVF index on a GPU (int64).
FAISS_ID_BYTES = 8


def _engine_defaults() -> tuple[float, int]:
    """``VLLMEngine``'s own defaults for ``gpu_memory_utilization`` and ``sleep_level`` (read from its
    signature; vLLM itself is not imported)."""
    import inspect

    from rllib_search.llm.engines.vllm import VLLMEngine

    parameters = inspect.signature(VLLMEngine.__init__).parameters
    return float(parameters["gpu_memory_utilization"].default), int(parameters["sleep_level"].default)


#: What the EnvRunners' vLLM engine takes unless ``engine_options`` say otherwise.
VLLM_GPU_MEMORY_UTILIZATION, VLLM_SLEEP_LEVEL = _engine_defaults()
STRATEGIES = ("ddp", "fsdp2")
FP32, BF16 = 4, 2
ADAM_MOMENTS = 2


@dataclass(frozen=True)
class LearnerSetup:
    """What the learner's memory depends on, read from a config by :func:`learner_setup`."""

    shape: ModelShape
    strategy: str  # one of STRATEGIES
    num_learners: int
    micro_batch_size: int
    sequence_tokens: int
    gradient_checkpointing: bool
    autocast: bool
    logprob_chunk: int = DEFAULT_MODEL_CONFIG["logprob_chunk"]
    reference: bool = True
    value_head: bool = False
    trainable: str = "full"  # full | lora | top_layers
    lora_rank: int = 16
    top_layers: int = 0
    ddp_bucket_view: bool = False

    @property
    def shards(self) -> int:
        """How many learners share the sharded state (1: replicated)."""
        return max(1, self.num_learners) if self.strategy == "fsdp2" else 1

    @property
    def activation_bytes(self) -> int:
        return BF16 if self.autocast else FP32


@dataclass
class Terms:
    """Named byte counts, in the order they were added."""

    items: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        if value:
            self.items[name] = self.items.get(name, 0.0) + float(value)

    @property
    def total(self) -> float:
        return sum(self.items.values())


def trainable_tensors(setup: LearnerSetup) -> list[int]:
    """Element counts of the tensors the optimizer steps (the value head's included)."""
    shape = setup.shape
    if setup.trainable == "lora":
        h, q, kv, inter = (
            shape.hidden_size,
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
            shape.intermediate_size,
        )
        pairs = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]  # "all-linear"
        tensors = [setup.lora_rank * n for pair in pairs for n in pair] * shape.layers
    elif setup.trainable == "top_layers":
        tensors = shape.layer_tensors() * setup.top_layers + [shape.hidden_size]  # blocks and final norm
    else:
        tensors = shape.tensors()
    if setup.value_head:
        tensors = [*tensors, shape.hidden_size, 1]
    return tensors


def cast_parameters(setup: LearnerSetup, trained: int) -> int:
    """Parameters autocast keeps a bf16 copy of: the trainable weights that a matmul reads (an untied
    input embedding is looked up, not multiplied; frozen weights are cast anew each time, not cached)."""
    if setup.trainable != "full":
        return trained
    shape = setup.shape
    return shape.parameters() - (0 if shape.tied_embeddings else shape.embedding_parameters())


def activation_bytes_per_token(shape: ModelShape, act: int, checkpointing: bool) -> float:
    """Bytes backward keeps per token of a micro-batch (see the module docstring for the formula)."""
    h, inter = shape.hidden_size, shape.intermediate_size
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    block = 4 * FP32 * h + 2 * act * h + 4 * act * q + 2 * act * kv + 4 * act * inter
    last_hidden = 2 * FP32 * h
    if checkpointing:
        return shape.layers * FP32 * h + block + last_hidden
    return shape.layers * block + last_hidden


def learner_terms(setup: LearnerSetup) -> Terms:
    """The learner's bytes on its GPU during the update, term by term (see the module docstring)."""
    shape, n = setup.shape, setup.shards
    value_head = shape.hidden_size + 1 if setup.value_head else 0
    trained = sum(trainable_tensors(setup))
    lora = trained if setup.trainable == "lora" else 0  # the adapters sit beside the base weights
    terms = Terms()
    terms.add("weights", FP32 * (shape.parameters() + value_head + lora) / n)
    terms.add("gradients", FP32 * trained / n)
    terms.add("optimizer", ADAM_MOMENTS * FP32 * trained / n)
    if setup.reference and setup.trainable != "lora":
        if setup.autocast and setup.strategy != "fsdp2":  # Linear weights stored as autocast reads them
            linear = shape.linear_parameters()
            terms.add("reference", BF16 * linear + FP32 * (shape.parameters() - linear))
        else:
            terms.add("reference", FP32 * shape.parameters() / n)
    if setup.strategy == "ddp" and setup.num_learners > 1 and not setup.ddp_bucket_view:
        terms.add("ddp buckets", FP32 * trained)
    if setup.autocast and setup.strategy == "ddp":
        terms.add("autocast cache", BF16 * cast_parameters(setup, trained))
    if setup.strategy == "fsdp2":
        gathered = setup.activation_bytes
        block = shape.layer_parameters()
        root = shape.parameters() - shape.layers * block + value_head
        terms.add("fsdp2 gathered", gathered * (2 * block + root) + (gathered + FP32) * (block + root))
    tokens = setup.micro_batch_size * setup.sequence_tokens
    per_token = activation_bytes_per_token(shape, setup.activation_bytes, setup.gradient_checkpointing)
    terms.add("activations", tokens * per_token)
    chunk = min(tokens, setup.logprob_chunk)
    terms.add("logits", chunk * shape.vocab_size * (setup.activation_bytes + 4 * FP32))
    terms.add("cuda context", PROCESS_OVERHEAD_GIB * GIB)
    return terms


def learner_offloaded_bytes(learner: Terms | None = None) -> float:
    """What a colocated learner (its update's ``learner`` terms) leaves on the GPU while its state is
    offloaded to CPU for the rollout: its process overhead, and DDP's gradient buckets (the reducer's own
    buffers, which offloading the module does not move)."""
    buckets = learner.items.get("ddp buckets", 0.0) if learner is not None else 0.0
    return PROCESS_OVERHEAD_GIB * GIB + buckets


def host_terms(
    learner: LearnerSetup | None, engine: EngineSetup | None, runners: int, colocated: bool
) -> Terms:
    """Host memory the run's actors take on top of their processes, summed over the cluster (see the
    module docstring): colocated learners' offloaded state, sleeping engines' weights, and FSDP2's gathered
    full state on rank 0."""
    terms = Terms()
    if learner is not None and colocated:
        shard = learner_terms(learner).items
        parts = ("weights", "optimizer", "reference")
        terms.add("offloaded learners", max(1, learner.num_learners) * sum(shard.get(p, 0.0) for p in parts))
    if engine is not None and colocated and engine.sleep_level == 1:
        terms.add("sleeping engines' weights", runners * engine.weight_bytes * engine.shape.parameters())
    if learner is not None and learner.strategy == "fsdp2":
        params = learner.shape.parameters()
        terms.add("rank 0: gathered state + policy copy", 2 * FP32 * params)
    return terms


@dataclass(frozen=True)
class EngineSetup:
    """A vLLM engine's memory settings (``engine_options``, vLLM's names)."""

    shape: ModelShape
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    sleep_level: int = VLLM_SLEEP_LEVEL
    weight_bytes: int = BF16
    max_model_len: int = 4096


@dataclass(frozen=True)
class EngineMemory:
    """A vLLM engine on a GPU of ``gpu_bytes``: its budget awake, what it keeps asleep, its KV cache."""

    budget: float  # awake: gpu_memory_utilization of the GPU
    weights: float
    asleep: float  # on the GPU while asleep
    kv_cache: float  # what the budget leaves for the KV cache
    kv_tokens: int
    max_model_len: int

    @property
    def sequences(self) -> float:
        """Full-length sequences the KV cache holds at once."""
        return self.kv_tokens / max(1, self.max_model_len)


def engine_terms(setup: EngineSetup, gpu_bytes: float) -> EngineMemory:
    """A vLLM engine's memory on a GPU of ``gpu_bytes`` (see the module docstring)."""
    budget = setup.gpu_memory_utilization * gpu_bytes
    weights = setup.weight_bytes * setup.shape.parameters()
    kv_cache = max(0.0, budget - weights - PROCESS_OVERHEAD_GIB * GIB)
    return EngineMemory(
        budget=budget,
        weights=weights,
        asleep=PROCESS_OVERHEAD_GIB * GIB,
        kv_cache=kv_cache,
        kv_tokens=int(kv_cache // setup.shape.kv_bytes_per_token(setup.weight_bytes)),
        max_model_len=setup.max_model_len,
    )


def learner_setup(config: Any, shape: ModelShape) -> LearnerSetup:
    """The learner's :class:`LearnerSetup` from a SearchConfig (sharding, DDP, model_config, env budgets)."""
    model = dict(config.model_config or {})
    lora = model.get("lora")
    top = model.get("train_top_layers")
    gpu = float(config.num_gpus_per_learner or 0) > 0
    autocast = gpu if config.autocast is None else bool(config.autocast)
    env = dict(config.env_config or {})
    return LearnerSetup(
        shape=shape,
        strategy="fsdp2" if getattr(config, "sharding", None) == "fsdp2" else "ddp",
        num_learners=int(config.num_learners or 0),
        micro_batch_size=int(config.micro_batch_size),
        sequence_tokens=int(env.get("max_total_tokens") or 4096),
        gradient_checkpointing=bool(model.get("gradient_checkpointing", False)),
        autocast=autocast,
        logprob_chunk=int(model.get("logprob_chunk") or DEFAULT_MODEL_CONFIG["logprob_chunk"]),
        reference=float(config.kl_coeff) > 0 and config.advantage_estimator != "sft",
        value_head=bool(model.get("value_head", False)),
        trainable="lora" if lora is not None else "top_layers" if top is not None else "full",
        lora_rank=int(lora.get("r", 16)) if isinstance(lora, dict) else 16,
        top_layers=int(top or 0),
        ddp_bucket_view=bool(dict(config.torch_ddp_kwargs or {}).get("gradient_as_bucket_view", False)),
    )


def engine_setup(config: Any, shape: ModelShape) -> EngineSetup:
    """The vLLM engine's :class:`EngineSetup` from a SearchConfig's engine_options and engine_dtype."""
    options = dict(config.engine_options or {})
    dtype = options.get("dtype") or config.engine_dtype or "bfloat16"
    env = dict(config.env_config or {})
    return EngineSetup(
        shape=shape,
        gpu_memory_utilization=float(options.get("gpu_memory_utilization", VLLM_GPU_MEMORY_UTILIZATION)),
        sleep_level=int(options.get("sleep_level", VLLM_SLEEP_LEVEL)),
        weight_bytes=FP32 if str(dtype) == "float32" else BF16,
        max_model_len=int(options.get("max_model_len") or env.get("max_total_tokens") or 4096),
    )


@dataclass(frozen=True)
class HFEngineSetup:
    """An EnvRunner's transformers engine on a GPU: the runner's policy copy and the caches it rolls out."""

    shape: ModelShape
    weight_bytes: int
    sequences: int  # episodes rolled out at once, each with its own KV cache
    sequence_tokens: int  # the longest an episode can be (the env's max_total_tokens)


def hf_engine_setup(config: Any, shape: ModelShape) -> HFEngineSetup:
    """The transformers engine's :class:`HFEngineSetup` from a SearchConfig (engine_dtype, rollout sizes)."""
    env = dict(config.env_config or {})
    return HFEngineSetup(
        shape=shape,
        weight_bytes=FP32 if str(config.engine_dtype or "bfloat16") == "float32" else BF16,
        sequences=int(config.prompts_per_sample) * int(config.group_size),
        sequence_tokens=int(env.get("max_total_tokens") or 4096),
    )


def hf_engine_terms(setup: HFEngineSetup) -> Terms:
    """The transformers engine's bytes on its GPU while it samples (see the module docstring)."""
    terms = Terms()
    terms.add("weights", setup.weight_bytes * setup.shape.parameters())
    kv_per_token = setup.shape.kv_bytes_per_token(setup.weight_bytes)
    terms.add("kv cache", setup.sequences * setup.sequence_tokens * kv_per_token)
    terms.add("cuda context", PROCESS_OVERHEAD_GIB * GIB)
    return terms


@dataclass(frozen=True)
class IndexSetup:
    """A retriever replica's index as its manifest describes it, and the GPUs it is sharded over."""

    kind: str
    count: int
    dim: int
    options: dict[str, Any] = field(default_factory=dict)
    gpus: int = 1
    encoder_parameters: int | None = None  # None: unknown (not counted)


def retriever_terms(setup: IndexSetup) -> Terms:
    """One retriever replica's bytes on its first GPU, the one with the query encoder (module docstring)."""
    terms = Terms()
    shards = max(1, setup.gpus)
    if setup.kind == "flat":
        terms.add("index (fp16)", BF16 * setup.count * setup.dim / shards)
    elif setup.kind == "ivfpq":
        pq_m = int(setup.options.get("pq_m") or 0)
        nlist = int(setup.options.get("nlist") or 0)
        terms.add("index (codes and ids)", (pq_m + FAISS_ID_BYTES) * setup.count / shards)
        terms.add("coarse quantizer (fp16)", BF16 * nlist * setup.dim)
    if terms.items:
        terms.add("faiss temporary memory", FAISS_TEMP_BYTES)
    if setup.encoder_parameters:
        terms.add("query encoder (fp16)", BF16 * setup.encoder_parameters)
    terms.add("cuda context", PROCESS_OVERHEAD_GIB * GIB)
    return terms
