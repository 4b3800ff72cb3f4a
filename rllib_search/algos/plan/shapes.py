"""A causal LM's shape (hidden size, layers, heads, vocabulary, ...) read without loading or downloading it,
and the parameter counts that follow from it.

Where a shape comes from, first match wins:

1. a local directory with a ``config.json`` (read with ``transformers.AutoConfig``, local files only);
2. :data:`PUBLISHED_SHAPES`: the published ``config.json`` values of the papers' models, their judges and
   the bundled models, so that a plan for a cluster runs on a laptop that holds none of them;
3. a bundled alias's converted copy, or a hub name already in the local Hugging Face cache.

Anything else is refused with a message that says how to plan for it (a local directory holding its
``config.json``).

A retriever's query encoder (:func:`encoder_parameters`) is counted by building it on PyTorch's meta device
from its local ``config.json`` (no memory, no weights), or read from :data:`PUBLISHED_ENCODERS`.

Parameter counts are computed from the shape (:meth:`ModelShape.parameters`), for the decoder families the
package trains and serves: Llama-style (Llama, Mistral, SmolLM2; ``attention_bias`` and ``mlp_bias`` as the
config says), Qwen2 (biases on the q, k and v projections) and Gemma 3 (four norms a block, q and k norms).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Decoder families by Hugging Face ``model_type``: what the parameter count needs to know of each.
FAMILIES = ("llama", "qwen2", "gemma3")
_FAMILY_OF_MODEL_TYPE = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
}


@dataclass(frozen=True)
class ModelShape:
    """The figures of a decoder-only causal LM that its memory depends on (a ``config.json``'s)."""

    name: str
    family: str  # one of FAMILIES
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    attention_bias: bool = False  # llama: bias on q, k, v and o
    mlp_bias: bool = False

    # --- parameter counts -------------------------------------------------------------------------------
    def layer_tensors(self) -> list[int]:
        """The element counts of one decoder block's parameter tensors."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.heads * hd, self.kv_heads * hd
        tensors = [h * q, h * kv, h * kv, q * h]  # q, k, v, o projections
        if self.family == "qwen2":
            tensors += [q, kv, kv]
        elif self.attention_bias:
            tensors += [q, kv, kv, h]
        tensors += [h * self.intermediate_size] * 3  # gate, up, down
        if self.mlp_bias:
            tensors += [self.intermediate_size, self.intermediate_size, h]
        return tensors + self.layer_norm_tensors()

    def layer_norm_tensors(self) -> list[int]:
        """The element counts of one decoder block's norm weights."""
        h, hd = self.hidden_size, self.head_dim
        if self.family == "gemma3":
            return [h] * 4 + [hd, hd]  # four block norms, q_norm, k_norm
        return [h, h]

    def tensors(self) -> list[int]:
        """The element counts of every parameter tensor of the causal LM (tied embeddings counted once)."""
        embedding = self.vocab_size * self.hidden_size
        tensors = [embedding] + self.layer_tensors() * self.layers + [self.hidden_size]  # final norm
        if not self.tied_embeddings:
            tensors.append(embedding)  # the output head
        return tensors

    def parameters(self) -> int:
        """Parameters of the causal LM."""
        return sum(self.tensors())

    def layer_parameters(self) -> int:
        return sum(self.layer_tensors())

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def norm_parameters(self) -> int:
        """Parameters of the RMSNorms: every block's and the final one."""
        return self.layers * sum(self.layer_norm_tensors()) + self.hidden_size

    def linear_parameters(self) -> int:
        """Parameters of the ``nn.Linear`` layers (weights and biases; an untied output head is one): all but
        the embeddings and the norms."""
        return self.parameters() - self.embedding_parameters() - self.norm_parameters()

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of KV cache one token takes in every layer (keys and values, ``dtype_bytes`` each)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_config(cls, name: str, config: Any) -> ModelShape:
        """The shape of a ``transformers`` config (its text config, for a multimodal one)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        model_type = str(getattr(text, "model_type", ""))
        family = _FAMILY_OF_MODEL_TYPE.get(model_type)
        if family is None:
            raise ValueError(
                f"cannot plan for {name!r}: model_type {model_type!r} is not one the plan counts "
                f"({', '.join(sorted(_FAMILY_OF_MODEL_TYPE))})"
            )
        heads = int(text.num_attention_heads)
        hidden = int(text.hidden_size)
        head_dim = getattr(text, "head_dim", None) or hidden // heads
        return cls(
            name=name,
            family=family,
            hidden_size=hidden,
            intermediate_size=int(text.intermediate_size),
            layers=int(text.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab_size=int(text.vocab_size),
            tied_embeddings=bool(
                getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", True))
            ),
            attention_bias=bool(getattr(text, "attention_bias", False)) and family == "llama",
            mlp_bias=bool(getattr(text, "mlp_bias", False)),
        )


def _qwen25(name: str, hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, tied: bool):
    return ModelShape(name, "qwen2", hidden, inter, layers, heads, kv, hidden // heads, vocab, tied)


#: Published ``config.json`` values (facts of each model card's repository, read at
#: https://huggingface.co/<name>/blob/main/config.json): the papers' policies, R-Search's judge and the
#: bundled models (by their alias and their hub name).
PUBLISHED_SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        _qwen25("Qwen/Qwen2.5-3B", 2048, 11008, 36, 16, 2, 151936, True),
        _qwen25("Qwen/Qwen2.5-3B-Instruct", 2048, 11008, 36, 16, 2, 151936, True),
        _qwen25("Qwen/Qwen2.5-7B", 3584, 18944, 28, 28, 4, 152064, False),
        _qwen25("Qwen/Qwen2.5-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, False),
        ModelShape("meta-llama/Llama-3.2-3B-Instruct", "llama", 3072, 8192, 28, 24, 8, 128, 128256, True),
        ModelShape("HuggingFaceTB/SmolLM2-135M-Instruct", "llama", 576, 1536, 30, 9, 3, 64, 49152, True),
        ModelShape("google/gemma-3-270m", "gemma3", 640, 2048, 18, 4, 1, 256, 262144, True),
    )
}
#: The bundled models' aliases (``llm/models.py``) and the hub models they were converted from.
BUNDLED_ORIGINS = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
}


def model_shape(name_or_path: str) -> ModelShape:
    """The shape of ``name_or_path`` (a local directory, a published or bundled model, or a hub name in the
    local cache), read without downloading anything; see the module docstring."""
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file():
        return _local_shape(name_or_path, str(path))
    published = PUBLISHED_SHAPES.get(BUNDLED_ORIGINS.get(name_or_path, name_or_path))
    if published is not None:
        return published
    try:
        return _local_shape(name_or_path, name_or_path)
    except OSError:
        raise ValueError(
            f"cannot plan for model {name_or_path!r}: it is neither a local directory with a config.json, "
            f"nor one of the published shapes ({', '.join(PUBLISHED_SHAPES)}), nor in the local Hugging Face "
            "cache; pass a directory that holds its config.json"
        ) from None


def _local_shape(name: str, where: str) -> ModelShape:
    from transformers import AutoConfig

    return ModelShape.from_config(name, AutoConfig.from_pretrained(where, local_files_only=True))


#: Parameters of the papers' retriever encoders (``transformers.AutoModel`` with its pooler, as the
#: retriever loads them), for plans made where the encoder is not on disk.
PUBLISHED_ENCODERS = {"intfloat/e5-base-v2": 109_482_240}


def encoder_parameters(name_or_path: str) -> int | None:
    """Parameters of a retriever's query encoder (a bundled alias, a local directory, a published encoder or
    a hub name in the local cache); None when none of them knows it."""
    if name_or_path in PUBLISHED_ENCODERS:
        return PUBLISHED_ENCODERS[name_or_path]
    import torch
    from transformers import AutoConfig, AutoModel

    from rllib_search.serve.retrieval.encoders import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(name_or_path), local_files_only=True)
    except (OSError, ValueError):
        return None
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(parameter.numel() for parameter in model.parameters())
