"""``rllib-search train`` and ``python -m rllib_search``: the recipe list, each recipe's help, the tuned
examples as thin callers of the same functions, and one real --smoke run from outside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_search.cli import TRAIN_RECIPES, main
from tests.helpers import tuned_example

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["search_r1_grpo", "search_r1_ppo", "r1_searcher", "r_search_grpo", "tiny_cpu", "lambda_sweep"]
#: The tuned example that runs each recipe.
EXAMPLES = {name: name for name in RECIPES} | {"tiny_cpu": "tiny_cpu_grpo"}


def environment() -> dict[str, str]:
    """This process's environment without a cluster address: a command starts its own local Ray."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def command(*argv: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "rllib_search", *argv],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_list_names_every_recipe_once_a_line(capsys):
    assert list(TRAIN_RECIPES) == RECIPES
    assert main(["train", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == RECIPES
    assert all(len(line) <= 110 for line in lines)
    assert main(["train"]) == 0  # no recipe: the same list, and how to go on
    out = capsys.readouterr().out
    assert all(name in out for name in RECIPES) and "RECIPE --help" in out


def test_the_installed_command_lists_the_recipes(tmp_path):
    script = Path(sys.executable).parent / "rllib-search"
    if not script.exists():
        pytest.skip("rllib-search is not installed beside this interpreter")
    done = subprocess.run(
        [str(script), "train", "--list"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == RECIPES


def test_python_m_rllib_search_help_lists_every_command(tmp_path):
    out = command("--help", cwd=tmp_path).stdout
    assert out.startswith("usage: rllib-search")
    for name in ("train", "world", "rollout", "index", "serve", "eval"):
        assert f"\n    {name} " in out, name  # a line of the command list, with its description
        assert f"rllib-search {name} " in out, name  # and an example
    assert "rllib-search train --list" in out


def test_an_unknown_recipe_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "search_r2"])
    assert exited.value.code == 2 and "unknown recipe 'search_r2'" in capsys.readouterr().err


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_help_shows_its_flags_as_its_tuned_example_does(name, capsys):
    """`rllib-search train RECIPE --help` shows the recipe's flags, the same as its tuned example's."""
    with pytest.raises(SystemExit) as exited:
        main(["train", name, "--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith(f"usage: rllib-search train {name} ")
    assert f"rllib-search train {name}" in help_text.split("options:")[0]  # the description's examples
    with pytest.raises(SystemExit):
        tuned_example(EXAMPLES[name]).main(["--help"])
    example_help = capsys.readouterr().out
    assert flags(help_text) == flags(example_help) and "--smoke" in flags(help_text)
    if name == "search_r1_grpo":
        assert {"--lambda-format", "--lambda-retrieval", "--data", "--retriever-url"} <= flags(help_text)
    if name == "tiny_cpu":
        assert {"--warm-start", "--rl-iterations", "--bf16"} <= flags(help_text)


def flags(help_text: str) -> set[str]:
    """The long options a help text lists under "options:"."""
    options = help_text.split("options:")[1]
    return {word.rstrip(",") for word in options.split() if word.startswith("--")}


def test_the_cpu_main_job_parser_lives_in_the_package():
    from rllib_search.recipes.tiny_cpu import cli

    example = tuned_example("tiny_cpu_grpo")
    assert example.build_parser is cli.build_parser and example.parse_config is cli.parse_config
    assert example.main is cli.main
    config, measured = cli.parse_config(["--smoke", "--no-bf16"], prog="rllib-search train tiny_cpu")
    assert config == cli.TinyCPUConfig().smoke() and not measured


@pytest.mark.slow
def test_train_runs_a_recipe_smoke_from_outside_the_repository(tmp_path):
    """`python -m rllib_search train search_r1_grpo --smoke` in a directory that is not the repository (no
    tuned_examples/ to import): a local Ray, the embedded world, the served retriever, one iteration with
    held-out questions, a checkpoint, summary.json and training.png (a tiny policy stands in for SmolLM2)."""
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

    model = build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok"))
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = work / "out"
    argv = ["train", "search_r1_grpo", "--smoke", "--model", str(model), "--out", str(out), "--num-cpus", "2"]
    stdout = command(*argv, cwd=work, timeout=900).stdout
    assert "Ray dashboard: http://127.0.0.1:" in stdout and "iter   1/1" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["example"] == "search_r1_grpo" and summary["scale"] == "smoke"
    assert len(summary["iterations"]) == 1 and summary["iterations"][0]["held_out"]["num_questions"] == 8
    assert Path(summary["checkpoint"], "learner_group").is_dir()
    assert (out / "training.png").stat().st_size > 0
