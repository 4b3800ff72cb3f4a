"""Conversion benchmark: a bundled GGUF model's first load, with and without ``one_gguf_parse``.

A fresh machine (and every fresh test worker) converts the bundled GGUF files into Hugging Face copies
before anything runs (``llm/models.py``). ``one_gguf_parse`` makes transformers parse each file once, with
a reader that slices a plain view of the mapping, and builds gguf's tensor-name map once. This benchmark
converts each bundled model into an empty cache both ways, alternating (library, ours, library, ours, ...),
each conversion in its own Python process (so neither inherits the other's imports or caches), timing the
conversion alone (tokenizer and model, not the interpreter's start). Every copy's files are hashed: the
two ways must write the same bytes.

Prints a final JSON line and writes ``benchmarks/results/conversion.json`` (``_quick`` with ``--quick``:
SmolLM2 only, one repeat), with the commit and the machine (``benchmarks/results_file.py``).

    python benchmarks/conversion_bench.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*

from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.llm.models import BUNDLED_MODELS, cpu_description, describe_cpu  # noqa: E402

# One conversion in a fresh process. "library": one_gguf_parse replaced by a block that does nothing, so
# transformers reads the file with gguf's own reader, as before it existed.
CONVERT = """
import contextlib, json, sys, time
from rllib_search.llm import models
if sys.argv[2] == "library":
    models.one_gguf_parse = contextlib.nullcontext
started = time.perf_counter()
models.resolve_model_path(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - started}))
"""


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory``, by relative path."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def convert(alias: str, way: str) -> tuple[float, dict[str, str]]:
    """Convert ``alias`` into an empty cache in a fresh process: (seconds, the copy's file hashes)."""
    with tempfile.TemporaryDirectory(prefix="conversion_bench_") as cache:
        environment = {**os.environ, "RLLIB_SEARCH_CACHE": cache}
        done = subprocess.run(
            [sys.executable, "-c", CONVERT, alias, way],
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"converting {alias} ({way}) failed:\n{done.stderr[-3000:]}")
        seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        return seconds, file_hashes(Path(cache) / "models" / alias)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="SmolLM2 only, one repeat")
    parser.add_argument("--repeats", type=int, default=2, help="conversions each way per model")
    args = parser.parse_args()
    aliases = ["smollm2-135m-instruct"] if args.quick else list(BUNDLED_MODELS)
    repeats = 1 if args.quick else args.repeats
    print(f"machine: {describe_cpu(cpu_description())}", flush=True)
    models = {}
    for alias in aliases:
        seconds: dict[str, list[float]] = {"library": [], "one_gguf_parse": []}
        hashes: dict[str, dict[str, str]] = {}
        for repeat in range(repeats):
            for way in seconds:
                took, files = convert(alias, way)
                seconds[way].append(round(took, 2))
                if hashes.setdefault(way, files) != files:
                    raise RuntimeError(f"{alias}: two {way} conversions wrote different bytes")
                print(f"{alias} repeat {repeat + 1}/{repeats} {way}: {took:.1f} s", flush=True)
        same = hashes["library"] == hashes["one_gguf_parse"]
        library, ours = median(seconds["library"]), median(seconds["one_gguf_parse"])
        models[alias] = {
            "seconds": seconds,
            "median_library_s": library,
            "median_one_gguf_parse_s": ours,
            "speedup": round(library / ours, 2),
            "same_bytes": same,
            "files": len(hashes["library"]),
        }
        print(
            f"{alias}: {library:.1f} -> {ours:.1f} s ({library / ours:.2f}x), "
            f"{'the same bytes' if same else 'DIFFERENT BYTES'} in {len(hashes['library'])} files",
            flush=True,
        )
        if not same:
            raise SystemExit(f"{alias}: one_gguf_parse wrote other bytes than the library's conversion")
    summary = {"benchmark": "conversion", "quick": args.quick, "models": models}
    write_results("conversion_quick" if args.quick else "conversion", summary)


if __name__ == "__main__":
    main()
