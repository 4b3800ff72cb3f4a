"""Freed host memory goes back to the OS, and weight snapshots round-trip exactly through disk and mix in
place."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rllib_search.llm.host_memory import collect_and_release, release_free_heap
from rllib_search.recipes.tiny_cpu.weight_interpolation import WeightStore, interpolate_weights
from rllib_search.serve.memory import resident_memory_mb


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_heap_pages_go_back_to_the_os():
    blocks = [bytearray(b"x" * 64 * 1024) for _ in range(4000)]  # 250 MB of heap-allocated blocks
    last = blocks.pop()  # a live block above the others: the heap's top cannot simply shrink
    blocks.clear()
    held = resident_memory_mb()
    assert release_free_heap()
    assert held - resident_memory_mb() > 150
    assert len(last) == 64 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_memory_held_by_a_dead_reference_cycle_goes_back_to_the_os():
    class Holder:
        pass

    gc.disable()  # as between two runs of the cycle collector
    try:
        holder = Holder()
        holder.self = holder  # a cycle: reference counting alone never frees it
        holder.blocks = [bytearray(b"x" * 64 * 1024) for _ in range(4000)]  # 250 MB
        last = bytearray(b"y" * 64 * 1024)  # a live block above the others
        del holder
        release_free_heap()
        held = resident_memory_mb()
        assert collect_and_release()
        assert held - resident_memory_mb() > 150
        assert len(last) == 64 * 1024
    finally:
        gc.enable()


def test_weights_mixed_in_place_equal_the_mix_bit_for_bit():
    rng = np.random.default_rng(1)
    start = {"m": {"w": rng.standard_normal((8, 4), dtype=np.float32), "step": np.arange(2)}}
    end = {"m": {"w": rng.standard_normal((8, 4), dtype=np.float32), "step": np.arange(2) + 5}}
    expected = interpolate_weights(start, end, 0.25)
    into = end["m"]["w"]
    mixed = interpolate_weights(start, end, 0.25, in_place=True)
    assert mixed["m"]["w"] is into and np.array_equal(mixed["m"]["w"], expected["m"]["w"])
    assert np.array_equal(mixed["m"]["step"], [5, 6])
    tensors = {"w": torch.from_numpy(rng.standard_normal(6, dtype=np.float32))}
    target = {"w": torch.zeros(6)}
    reference = interpolate_weights(tensors, target, 0.5)
    assert interpolate_weights(tensors, target, 0.5, in_place=True)["w"] is target["w"]
    assert torch.equal(target["w"], reference["w"])


def test_weight_snapshots_round_trip_exactly(tmp_path):
    rng = np.random.default_rng(0)
    weights = {
        "default_policy": {"a.weight": rng.standard_normal((64, 32), dtype=np.float32), "b": np.arange(3)}
    }
    store = WeightStore(tmp_path / ".weights")
    name = store.save("warm_start", weights)
    loaded = store.load(name)
    assert loaded["default_policy"].keys() == weights["default_policy"].keys()
    for key, array in weights["default_policy"].items():
        assert loaded["default_policy"][key].dtype == array.dtype
        assert np.array_equal(loaded["default_policy"][key], array)
    mixed = interpolate_weights(store.load(name), weights, 0.25)
    assert np.array_equal(mixed["default_policy"]["a.weight"], weights["default_policy"]["a.weight"])
    store.clear()
    assert not (tmp_path / ".weights").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_allocations_once_mapped_go_back_to_the_os_at_free():
    # In a fresh process: the threshold is process-wide. Under glibc's default, freeing the 30 MB block
    # raises it above 4 MB: each 4 MB block then comes from the heap, below the live 64 kB ones allocated
    # after it, and freeing it gives nothing back.
    script = textwrap.dedent(
        """
        import os
        import numpy as np
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        from rllib_search.llm.host_memory import map_large_allocations
        from rllib_search.serve.memory import resident_memory_mb
        assert map_large_allocations(1 << 20)
        assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(1 << 20)
        first = np.ones(30 << 20, np.uint8)
        del first
        returned, live = 0.0, []
        for _ in range(10):
            block = np.ones(4 << 20, np.uint8)
            live.append(np.ones(64 * 1024, np.uint8))
            before = resident_memory_mb()
            del block
            returned += before - resident_memory_mb()
        print(returned)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert float(out.stdout.strip()) > 35  # each freed 4 MB block went back at once
