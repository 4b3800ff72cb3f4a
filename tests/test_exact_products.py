"""ExactProducts: a decoding step's matrix products in faster formulations, each only where it gave bitwise
F.linear's result for the product's shape, so the engine's tokens and log-probs are unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rllib_search.llm.engines import SamplingParams
from rllib_search.llm.engines import exact_products as ep
from rllib_search.llm.engines.hf_prefix_cache import PrefixCachingHFEngine
from rllib_search.llm.models import load_causal_lm
from rllib_search.llm.tiny import build_tiny_causal_lm, teach_to_emit

QUESTIONS = [
    "Who founded Quellon Works?",
    "Where was Tarquin Oskaley born?",
    "What is the capital of Dravenia?",
    "Which river runs through Halbryn?",
]
OBSERVATION = "\n\n<information>Doc 1(Title: A) a passage about Halbryn</information>\n\n"


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact_products")
    return teach_to_emit(
        build_tiny_causal_lm(root / "base"),
        root / "taught",
        QUESTIONS,
        "<think> look </think>\n<search> lead singer </search> and more",
    )


def three_turns(engine: PrefixCachingHFEngine, tokenizer, temperature: float) -> list[list]:
    """Each turn's segments (token ids, log-probs, finish reasons) over three turns of four questions."""
    engine.reset_cache()
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in QUESTIONS
    ]
    prefixes = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    params = SamplingParams(temperature=temperature, max_new_tokens=24, stop=("</search>",), seed=5)
    turns = []
    for turn in range(3):
        limits = [24, 5, 11, 24] if turn == 1 else None  # rows finish at different steps: shapes change
        segments = engine.generate(prefixes, params, limits)
        turns.append([(s.token_ids, s.logprobs, s.finish_reason) for s in segments])
        prefixes = [p + s.token_ids + tokenizer.encode(OBSERVATION) for p, s in zip(prefixes, segments)]
    return turns


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_gives_the_same_tokens_and_logprobs_with_exact_products(taught, temperature):
    model, tokenizer = load_causal_lm(str(taught))
    plain = PrefixCachingHFEngine(model, tokenizer, exact_products=False)
    exact = PrefixCachingHFEngine(model, tokenizer)
    assert plain.products is None and exact.products is not None
    assert three_turns(exact, tokenizer, temperature) == three_turns(plain, tokenizer, temperature)
    products = exact.products
    assert products.keys, "the model's products went through it"
    assert products.calls["checked"] == len(products.keys)
    assert sum(products.calls.values()) > 2 * len(products.keys)


def products_at(products: ep.ExactProducts, weights: list[torch.Tensor], rows_seq, generator) -> None:
    """Products of fresh inputs at each row count, each checked bitwise against F.linear."""
    for rows in rows_seq:
        for weight in weights:
            x = torch.randn(rows, 1, weight.shape[1], generator=generator)
            assert torch.equal(products.linear(x, weight), F.linear(x, weight)), (rows, tuple(weight.shape))


def test_every_product_is_f_linears_and_a_key_settles_on_its_fastest_exact_formulation():
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(96, 32, generator=generator), torch.randn(32, 96, generator=generator)]
    products = ep.ExactProducts(trials=2)
    products_at(products, weights, [3, 17] * 10, generator)
    assert len(products.keys) == 4 and products.calls["checked"] == 4
    for known in products.keys.values():
        assert known.exact[0] == "linear"
        assert known.chosen in known.exact  # 1 check + 9 products: more than 2 trials of each candidate
    assert sum(products.calls.values()) == 2 * 20


def test_an_inexact_formulation_never_serves(monkeypatch):
    monkeypatch.setitem(ep.FORMULATIONS, "perturbed", lambda x, w: F.linear(x, w) * (1 + 1e-6))
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 48, generator=generator)
    products = ep.ExactProducts(trials=1)
    products_at(products, [weight], [5] * 6, generator)
    (known,) = products.keys.values()
    assert "perturbed" not in known.exact and products.calls["perturbed"] == 0


def test_products_outside_its_scope_are_left_to_f_linear():
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(64, 48, generator=generator)
    x = torch.randn(4, 48, generator=generator)
    trained = weight.clone().requires_grad_()
    products = ep.ExactProducts(max_rows=8)
    half = products.linear(x.bfloat16(), weight.bfloat16())
    many_rows = products.linear(torch.randn(9, 48, generator=generator), weight)
    with torch.enable_grad():
        differentiable = products.linear(x, trained)
    assert not products.keys and not products.calls
    assert half.dtype == torch.bfloat16 and many_rows.shape == (9, 64)
    assert differentiable.requires_grad
    layer = torch.nn.Linear(48, 64)  # with a bias: its own forward stays
    model = torch.nn.Sequential(torch.nn.Linear(48, 48, bias=False), layer)
    with products.serving(model), torch.no_grad():
        assert "forward" in vars(model[0]) and "forward" not in vars(layer)
        assert torch.equal(model(x), layer(F.linear(x, model[0].weight)))
    assert "forward" not in vars(model[0])
    assert len(products.keys) == 1


def test_a_non_contiguous_input_gets_f_linears_product_too():
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(80, 40, generator=generator)
    products = ep.ExactProducts(trials=1)
    for _ in range(5):
        wide = torch.randn(6, 3, 40, generator=generator)
        x = wide[:, -1:, :]  # a prefill pass's last position: a strided view
        assert not x.is_contiguous()
        assert torch.equal(products.linear(x, weight), F.linear(x, weight))
    assert len(products.keys) == 1 and products.calls["checked"] == 1
