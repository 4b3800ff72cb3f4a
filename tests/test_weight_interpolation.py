"""WiSE-FT's interpolation between two weight trees (``recipes/tiny_cpu/weight_interpolation.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_search.recipes.tiny_cpu.weight_interpolation import interpolate_weights


def weight_tree(seed: int) -> dict:
    """A tree shaped as ``LearnerGroup.get_weights()`` returns it, with numpy and torch leaves."""
    rng = np.random.default_rng(seed)
    return {
        "default_policy": {
            "lm_head.weight": rng.standard_normal((4, 3)).astype(np.float32),
            "norm.weight": torch.from_numpy(rng.standard_normal(3).astype(np.float32)),
            "position_ids": np.arange(5, dtype=np.int64) + seed,
        }
    }


def test_the_ends_and_the_middle_of_the_line():
    start, end = weight_tree(0), weight_tree(1)
    for alpha, expected in ((0.0, start), (1.0, end)):
        mixed = interpolate_weights(start, end, alpha)["default_policy"]
        np.testing.assert_array_equal(mixed["lm_head.weight"], expected["default_policy"]["lm_head.weight"])
        torch.testing.assert_close(mixed["norm.weight"], expected["default_policy"]["norm.weight"])
    middle = interpolate_weights(start, end, 0.25)["default_policy"]
    a, b = start["default_policy"], end["default_policy"]
    expected_head = 0.75 * a["lm_head.weight"] + 0.25 * b["lm_head.weight"]
    np.testing.assert_allclose(middle["lm_head.weight"], expected_head, rtol=1e-6)
    torch.testing.assert_close(middle["norm.weight"], 0.75 * a["norm.weight"] + 0.25 * b["norm.weight"])
    assert middle["lm_head.weight"].dtype == np.float32 and middle["norm.weight"].dtype == torch.float32
    # Integer leaves are not mixed: they are the end's, copied (changing one leaves the tree as it was).
    np.testing.assert_array_equal(middle["position_ids"], b["position_ids"])
    middle["position_ids"][0] = -1
    assert b["position_ids"][0] == 1
    np.testing.assert_allclose(a["lm_head.weight"], weight_tree(0)["default_policy"]["lm_head.weight"])


def test_trees_that_do_not_match_and_alphas_off_the_line_are_refused():
    start, end = weight_tree(0), weight_tree(1)
    with pytest.raises(ValueError, match="alpha must lie"):
        interpolate_weights(start, end, 1.5)
    missing = {"default_policy": dict(start["default_policy"])}
    del missing["default_policy"]["norm.weight"]
    with pytest.raises(ValueError, match="differ in their keys"):
        interpolate_weights(missing, end, 0.5)
    reshaped = {"default_policy": {**start["default_policy"], "lm_head.weight": np.zeros((3, 4), np.float32)}}
    with pytest.raises(ValueError, match="no counterpart"):
        interpolate_weights(reshaped, end, 0.5)
    other = {"default_policy": {**start["default_policy"], "norm.weight": torch.zeros(4)}}
    with pytest.raises(ValueError, match="no counterpart"):
        interpolate_weights(other, end, 0.5)
