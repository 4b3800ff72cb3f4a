"""The README's main job (tuned_examples/tiny_cpu_grpo.py) end to end with a tiny model, in a subprocess
(it starts and stops its own Ray and Serve)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_tiny_cpu_grpo_runs_every_stage_and_saves_a_checkpoint(tmp_path):
    model = build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok"))
    out = tmp_path / "out"
    argv = [
        sys.executable,
        str(ROOT / "tuned_examples" / "tiny_cpu_grpo.py"),
        *("--model", str(model), "--out", str(out), "--threads", "1"),
        *("--sft-steps", "2", "--sft-batch", "4", "--rl-iterations", "2", "--eval-questions", "2"),
        *("--demonstrations", "6", "--two-hop-demonstrations", "2", "--prompts", "2", "--group-size", "2"),
        *("--max-turn-tokens", "12"),
    ]
    env = {**os.environ, "RLLIB_SEARCH_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out evaluation" in done.stdout and "grpo iter  2/2" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [row["stage"] for row in summary["evaluation"]] == ["before", "after warm start", "after RL"]
    assert len(summary["grpo"]) == 2
    assert (out / "training.png").stat().st_size > 0
    assert (out / "warm_start_model" / "config.json").exists()

    assert Path(summary["checkpoint"], "learner_group").is_dir()
