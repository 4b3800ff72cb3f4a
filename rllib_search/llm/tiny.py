"""Tiny tokenizers (and, later, models) built from scratch for fast tests and smoke runs.

They go through the same loading code as real ones: build, ``save_pretrained`` to a directory, load back
by path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_DEFAULT_CORPUS = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. "
    "<search> query </search> <information> Doc 1(Title: Velmora) Velmora is a city. </information> "
    "<answer> Beijing </answer> <observation> <original_evidence> evidence </original_evidence> "
    "<|begin_of_query|> keywords <|end_of_query|> <|begin_of_documents|> (1) doc <|end_of_documents|> "
    "The quick brown fox jumps over the lazy dog. Who founded the company? Where was he born? "
)


def build_tiny_tokenizer(
    out_dir: str | Path, vocab_size: int = 512, texts: Iterable[str] | None = None
) -> Path:
    """Train a byte-level BPE tokenizer of ``vocab_size`` with a ChatML chat template and save it to
    ``out_dir`` (any text encodes: bytes are the fallback). Returns the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts) if texts is not None else [_DEFAULT_CORPUS] * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    out = Path(out_dir)
    fast.save_pretrained(out)
    return out
