"""Tiny tokenizers and causal language models built from scratch for fast tests and smoke runs.

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


def build_tiny_causal_lm(
    out_dir: str | Path,
    tokenizer_dir_or_none: str | Path | None = None,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,
    seed: int = 0,
) -> Path:
    """Build a randomly initialised Llama model over a tiny tokenizer and save both to ``out_dir``.

    The tokenizer comes from ``tokenizer_dir_or_none`` or is built with :func:`build_tiny_tokenizer`; it
    keeps its ChatML chat template. The vocabulary is ``len(tokenizer)``; eos and pad ids are set in the
    config and the generation config. The weights depend on ``seed`` only (the global RNG is left as it
    was). Load the result with ``load_causal_lm(out_dir)``. Returns the directory.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    tokenizer_dir = tokenizer_dir_or_none or build_tiny_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def teach_to_emit(
    model_dir: str | Path,
    out_dir: str | Path,
    questions: list[str],
    text: str | list[str],
    steps: int = 120,
    lr: float = 3e-3,
    system: str | None = None,
) -> Path:
    """Train the model in ``model_dir`` for a few steps to answer each chat-templated question with ``text``
    (loss on ``text`` only), and save it to ``out_dir``. With the default tiny model, greedy and sampled
    generations then follow ``text``: a quick way to get a policy that emits a protocol's tags, so stop
    strings and searches actually happen in tests and benchmarks. A list of texts is taught in turns: the
    model then samples each about equally often. ``system`` is a system message before each question
    (protocols whose instruction is one, such as R-Search's). Returns ``out_dir``."""
    import torch

    from rllib_search.llm.models import load_causal_lm

    model, tokenizer = load_causal_lm(str(model_dir))
    targets = [tokenizer.encode(t) for t in ([text] if isinstance(text, str) else text)]
    prompts = []
    for question in questions:
        messages = [{"role": "user", "content": question}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(chat, add_special_tokens=False)["input_ids"])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        prompt = prompts[step % len(prompts)]
        target = targets[(step // len(prompts)) % len(targets)]
        ids = torch.tensor([prompt + target])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        optimizer.zero_grad()
        model(ids, labels=labels).loss.backward()
        optimizer.step()
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
