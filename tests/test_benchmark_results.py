"""Every benchmark writes its results through ``benchmarks/results_file.py``'s ``write_results``: the commit
and the machine beside the figures, then the final JSON line. And the soak's checks (growth, and a
least-squares RSS trend per process kind) and its writer, on memory samples made up here."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import results_file
from benchmarks.results_file import git_commit, write_results

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(path.stem for path in (ROOT / "benchmarks").glob("*.py"))
# Modules of benchmarks/ that write no results file.
NO_RESULTS = {
    "results_file": "the shared writer itself",
    "naive_retrieval_server": "the baseline server retriever_bench.py starts",
}
MACHINE_KEYS = {"cpu", "cpu_family", "cpu_model", "cores", "torch_threads", "vector_unit", "native_bf16"}


def called_names(tree: ast.AST) -> set[str]:
    """The names of every function a module calls (``f(...)`` and ``x.f(...)`` both give ``f``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return names


def results_writes_of_its_own(tree: ast.AST, source: str) -> list[str]:
    """Calls that write a JSON file into ``RESULTS`` without ``write_results``: ``json.dump(...)`` and
    ``<... RESULTS ...>.write_text(...)``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        receiver = ast.get_source_segment(source, node.func.value) or ""
        if node.func.attr == "dump" and receiver == "json":
            found.append(ast.get_source_segment(source, node))
        if node.func.attr == "write_text" and "RESULTS" in receiver:
            found.append(ast.get_source_segment(source, node))
    return found


def test_the_benchmark_list_is_the_directory():
    assert {"soak", "retriever_bench", "fuzz_http", "main_job_seeds"} <= set(BENCHMARKS)
    assert set(NO_RESULTS) <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_writes_its_results_through_write_results(name):
    module = importlib.import_module(f"benchmarks.{name}")
    source = Path(module.__file__).read_text()
    tree = ast.parse(source)
    assert results_writes_of_its_own(tree, source) == []
    assert "rev-parse" not in source or name == "results_file", "the commit is read by results_file only"
    if name in NO_RESULTS:
        return
    # The shared function itself (imported, not a copy), and called.
    assert getattr(module, "write_results", None) is results_file.write_results, name
    assert "write_results" in called_names(tree), name


def test_write_results_records_the_commit_and_the_machine_and_prints_the_final_line(tmp_path, capsys):
    figures = {"benchmark": "example", "speedup": 1.5, "rows": [1, 2]}
    path = write_results("example", figures, headline={"speedup": 1.5}, directory=tmp_path)
    assert path == tmp_path / "example.json"
    written = json.loads(path.read_text())
    assert list(written)[:3] == ["benchmark", "commit", "machine"]
    assert {k: written[k] for k in figures} == figures
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert written["commit"] in (head, f"{head}-dirty")
    assert set(written["machine"]) >= MACHINE_KEYS
    assert isinstance(written["machine"]["cores"], int) and written["machine"]["cores"] >= 1
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == {"commit": written["commit"], "machine": written["machine"], "speedup": 1.5}
    # Without a headline the line is the whole document; a name may carry its .json.
    write_results("example.json", figures, directory=tmp_path)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(path.read_text())


def test_write_results_refuses_figures_that_carry_commit_or_machine(tmp_path):
    with pytest.raises(ValueError, match="machine"):
        write_results("example", {"benchmark": "example", "machine": "2 cores"}, directory=tmp_path)
    assert not (tmp_path / "example.json").exists()


def test_the_commit_is_head_with_dirty_when_the_code_changed_and_none_outside_git(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    assert git_commit(repo) is None  # not a checkout

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    git("init", "-q")
    (repo / "a.txt").write_text("one")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert git_commit(repo) == head
    (repo / "a.txt").write_text("two")
    assert git_commit(repo) == f"{head}-dirty"
    (repo / "a.txt").write_text("one")
    assert git_commit(repo) == head
    # Results other benchmarks wrote before this one leave the commit clean.
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "benchmarks" / "results" / "earlier.json").write_text("{}")
    assert git_commit(repo) == head
    (repo / "new.txt").write_text("untracked")
    assert git_commit(repo) == f"{head}-dirty"
    monkeypatch.setenv("PATH", str(tmp_path / "no_git_here"))
    assert git_commit(repo) is None  # no git at all


# --- the soak's checks on made-up memory samples --------------------------------------------------------


def made_up_memory(iterations: int = 200, every: int = 5, leak_per_iteration: float = 0.2) -> SimpleNamespace:
    """Samples as ``NodeMemory`` keeps them: a learner leaking ``leak_per_iteration`` MB an iteration (with
    a saw-tooth of allocator noise), a flat driver, two flat EnvRunners, and an idle worker that appears
    half-way (left out of the trend)."""
    labels = {1: "learner", 2: "driver", 3: "LLMEnvRunner", 4: "LLMEnvRunner", 5: "IDLE"}
    samples = []
    for iteration in range(0, iterations + 1, every):
        noise = 1.5 if (iteration // every) % 2 else -1.5
        processes = {
            1: 900.0 + leak_per_iteration * iteration + noise,
            2: 400.0 - noise,
            3: 700.0 + noise,
            4: 700.0,
        }
        if iteration >= iterations // 2:
            processes[5] = 80.0
        samples.append(
            {
                "iteration": iteration,
                "processes": {pid: {"rss_mb": rss, "uss_mb": rss - 50} for pid, rss in processes.items()},
            }
        )
    return SimpleNamespace(samples=samples, labels=labels)


def test_the_soak_fits_a_trend_per_process_kind_after_the_warm_up():
    from benchmarks import soak

    memory = made_up_memory()
    trend = soak.trends(memory, warmup=20, key="rss_mb")
    assert (trend["from_iteration"], trend["to_iteration"], trend["samples"]) == (20, 200, 37)
    assert trend["max_kind"] == "learner"
    assert trend["per_kind"]["learner"]["mb_per_100_iterations"] == pytest.approx(20.0, abs=0.5)
    assert abs(trend["per_kind"]["driver"]["mb_per_100_iterations"]) < 0.5
    assert trend["per_kind"]["LLMEnvRunner"]["processes"] == 2  # the kind's processes, summed
    assert "IDLE" not in trend["per_kind"] and trend["left_out"] == ["IDLE#5"]
    line = trend["per_kind"]["learner"]["line_mb"]
    assert line[1] - line[0] == pytest.approx(0.2 * 180, abs=1.0)


def test_the_soak_fails_a_steady_leak_under_the_growth_bound_by_its_trend():
    from benchmarks import soak

    memory = made_up_memory()
    args = soak.parse_args(["--iterations", "200", "--warmup", "20"])
    assert (args.bound_mb, args.trend_bound_mb) == (64.0, 10.0)
    rss = soak.growth(memory, args.warmup, "rss_mb")
    assert rss["max"] < args.bound_mb  # 36 MB over 180 iterations: the growth check alone passes it
    checks = soak.verdict(rss, soak.trends(memory, args.warmup, "rss_mb"), args)
    assert checks == {
        "growth_passed": True,
        "trend_passed": False,
        "trend_judged_over_iterations": 180,
        "passed": False,
    }
    flat = made_up_memory(leak_per_iteration=0.0)
    checks = soak.verdict(soak.growth(flat, 20, "rss_mb"), soak.trends(flat, 20, "rss_mb"), args)
    assert checks["passed"] and checks["trend_passed"]


def test_a_short_soak_reports_its_trend_without_judging_it():
    from benchmarks import soak

    args = soak.parse_args(["--quick"])
    assert (args.iterations, args.warmup, args.sample_every) == (12, 4, 1)
    memory = made_up_memory(iterations=12, every=1, leak_per_iteration=2.0)
    trend = soak.trends(memory, args.warmup, "rss_mb")
    assert trend["max_mb_per_100_iterations"] > args.trend_bound_mb
    checks = soak.verdict(soak.growth(memory, args.warmup, "rss_mb"), trend, args)
    assert checks["trend_passed"] is None and checks["passed"]
    assert soak.parse_args([]).iterations == 500 and soak.parse_args([]).warmup == 50


def test_the_soak_writes_its_results_through_write_results(tmp_path, capsys):
    from benchmarks import soak

    memory = made_up_memory()
    args = soak.parse_args(["--iterations", "200", "--warmup", "20", "--judge"])
    history = [
        {"searches": 1.0, "reward": 0.3, "reward_components": {"evidence_f1": 0.5}, "judge_errors": 0.0}
        for _ in range(200)
    ]
    setup = {"protocol": "r_search", "policy": "tiny Llama taught to search"}
    results = soak.report(memory, history, args, setup, seconds=12.0, directory=tmp_path)
    written = json.loads((tmp_path / "soak_judge.json").read_text())
    assert (tmp_path / "soak_judge.png").stat().st_size > 0
    assert written["commit"] == results_file.git_commit() and set(written["machine"]) >= MACHINE_KEYS
    assert written["searches_per_episode"] == {"mean": 1.0, "min": 1.0, "first": 1.0, "last": 1.0}
    assert written["reward_components_mean"] == {"evidence_f1": 0.5}
    assert (written["growth_passed"], written["trend_passed"], written["passed"]) == (True, False, False)
    assert results["passed"] is False
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["rss_trend_max_kind"] == "learner" and last["searches_per_episode"] == 1.0
    assert last["commit"] == written["commit"] and not last["passed"]


@pytest.mark.slow
def test_the_soaks_policy_searches_in_every_episode(tmp_path, world, world_retriever):
    """The tiny policy the soak teaches opens every sampled episode with a search and, after the
    retriever's block, writes R-Search's evidence box and an answer."""
    from benchmarks import soak
    from rllib_search import ENV_ID
    from rllib_search.algos.config import SearchConfig
    from rllib_search.algos.rollouts.env_runner import LLMEnvRunner

    policy = soak.build_policy(tmp_path, "r_search", world.train[:16], world_retriever, seed=0)
    env_config = {
        "retriever": world_retriever,
        "dataset": world.train,
        "protocol": "r_search",
        "max_turns": 3,
        "topk": 2,
        "max_obs_tokens": 100,
        "max_total_tokens": 1024,
    }
    config = (
        SearchConfig()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config={"model": str(policy)})
        .rollouts(group_size=4, prompts_per_sample=4, max_turn_tokens=48, temperature=1.0)
        .debugging(seed=0)
    )
    runner = LLMEnvRunner(config=config)
    rollouts = runner.sample()
    searches = [r.stats["searches"] for r in rollouts]
    assert len(rollouts) == 16 and sum(searches) / len(searches) >= 0.9
    answered = [r for r in rollouts if r.answer is not None]
    assert len(answered) >= 14
    texts = ["".join(runner.tokenizer.decode(r.token_ids[a:b]) for a, b in r.turn_spans) for r in answered]
    assert all("<original_evidence>" in text for text in texts)


def test_every_committed_result_records_its_commit_and_machine():
    """A figure without the code and the machine that gave it cannot be reproduced or compared."""
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        assert result.get("commit"), f"{path.name} records no commit"
        assert set(result.get("machine") or {}) >= MACHINE_KEYS, f"{path.name} records no machine"
