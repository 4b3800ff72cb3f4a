"""Model loading (tiny models by path, the bundled SmolLM2 through its converted cache) and LoRA helpers."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import pytest
import torch

from rllib_search.llm.models import (
    BUNDLED_MODELS,
    _move_into_place,
    apply_lora,
    cache_dir,
    cpu_description,
    cpu_has_native_bf16,
    cpu_precision,
    cpu_times,
    decide_cpu_precision,
    describe_cpu,
    linears_in_autocast_dtype,
    load_causal_lm,
    lora_state_dict,
    matmul_gflops,
    merged_state_dict,
    one_gguf_parse,
    steal_share,
    train_top_layers,
)
from rllib_search.llm.tiny import build_tiny_causal_lm


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"))


def _randomise_lora(model, seed: int = 0) -> None:
    """Give the adapters non-zero weights (peft starts lora_B at zero, so a fresh adapter changes nothing)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def test_tiny_model_builds_and_loads_by_path(tiny_path):
    model, tokenizer = load_causal_lm(str(tiny_path))
    assert model.config.vocab_size == len(tokenizer)
    assert (
        model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    )
    assert model.config.pad_token_id == tokenizer.pad_token_id is not None
    assert next(model.parameters()).dtype == torch.float32
    messages = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([tokenizer.encode("<search> query </search>")])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_tiny_model_depends_on_seed_only(tmp_path, tiny_path):
    state = torch.random.get_rng_state()
    same = build_tiny_causal_lm(tmp_path / "same", tokenizer_dir_or_none=tiny_path)
    other = build_tiny_causal_lm(tmp_path / "other", tokenizer_dir_or_none=tiny_path, seed=1)
    assert torch.equal(state, torch.random.get_rng_state())
    reference = load_causal_lm(str(tiny_path))[0].state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(load_causal_lm(str(same))[0].state_dict()[name], reference[name])
    assert not torch.equal(load_causal_lm(str(other))[0].state_dict()[name], reference[name])


def test_lora_trains_adapters_only(tiny_path):
    model = apply_lora(load_causal_lm(str(tiny_path))[0], r=4, alpha=8)
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    adapters = lora_state_dict(model)
    assert set(adapters) == trainable
    ids = torch.tensor([[5, 6, 7, 8]])
    model(ids, labels=ids).loss.backward()
    assert all(param.grad is not None for name, param in model.named_parameters() if name in trainable)
    assert all(param.grad is None for name, param in model.named_parameters() if name not in trainable)


def test_train_top_layers_trains_the_top_blocks_and_final_norm_only(tiny_path):
    model = train_top_layers(load_causal_lm(str(tiny_path))[0], 1)
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable == {
        name for name, _ in model.named_parameters() if name.startswith("model.layers.1.")
    } | {"model.norm.weight"}
    ids = torch.tensor([[5, 6, 7, 8]])
    model(ids, labels=ids).loss.backward()
    assert all(param.grad is not None for name, param in model.named_parameters() if name in trainable)
    assert all(param.grad is None for name, param in model.named_parameters() if name not in trainable)
    for count in (0, 3):
        with pytest.raises(ValueError, match="train_top_layers"):
            train_top_layers(load_causal_lm(str(tiny_path))[0], count)


def test_lora_with_gradient_checkpointing_gets_gradients(tiny_path):
    model, _ = load_causal_lm(str(tiny_path), gradient_checkpointing=True)
    model = apply_lora(model, r=4, target_modules=["q_proj", "v_proj"])
    model.train()
    ids = torch.tensor([[5, 6, 7, 8]])
    model(ids, labels=ids).loss.backward()
    grads = [param.grad for name, param in model.named_parameters() if "lora_A" in name]
    assert grads and all(grad is not None for grad in grads)


def test_merged_state_dict_reproduces_the_adapted_model(tiny_path):
    peft_model = apply_lora(load_causal_lm(str(tiny_path))[0], r=4)
    _randomise_lora(peft_model)
    plain, _ = load_causal_lm(str(tiny_path))
    merged = merged_state_dict(peft_model)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, peft_model(ids).logits, atol=1e-5, rtol=1e-5)
    assert all("lora_" not in name for name in merged)


