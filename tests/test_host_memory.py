"""Freed host memory goes back to the OS, and weight snapshots round-trip exactly through disk."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rllib_search.llm.host_memory import release_free_heap
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
