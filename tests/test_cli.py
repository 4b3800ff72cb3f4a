"""The main job's command on a small synthetic world, end to end (tokenizer loaded by path)."""

from __future__ import annotations

import json

from rllib_search.cli import main


def test_rollout_command(tmp_path):
    from rllib_search.llm.tiny import build_tiny_causal_lm

    tokenizer_dir = build_tiny_causal_lm(tmp_path / "tiny_lm")  # the model's folder holds its tokenizer
    out = tmp_path / "out"
    argv = [
        "rollout",
        "--world",
        str(tmp_path / "world"),
        "--train",
        "50",
        "--test",
        "40",
        "--tokenizer",
        str(tokenizer_dir),
        "--episodes",
        "12",
        "--out",
        str(out),
        "--lambda-format",
        "0.2",
        "--llm-model",
        str(tokenizer_dir),
        "--llm-prompts",
        "2",
        "--llm-turn-tokens",
        "8",
    ]
    assert main(argv) == 0
    rows = {(r["protocol"], r["policy"]): r for r in json.loads((out / "summary.json").read_text())}
    assert len(rows) == 10
    llm = rows[("search_r1", f"llm:{tokenizer_dir}")]
    assert llm["episodes"] == 4 and 0.0 <= llm["valid_action_rate"] <= 1.0 and llm["generated_tokens"] > 0
    for protocol in ("search_r1", "r1_searcher", "r_search"):
        teacher, noisy, guess = (rows[(protocol, p)] for p in ("teacher", "noisy_teacher", "no_search"))
        # The teacher follows each question's hop chain through the real BM25 index and always answers right.
        assert (
            teacher["exact_match"] == 1.0
            and teacher["format_valid"] == 1.0
            and teacher["invalid_actions"] == 0
        )
        assert teacher["searches"] >= 1.0
        assert noisy["invalid_actions"] > 0
        assert guess["searches"] == 0 and guess["reward"] < teacher["reward"]
    # λ_f = 0.2: a well-formatted wrong answer earns 0.2 under search_r1, a right one 1.
    guess = rows[("search_r1", "no_search")]
    assert abs(guess["reward"] - (guess["exact_match"] + 0.2 * (1 - guess["exact_match"]))) < 1e-9
    assert (out / "rewards.png").stat().st_size > 0
    assert "<answer>" in (out / "examples.txt").read_text()