@pytest.mark.parametrize("tied", [False, True])
def test_a_frozen_model_under_autocast_computes_the_same_bits_with_its_linears_stored_in_bf16(
    tiny_path, tied
):
    """Autocast casts a Linear's fp32 weight to bf16 at each product; stored in bf16, it is the same weight.
    A tied output projection shares the embeddings' weight (not cast by autocast) and keeps fp32."""
    model, _ = load_causal_lm(str(tiny_path))
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval().requires_grad_(False)
    compact = linears_in_autocast_dtype(copy.deepcopy(model), torch.bfloat16)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89], [2, 71, 82, 81, 8, 28, 18]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(compact(ids).logits, model(ids).logits)
    weights = dict(compact.named_parameters(remove_duplicate=False))
    assert weights["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert weights["model.embed_tokens.weight"].dtype == torch.float32
    assert weights["lm_head.weight"].dtype == (torch.float32 if tied else torch.bfloat16)
    assert compact.lm_head.weight is compact.model.embed_tokens.weight or not tied
    size = sum(p.numel() * p.element_size() for p in compact.parameters())
    assert size < 0.75 * sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.slow
def test_bundled_smollm2_converts_once_then_loads_from_cache():
    load_causal_lm("smollm2-135m-instruct")  # converts on the first run on this machine (~30 s)
    cached = cache_dir() / "models" / "smollm2-135m-instruct"
    assert (cached / "config.json").exists() and (cached / "tokenizer_config.json").exists()
    assert not list(cached.parent.glob("smollm2-135m-instruct.tmp*"))
    converted_at = (cached / "config.json").stat().st_mtime_ns
    model, tokenizer = load_causal_lm("smollm2-135m-instruct")  # from the cache: no second conversion
    assert (cached / "config.json").stat().st_mtime_ns == converted_at
    assert model.name_or_path == str(cached)
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert not hasattr(model.config, "quantization_config")
    assert 130e6 < sum(param.numel() for param in model.parameters()) < 140e6


@pytest.mark.slow
def test_processes_converting_the_bundled_tokenizer_at_once_all_get_it(tmp_path):
    """Parallel test workers (and a sweep's trials) on a fresh machine convert the same bundled file at
    once: every process gets the tokenizer, one copy is left, and no staging directory."""
    code = (
        "from rllib_search.llm.models import load_tokenizer;"
        "print(len(load_tokenizer('smollm2-135m-instruct')))"
    )
    env = {**os.environ, "RLLIB_SEARCH_CACHE": str(tmp_path)}
    workers = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    assert [worker.communicate(timeout=300)[0].strip() for worker in workers] == ["49152"] * 3
    assert [worker.returncode for worker in workers] == [0, 0, 0]
    assert [p.name for p in (tmp_path / "tokenizers").iterdir()] == ["smollm2-135m-instruct"]


@pytest.mark.slow
def test_one_gguf_parse_reads_what_the_library_reader_reads_once_per_file():
    """The conversion's reader (plain slices, one per file) gives the library reader's fields and tensors,
    array for array, on the bundled SmolLM2; the tensor-name map is built once; blocks nest; the library's
    functions are back after the block, also after an error."""
    import gguf
    import numpy as np

    path = BUNDLED_MODELS["smollm2-135m-instruct"].gguf_path()
    library = gguf.GGUFReader(path)
    with one_gguf_parse():
        reader = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is reader  # the same file: no second parse
        with one_gguf_parse():  # nested, as a conversion loading its tokenizer
            assert gguf.GGUFReader(path) is reader
        name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is name_map
    assert list(reader.fields) == list(library.fields)
    for name, field in library.fields.items():
        ours = reader.fields[name]
        assert ours.types == field.types and ours.data == field.data, name
        assert len(ours.parts) == len(field.parts), name
        for a, b in zip(ours.parts, field.parts, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert [t.name for t in reader.tensors] == [t.name for t in library.tensors]
    for ours, theirs in zip(reader.tensors, library.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type and np.array_equal(ours.shape, theirs.shape)
        assert np.array_equal(ours.data, theirs.data), ours.name
    assert gguf.GGUFReader is type(library)
    with pytest.raises(RuntimeError), one_gguf_parse():
        raise RuntimeError("a failed conversion")
    assert gguf.GGUFReader is type(library)
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is not name_map


def test_a_losing_conversion_discards_its_copy_and_a_broken_one_raises(tmp_path):
    cached = tmp_path / "model"
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    staged = tmp_path / "model.tmp1"
    staged.mkdir()
    (staged / "config.json").write_text('{"staged": true}')
    _move_into_place(staged, cached, complete="config.json")  # the winner's copy stays
    assert not staged.exists() and (cached / "config.json").read_text() == "{}"
    (cached / "config.json").unlink()
    (cached / "partial").write_text("")  # a directory in the way that is not a finished copy
    staged.mkdir()
    with pytest.raises(OSError):
        _move_into_place(staged, cached, complete="config.json")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_speed_is_the_products_flops_over_its_best_time(dtype, monkeypatch):
    """The machine speed a run records: a real product in the run's dtype, timed; on a clock that reads
    2 ms for every product, (2 x 64 x 32 x 16) FLOPs / 2 ms."""
    measured = matmul_gflops(dtype, shape=(64, 32, 16), repeats=3)
    assert 0.0 < measured < 1e6

    ticks = iter(range(0, 100, 2))
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) / 1000)
    assert matmul_gflops(dtype, shape=(64, 32, 16), repeats=3) == pytest.approx(
        2 * 64 * 32 * 16 / 0.002 / 1e9
    )


def test_bf16_is_chosen_only_where_its_products_pay():
    """bf16 units alone do not make bf16 the faster precision: on a CPU whose hypervisor hides AMX, bf16
    products can run at half fp32's speed. The rule: native, and at least 0.75x fp32's speed."""
    hidden_amx = decide_cpu_precision(True, fp32_gflops=345.0, bf16_gflops=169.0)
    assert not hidden_amx.bf16 and hidden_amx.bf16_ratio == pytest.approx(169 / 345)
    assert "0.49x fp32's" in hidden_amx.reason() and "169 vs 345 GFLOP/s" in hidden_amx.reason()
    assert decide_cpu_precision(True, fp32_gflops=300.0, bf16_gflops=2400.0).bf16  # AMX
    assert decide_cpu_precision(True, fp32_gflops=400.0, bf16_gflops=300.0).bf16  # at the threshold
    assert not decide_cpu_precision(True, fp32_gflops=400.0, bf16_gflops=299.0).bf16
    emulated = decide_cpu_precision(False, fp32_gflops=100.0, bf16_gflops=900.0)
    assert not emulated.bf16 and emulated.bf16_ratio is None and "emulated" in emulated.reason()


def test_this_cpus_precision_is_measured_once_and_follows_the_rule():
    """On this machine: no product is timed where bf16 is emulated; elsewhere both are, and the choice is the
    rule's on those speeds. The choice is cached, so a process asks the probe once."""
    chosen = cpu_precision()
    assert chosen is cpu_precision()
    assert chosen.native_bf16 == cpu_has_native_bf16()
    if not chosen.native_bf16:
        assert not chosen.bf16 and chosen.fp32_gflops is None and chosen.bf16_gflops is None
    else:
        assert chosen.fp32_gflops > 0 and chosen.bf16_gflops > 0
        assert chosen == decide_cpu_precision(True, chosen.fp32_gflops, chosen.bf16_gflops)


def test_the_cpu_is_named_with_its_family_where_the_kernel_reports_it():
    """A hypervisor may call every EPYC "AMD EPYC"; the family and model numbers tell Zen 2 from Zen 5.
    Older descriptions recorded without them still read as one line."""
    here = cpu_description()
    assert here["cpu"] and here["cores"] >= 1
    if os.path.exists("/proc/cpuinfo"):
        assert isinstance(here["cpu_family"], int) and isinstance(here["cpu_model"], int)
    older = {k: v for k, v in here.items() if k not in ("cpu_family", "cpu_model")}
    named = {**older, "cpu": "AMD EPYC", "cpu_family": 26, "cpu_model": 2, "vector_unit": "AVX512"}
    assert describe_cpu(named).startswith("AMD EPYC (family 26 model 2), ")
    assert describe_cpu({**older, "cpu": "AMD EPYC"}).startswith("AMD EPYC, ")


def test_steal_share_is_the_hypervisors_part_of_the_cpu_time_between_two_readings():
    """Read from the system's CPU times: the stolen time over all the CPU time between the readings."""
    start = cpu_times()
    if start is None:
        pytest.skip("this system reports no steal time")
    time.sleep(0.05)  # a clock tick (10 ms) or more between the readings
    end = cpu_times()
    assert end["total"] >= start["total"] and end["steal"] >= start["steal"]
    share = steal_share(start, end)
    assert share is None or 0.0 <= share <= 1.0
    assert steal_share({"total": 1000, "steal": 10}, {"total": 1400, "steal": 30}) == pytest.approx(0.05)
    assert steal_share({"total": 1000, "steal": 10}, {"total": 1000, "steal": 10}) is None
    assert steal_share(None, end) is None
