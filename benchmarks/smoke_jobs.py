"""Every tuned example's ``--smoke``, submitted as the README submits it, timed against a bound.

A local cluster as a user starts one (``ray start --head`` on 127.0.0.1, free ports, a temp dir of its
own), then for each example::

    RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:<port> --working-dir . -- \\
        python tuned_examples/<example>.py --smoke --out <temp>/<example>

one after another, each timed from submission to the job's end. Writes
``benchmarks/results/smoke_jobs.json`` (each example's seconds, exit status and, on failure, the end of its
output) and passes when every job succeeds within ``--bound-s``.

    python benchmarks/smoke_jobs.py                      # every example, 180 s bound, a 2-CPU head
    python benchmarks/smoke_jobs.py --examples findings  # one
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
from benchmarks.results_file import write_results  # noqa: E402
from rllib_search.serve.http.ports import free_port  # noqa: E402

EXAMPLES = (
    "search_r1_grpo",
    "search_r1_ppo",
    "r1_searcher",
    "r_search_grpo",
    "lambda_sweep",
    "tiny_cpu_grpo",
    "findings",
)
# Said by a head still coming up: its dashboard or job agent not answering yet, or an upload dropped.
STARTING = ("Failed to connect", "No available agent", "RemoteDisconnected", "ServerDisconnectedError")


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def start_head(temp_dir: Path, num_cpus: int, environment: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """``ray start --head --block`` on free ports: its process and the dashboard's address once it answers."""
    import requests

    dashboard_port = free_port()
    process = subprocess.Popen(
        [
            bin_path("ray"),
            *("start", "--head", "--block", "--temp-dir", str(temp_dir), f"--num-cpus={num_cpus}"),
            *("--node-ip-address", "127.0.0.1", "--port", str(free_port())),
            *("--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port)),
            *("--dashboard-agent-listen-port", str(free_port())),
            *("--ray-client-server-port", str(free_port())),
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard_port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(requests.RequestException):
            requests.get(f"{address}/api/version", timeout=10)
            return process, address
        time.sleep(2)
    stop_head(process)
    raise SystemExit("ray start --head: the dashboard did not answer within 300 s")


def stop_head(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def submit(address: str, example: str, out: Path, environment: dict[str, str]) -> dict:
    """One example's smoke as a submitted job: its seconds (the last, successful submission's), exit status
    and, when it failed, the end of its output."""
    command = [bin_path("ray"), "job", "submit", "--address", address, "--working-dir", str(ROOT)]
    command += ["--", "python", f"tuned_examples/{example}.py", "--smoke", "--out", str(out / example)]
    while True:
        started = time.monotonic()
        done = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=3600
        )
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        if done.returncode == 0 or not any(text in output for text in STARTING) or "Job '" in output:
            break
        time.sleep(3)  # the head was still coming up: the job did not start
    result = {"seconds": round(seconds, 1), "returncode": done.returncode}
    if done.returncode != 0:
        result["output_tail"] = output[-2000:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=lambda s: s.split(","), default=list(EXAMPLES))
    parser.add_argument("--bound-s", type=float, default=180.0, help="the most seconds a smoke job may take")
    parser.add_argument("--num-cpus", type=int, default=2, help="logical CPUs of the head")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.examples) - set(EXAMPLES))
    if unknown:
        parser.error(f"unknown examples {unknown}; known: {list(EXAMPLES)}")

    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment["RAY_AUTH_MODE"] = "token"
    temp_dir = Path(tempfile.mkdtemp(prefix="smokejobs", dir="/tmp"))  # short: socket paths live in it
    started = time.monotonic()
    head, address = start_head(temp_dir / "ray", args.num_cpus, environment)
    jobs = {}
    try:
        for example in args.examples:
            print(f"[{time.monotonic() - started:7.1f}s] submitting {example} --smoke", flush=True)
            jobs[example] = submit(address, example, temp_dir / "runs", environment)
            verdict = "ok" if jobs[example]["returncode"] == 0 else f"FAILED ({jobs[example]['returncode']})"
            print(f"[{time.monotonic() - started:7.1f}s] {example}: {jobs[example]['seconds']} s, {verdict}")
    finally:
        stop_head(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
    passed = all(j["returncode"] == 0 and j["seconds"] <= args.bound_s for j in jobs.values())
    results = {
        "benchmark": "smoke_jobs",
        "head_cpus": args.num_cpus,
        "bound_s": args.bound_s,
        "jobs": jobs,
        "slowest_s": max(j["seconds"] for j in jobs.values()),
        "passed": passed,
    }
    headline = {k: v for k, v in results.items() if k != "jobs"}
    headline["seconds"] = {name: job["seconds"] for name, job in jobs.items()}
    write_results("smoke_jobs", results, headline=headline)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
