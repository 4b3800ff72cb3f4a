"""Every benchmark's results file, written by one function: :func:`write_results`.

Beside a benchmark's figures the file records where they come from:

- ``commit``: ``git rev-parse HEAD`` of this checkout, with ``-dirty`` appended when the working tree has
  changes not committed (``git status --porcelain`` lists anything) outside ``benchmarks/results/``, where
  the benchmarks run before this one wrote their own results; None outside a git checkout or without
  git;
- ``machine``: :func:`rllib_search.llm.models.cpu_description` at the time of writing: the CPU model, its
  family and model numbers, the cores this process may use, torch's threads, the vector instructions
  torch's kernels use and whether bf16 is native.

:func:`write_results` writes ``<directory>/<name>.json`` (default directory ``benchmarks/results``) and
prints the final JSON line a benchmark ends with: its ``headline`` (or the whole results), with ``commit``
and ``machine``.

A benchmark run as a script puts the repository root on ``sys.path`` first::

    sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
    from benchmarks.results_file import write_results  # noqa: E402
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_IN_REPO = "benchmarks/results"
PROVENANCE_KEYS = ("commit", "machine")


def git_commit(root: str | Path = ROOT) -> str | None:
    """HEAD's commit of the git checkout holding ``root``, ``<sha>-dirty`` when its working tree has
    uncommitted changes (untracked files not ignored included) outside ``benchmarks/results/`` (other
    benchmarks' outputs); None outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=60
        ).stdout

    try:
        sha = git("rev-parse", "HEAD").strip()
        top = git("rev-parse", "--show-toplevel").strip()
        dirty = bool(git("-C", top, "status", "--porcelain", "--", ".", f":!{RESULTS_IN_REPO}").strip())
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def provenance(root: str | Path = ROOT) -> dict[str, Any]:
    """``commit`` and ``machine``, as :func:`write_results` records them."""
    from rllib_search.llm.models import cpu_description

    return {"commit": git_commit(root), "machine": cpu_description()}


def write_results(
    name: str,
    results: Mapping[str, Any],
    headline: Mapping[str, Any] | None = None,
    directory: str | Path | None = None,
) -> Path:
    """Write ``results`` with ``commit`` and ``machine`` (after ``benchmark``, before the figures) to
    ``<directory>/<name>.json`` (``name`` with or without ``.json``) and print the final JSON line:
    ``headline`` (default: the whole results) with ``commit`` and ``machine``. ``results`` and ``headline``
    must not carry those two keys themselves. Returns the file's path."""
    for given in (results, headline or {}):
        clash = [key for key in PROVENANCE_KEYS if key in given]
        if clash:
            raise ValueError(f"{clash} are recorded by write_results; leave them out of the results")
    origin = provenance()
    document = _with_origin(results, origin)
    out = Path(directory) if directory is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name.removesuffix('.json')}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document if headline is None else _with_origin(headline, origin)), flush=True)
    return path


def _with_origin(figures: Mapping[str, Any], origin: dict[str, Any]) -> dict[str, Any]:
    """``figures`` with ``origin``'s keys after ``benchmark`` (first, where given)."""
    document = {key: figures[key] for key in ("benchmark",) if key in figures}
    document.update(origin)
    document.update(figures)
    return document
