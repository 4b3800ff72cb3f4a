"""Imports run downward (docs/architecture.md, "Imports run downward"), checked by parsing the source.

Every import counts: module-level, inside functions and under ``if TYPE_CHECKING``. A lazy import only
moves a dependency's cost to call time; it is a dependency all the same. The layers, lowest first (a
module belongs to the layer of its longest matching prefix):

- ``metrics``: the table of Ray metric names and ``record`` (``rllib_search/metrics.py``); a leaf that
  imports nothing of the package, so every layer may record a metric;
- ``data``: records (``QARecord``, ``Passage``, the ``Retriever`` protocol), formats, the synthetic world;
- ``env``: protocols, rewards, the multi-turn env, the teacher; may use ``data``;
- ``llm``: models and generation engines; may use ``env`` and ``data``;
- ``serve``: what the services share (``serve.http``, ``serve.cluster``, ``serve.memory``, ...), then the
  retriever and the judge (``serve.retrieval``, ``serve.judge``), then the ``serve`` command;
- ``algos``: the policy model (``algos.model``), sampling (``algos.rollouts``), learning
  (``algos.learners``), checkpoints, then the configs and Algorithms, then evaluation;
- ``recipes``: the papers' configs and jobs, then the studies and the CPU main job built on them;
- ``top``: the package's ``__init__`` and every other top-level module (``cli``, ``registration``, ...).

A module may import its own layer or any lower one. ``tuned_examples/`` and ``benchmarks/`` sit above all
of it: the package never imports them (nor ``tests``). The core (``algos``) knows nothing of the recipes:
the CPU main job's own parts live in ``recipes.tiny_cpu``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "rllib_search"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("rllib_search.metrics",)),
    ("data", ("rllib_search.data",)),
    ("env", ("rllib_search.env",)),
    ("llm", ("rllib_search.llm",)),
    ("serve", ("rllib_search.serve",)),
    ("serve services", ("rllib_search.serve.retrieval", "rllib_search.serve.judge")),
    ("serve command", ("rllib_search.serve.cli",)),
    ("algos model", ("rllib_search.algos.model",)),
    ("algos rollouts", ("rllib_search.algos.rollouts",)),
    ("algos learners", ("rllib_search.algos.learners",)),
    ("algos checkpoints", ("rllib_search.algos.checkpoints",)),
    ("algos", ("rllib_search.algos",)),
    ("algos evaluation", ("rllib_search.algos.evaluation",)),
    ("recipes", ("rllib_search.recipes",)),
    ("recipes studies", ("rllib_search.recipes.findings", "rllib_search.recipes.tiny_cpu")),
)
TOP = len(LAYERS)
FORBIDDEN_ROOTS = ("tuned_examples", "benchmarks", "tests")


def layer_of(module: str) -> int:
    """The rank of a module's layer, by its longest matching prefix; a module of no named layer (a
    top-level one) is on top."""
    best, rank_of_best = -1, TOP
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank_of_best = len(prefix), rank
    return rank_of_best


def layer_name(rank: int) -> str:
    return LAYERS[rank][0] if rank < TOP else "top"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``source``, at any depth; ``from a import b`` names
    the module ``a.b`` when that is a module, else ``a``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield (f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target), node.lineno


def import_graph(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    """Each package module's imports (of anything) with their line numbers."""
    files = module_files(root)
    known = set(files)
    return {
        module: list(imports_of(module, path.read_text(encoding="utf-8"), path.name == "__init__.py", known))
        for module, path in files.items()
    }


def upward_imports(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Imports of the package's own modules that point to a higher layer, as readable lines."""
    found = []
    for module, imports in graph.items():
        for target, line in imports:
            if target.split(".")[0] != PACKAGE:
                continue
            if layer_of(target) > layer_of(module):
                found.append(
                    f"{module}:{line} ({layer_name(layer_of(module))}) imports {target} "
                    f"({layer_name(layer_of(target))})"
                )
    return found


def layer_cycles(graph: dict[str, list[tuple[str, int]]]) -> list[tuple[str, str]]:
    """Pairs of layers that import each other."""
    edges = {
        (layer_of(module), layer_of(target))
        for module, imports in graph.items()
        for target, _ in imports
        if target.split(".")[0] == PACKAGE and layer_of(module) != layer_of(target)
    }
    return sorted((layer_name(a), layer_name(b)) for a, b in edges if a < b and (b, a) in edges)


def test_every_subpackage_has_a_layer():
    subpackages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    named = {prefix.split(".")[1] for _, prefixes in LAYERS for prefix in prefixes}
    assert subpackages <= named, f"subpackages without a layer: {sorted(subpackages - named)}"


def test_the_core_knows_nothing_of_the_main_job():
    """No hop counts, plan forks or guidance in the configs, the learners or the EnvRunner: the recipe owns
    them, through the runner's group hook."""
    algos = ROOT / "algos"
    rollouts = [algos / "rollouts" / f"{name}.py" for name in ("env_runner", "record", "loop", "sampler")]
    core = [algos / "config.py", *(algos / "learners").glob("*.py"), *rollouts]
    words = ("num_hops", "fork", "guidance", "hesitat", "tiny_cpu")
    found = [
        f"{path.relative_to(ROOT.parent)}:{number}: {line.strip()}"
        for path in core
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(word in line for word in words)
    ]
    assert not found, "\n".join(found)


def test_no_upward_import():
    upward = upward_imports(import_graph())
    assert not upward, "imports must run downward (docs/architecture.md):\n" + "\n".join(upward)


def test_no_cycle_between_layers():
    assert layer_cycles(import_graph()) == []


def test_the_package_never_imports_examples_benchmarks_or_tests():
    found = [
        f"{module}:{line} imports {target}"
        for module, imports in import_graph().items()
        for target, line in imports
        if target.split(".")[0] in FORBIDDEN_ROOTS
    ]
    assert not found, "\n".join(found)


def test_metrics_is_a_leaf():
    graph = import_graph()
    assert not [t for t, _ in graph["rllib_search.metrics"] if t.split(".")[0] == PACKAGE]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from rllib_search.algos.config import SearchConfig\n", 1),  # lazy counts
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rllib_search.cli\n", 1),
        ("from rllib_search import ENV_ID\n", 1),  # the package's __init__ is the top layer
        ("from . import records\nfrom rllib_search.data.formats import read_qa_file\n", 0),
        ("import numpy\n", 0),
    ],
)
def test_the_check_sees_upward_imports(tmp_path, source, expected):
    package = tmp_path / PACKAGE
    (package / "data").mkdir(parents=True)
    (package / "algos").mkdir()
    for name in (
        "__init__.py",
        "data/__init__.py",
        "data/records.py",
        "data/formats.py",
        "algos/__init__.py",
    ):
        (package / name).write_text("")
    (package / "algos" / "config.py").write_text("")
    (package / "cli.py").write_text("")
    (package / "data" / "probe.py").write_text(source)
    graph = import_graph(package)
    upward = [line for line in upward_imports(graph) if line.startswith("rllib_search.data.probe:")]
    assert len(upward) == expected, upward


def test_the_check_sees_a_cycle_between_layers():
    graph = {
        "rllib_search.data.formats": [("rllib_search.env.search_env", 3)],
        "rllib_search.env.search_env": [("rllib_search.data.records", 1)],
        "rllib_search.data.records": [],
    }
    assert layer_cycles(graph) == [("data", "env")]
