"""Running a recipe as a job: standalone, or with ``ray job submit`` on a running cluster.

``tuned_examples/*.py`` are thin: each builds its paper's config (``recipes/``) and hands it to a
:class:`RecipeJob`, which

- joins the running cluster when there is one (``ray job submit`` sets ``RAY_ADDRESS``; a local
  ``ray start`` is found too) and never passes resources to it; otherwise starts a local Ray with the
  dashboard on 127.0.0.1 and prints its URL;
- picks the inputs: ``--smoke`` (the same code path on the embedded default at the smallest size: bundled
  models, synthetic world, served BM25 retriever and Gemma judge, CPU, a few minutes), ``--embedded``
  (the CPU scale on the embedded default, with a warm start) or the paper scale on the user's data and
  services (``--data``, ``--retriever-url`` or the in-cluster Serve apps);
- trains with a line per iteration, checkpoints (every ``--checkpoint-every`` iterations under
  ``--out``/checkpoints, the last ``--keep-last`` kept, each written atomically; and at the end to
  ``--out``/checkpoint), writes ``history.jsonl`` (a row per iteration, as it goes), ``summary.json`` and
  ``training.png`` under ``--out``, and deletes the Serve apps it started;
- with ``--resume``, continues the run under ``--out`` (the driver killed, the machine lost, or a finished
  run asked for more ``--iterations``) from its newest checkpoint, periodic or final, whichever holds the
  later iteration: same weights, optimizer, iteration count and data position of every EnvRunner; the
  iteration rows up to it stay in ``history.jsonl``, and it trains only the iterations still missing.

Where the outputs go (:func:`output_directory`): ``--out`` is made absolute at the start, and the job prints
it at the start and at the end. Standalone, the default is ``runs/<example>`` under the working directory.
A job submitted with ``ray job submit --working-dir .`` runs in Ray's temporary unpacked copy of that
directory (under the Ray session's ``runtime_resources``), which Ray deletes later: there the default is
``~/rllib_search_runs/<example>`` on the node that runs the driver (the head node), and a relative
``--out`` is taken under ``~/rllib_search_runs`` too. ``RLLIB_SEARCH_RUNS=/some/dir`` puts the default at
``/some/dir/<example>`` in both cases (pass it to a job with ``--runtime-env-json
'{"env_vars": {"RLLIB_SEARCH_RUNS": "/some/dir"}}'``). A job is recognised by the variables Ray sets for
its driver (``RAY_JOB_CONFIG_JSON_ENV_VAR``, or ``RAY_JOB_ID``) or by a working directory inside Ray's
session directory.

Checkpoints by default: every 10 iterations at paper scale, every 5 with ``--embedded`` and every
iteration with ``--smoke``; ``--checkpoint-every 0`` keeps only the final checkpoint. A new run (no
``--resume``) into an ``--out`` that holds an earlier run's checkpoints stops and says so (``--resume``
continues that run; another ``--out`` starts elsewhere), except under ``--smoke``, which starts over in
place. ``history.jsonl`` is never emptied: rows of a run that left no checkpoint to resume from are kept as
``history.<time>.jsonl`` beside it.

Tune sweeps (``recipes/sweeps.py``; ``lambda_sweep.py`` and ``findings.py``) keep their experiment under
``--out``: a sweep whose trials run on several nodes needs ``--out`` on storage every node mounts at the
same path (NFS or the like), or the trials' checkpoints and results are scattered over the nodes' disks.

Ray 2.60's token authentication: ``ray job submit`` to a cluster started with ``ray start`` needs
``RAY_AUTH_MODE=token`` in the submitting shell (the CLI then reads ``~/.ray/auth_token``, which ``ray
start`` wrote; on another machine set ``RAY_AUTH_TOKEN`` to the output of ``ray get-auth-token`` on the
head node). The job's own driver joins its cluster without it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rllib_search.recipes import embedded


def connect(num_cpus: int | None = None, *, metrics_port: int | None = None) -> list[str]:
    """Join the running cluster, or start a local Ray with the dashboard on 127.0.0.1 (only then do
    ``num_cpus`` and ``metrics_port`` apply: passing resources to an existing cluster is an error).
    Returns lines that say where to watch the run (dashboard URL, Prometheus endpoint)."""
    import ray

    from rllib_search.serve.cluster import cluster_address, patient_serve_proxies

    if ray.is_initialized():
        return []
    address = cluster_address()
    if address:
        context = ray.init(address=address, log_to_driver=False)
    else:
        patient_serve_proxies()
        context = ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            _metrics_export_port=metrics_port,
            log_to_driver=False,
        )
    lines = []
    url = getattr(context, "dashboard_url", None)
    if url:
        url = url if str(url).startswith("http") else f"http://{url}"
        lines.append(f"Ray dashboard: {url} (token: `ray get-auth-token`; Jobs, Serve, Metrics)")
    nodes = [node for node in ray.nodes() if node.get("Alive") and node.get("MetricsExportPort")]
    if nodes:
        host, port = nodes[0].get("NodeManagerAddress") or "127.0.0.1", nodes[0]["MetricsExportPort"]
        exposure = "" if host.startswith("127.") else "; Ray binds it on every interface, unauthenticated"
        lines.append(
            f"Prometheus metrics: http://{host}:{port}/metrics (rllib_search_*, docs/grafana{exposure})"
        )
    return lines


def job_arguments(description: str, *, iterations: int, smoke_iterations: int = 1) -> argparse.ArgumentParser:
    """The options every tuned example shares (an example adds its own)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument(
        "--smoke", action="store_true", help="the same code path on the embedded default at the smallest size"
    )
    scale.add_argument(
        "--embedded", action="store_true", help="CPU scale on the embedded default (warm start)"
    )
    parser.add_argument(
        "--iterations", type=int, help=f"training iterations (default {iterations}; smoke {smoke_iterations})"
    )
    parser.add_argument(
        "--out",
        help="output directory (default runs/<example>; as a submitted Ray job "
        "~/rllib_search_runs/<example>; $RLLIB_SEARCH_RUNS/<example> when set)",
    )
    parser.add_argument("--model", help="policy: alias, hub name or local path (default: the recipe's)")
    parser.add_argument(
        "--data", help="training questions (Search-R1 parquet or FlashRAG jsonl); paper scale"
    )
    parser.add_argument("--held-out", help="held-out questions evaluated every iteration (greedy)")
    parser.add_argument("--retriever-url", help="a Search-R1-style /retrieve URL (default: the Serve app)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of a local Ray (ignored on a cluster)"
    )
    parser.add_argument("--metrics-port", type=int, help="Prometheus port of a local Ray (default: random)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="checkpoint every N iterations under OUT/checkpoints (default: 10 at paper scale, 5 with "
        "--embedded, 1 with --smoke; 0: only at the end, to OUT/checkpoint)",
    )
    parser.add_argument("--keep-last", type=int, default=3, help="periodic checkpoints kept (0: all)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run under OUT from its newest checkpoint (periodic or final) up to --iterations",
    )
    parser.set_defaults(default_iterations=iterations, smoke_iterations=smoke_iterations)
    return parser


class RecipeJob:
    """One run of a recipe (see the module docstring); a context manager that cleans up its Serve apps."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.submitted = submitted_job()
        # Absolute (Tune trials and Serve replicas run in other working directories), and outside a submitted
        # job's temporary working directory (see the module docstring).
        self.out = output_directory(name, args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        args.out = str(self.out)
        self.started = time.perf_counter()
        self.scale = "paper" if not (args.smoke or args.embedded) else "cpu"
        self.iterations = args.iterations or (
            args.smoke_iterations if args.smoke else args.default_iterations
        )
        every = getattr(args, "checkpoint_every", None)
        self.checkpoint_every = every if every is not None else default_checkpoint_every(args)
        self._started_apps: list[str] = []
        self.world: embedded.EmbeddedWorld | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def __enter__(self) -> RecipeJob:
        where = f" ({self.submitted}: outside its temporary working directory)" if self.submitted else ""
        self.say(f"output directory: {self.out}{where}")
        if not getattr(self.args, "resume", False):
            self._start_over()
        for line in connect(self.args.num_cpus, metrics_port=self.args.metrics_port):
            self.say(line)
        if self.scale == "cpu":
            self.world = embedded.embedded_world(self.args.seed)
            self.say(f"embedded default: synthetic world in {self.world.root}")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            embedded.stop_apps(self._started_apps)
        finally:
            self.say(f"output directory: {self.out}")

    def say(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.1f}s] {message}", flush=True)

    # --- inputs ------------------------------------------------------------------------------------------
    @property
    def dataset(self) -> Any:
        """Training questions: the world's (embedded default) or ``--data``."""
        if self.world is not None:
            return self.args.data or self.world.records("train")
        if not self.args.data:
            raise SystemExit(
                "paper scale needs --data (training questions), or run with --smoke / --embedded"
            )
        return self.args.data

    @property
    def held_out(self) -> Any:
        """Held-out questions: ``--held-out``, else on the embedded default a fixed slice of the test set."""
        if self.args.held_out:
            return self.args.held_out
        if self.world is not None:
            return self.world.records("test")[: 8 if self.args.smoke else 48]
        return None

    def retriever(self) -> dict[str, Any]:
        """``--retriever-url``, else the in-cluster Serve retriever (started on the embedded default)."""
        if self.args.retriever_url:
            return {"type": "url", "url": self.args.retriever_url, "timeout_s": 120}
        if self.world is None:
            return {"type": "serve", "app": embedded.RETRIEVER_APP, "timeout_s": 120}
        spec, started = embedded.serve_retriever(self.world.index)
        if started:
            self._started_apps.append(embedded.RETRIEVER_APP)
            self.say("retriever: BM25 over the world's passages, served by Ray Serve")
        return spec

    def judge(self, url: str | None = None) -> dict[str, Any]:
        """The evidence judge: ``url`` (an OpenAI-compatible base URL), else the in-cluster Serve judge
        (started with the bundled Gemma-3-270M on the embedded default)."""
        if url:
            return {"type": "url", "url": url, "api": "chat", "temperature": 0.1}
        if self.world is None:
            return {"type": "serve", "app": embedded.JUDGE_APP, "api": "chat", "temperature": 0.1}
        spec, started = embedded.serve_judge()
        if started:
            self._started_apps.append(embedded.JUDGE_APP)
            self.say("evidence judge: Gemma-3-270M served by Ray Serve")
        return spec

    def smoke_sized(self, config: Any) -> Any:
        """Under ``--smoke``, the smallest rollouts that still go through every part."""
        if not self.args.smoke:
            return config
        return config.rollouts(prompts_per_sample=1, max_turn_tokens=32)

    def prepared(self, recipe: Any, **warm_start: Any) -> Any:
        """``recipe`` ready to train here: its rollouts smoke-sized under ``--smoke`` and its policy
        warm-started where :meth:`warm_started` says (``warm_start`` goes to it), against its turn budget."""
        recipe = self.smoke_sized(recipe)
        model = self.warm_started(
            recipe.model_config["model"],
            recipe.env_config,
            max_turn_tokens=recipe.max_turn_tokens,
            **warm_start,
        )
        return recipe.rl_module(model_config={**recipe.model_config, "model": model})

    def warm_started(
        self,
        model: str,
        env_config: dict[str, Any],
        *,
        steps: int = 8,
        directory: str = "warm_start_model",
        always: bool = False,
        reuse: bool = False,
        max_turn_tokens: int | None = None,
    ) -> str:
        """On ``--embedded`` (or on the embedded default at any size with ``always``), the policy after
        ``steps`` masked-SFT steps of a warm start on teacher trajectories (1-hop and 2-hop training
        questions; a handful under ``--smoke``), exported to ``--out``/``directory``; otherwise ``model``
        itself. With ``reuse`` (or ``--resume``), an export already there is used as it is (a resumed run).
        ``max_turn_tokens``: RL's turn budget, to warn about demonstrated turns longer than it."""
        if self.world is None or not (self.args.embedded or always):
            return model
        path = self.out / directory
        reuse = reuse or bool(getattr(self.args, "resume", False))  # a resumed run keeps its warm start
        if reuse and (path / "config.json").exists():
            self.say(f"warm start: reusing {path}")
            return str(path)
        one_hop, two_hop = (6, 2) if self.args.smoke else (120, 40)
        records = (
            self.world.records("train", hops=1)[:one_hop] + self.world.records("train", hops=2)[:two_hop]
        )
        settings = {k: v for k, v in env_config.items() if k not in ("dataset", "retriever", "judge")}
        path = embedded.warm_start(
            model,
            records,
            env_config["retriever"],
            settings,
            path,
            steps=steps,
            seed=self.args.seed,
            max_turn_tokens=max_turn_tokens,
            say=self.say,
        )
        return str(path)

    # --- training ----------------------------------------------------------------------------------------
    def train(self, config: Any) -> dict[str, Any]:
        """Build the Algorithm (under ``--resume``, restored from the run's newest checkpoint: see
        :meth:`resume_point`), train up to ``self.iterations`` iterations with a line each, checkpoint, and
        write ``summary.json`` and ``training.png``; returns the summary. A resumed run that is already at
        ``self.iterations`` with its outputs written trains nothing and keeps them."""
        from rllib_search.algos.checkpoints.periodic import save_atomically

        resume = bool(getattr(self.args, "resume", False))
        final = self.out / "checkpoint"
        start = self.resume_point() if resume else None
        if start is not None and start[1] >= self.iterations:
            finished = self._finished_summary(*start)
            if finished is not None:
                self.say(
                    f"--resume: {start[0]} is at iteration {start[1]} ({self.iterations} asked for): nothing "
                    f"left to do; its outputs are kept (--iterations N trains on to N)"
                )
                return finished

        config = config.debugging(seed=self.args.seed).dashboard_metrics(run_name=self.name)
        if self.held_out is not None:
            config = config.held_out(dataset=self.held_out)
        if self.checkpoint_every:
            config = config.checkpointing(
                directory=str((self.out / "checkpoints").resolve()),
                every_n_iterations=self.checkpoint_every,
                keep_last=self.args.keep_last,
            )
        algo = config.build_algo()
        history_file = self.out / "history.jsonl"
        checkpoint = None
        try:
            if start is not None:
                algo.restore_from_path(str(start[0]))
                self.say(f"resumed from {start[0]} at iteration {algo.iteration}")
                history = self._resumed_history(history_file, algo.iteration)
                if algo.iteration >= self.iterations:
                    self.say(f"at iteration {algo.iteration}, {self.iterations} asked for: nothing to train")
            else:
                if resume:
                    self.say(f"--resume: no checkpoint under {self.out}: starting afresh")
                history = self._fresh_history(history_file)
            restored = algo.iteration if start is not None else None
            while algo.iteration < self.iterations:
                result = algo.train()
                row = iteration_row(algo.iteration, result)
                history.append(row)
                with history_file.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                self.say(format_row(row, self.iterations))
            if start is not None and start[0] == final and algo.iteration == restored:
                checkpoint = final  # it holds this very state
            else:
                checkpoint = save_atomically(algo, final)
        finally:
            algo.stop()
        summary = {
            "example": self.name,
            "scale": "smoke" if self.args.smoke else self.scale,
            "iterations": history,
            "checkpoint": str(checkpoint),
            "seconds": time.perf_counter() - self.started,
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_history(history, self.out / "training.png", self.name)
        self.say(
            f"checkpoint {checkpoint}; wrote {self.out / 'summary.json'} and {self.out / 'training.png'}"
        )
        return summary

    def resume_point(self) -> tuple[Path, int] | None:
        """The checkpoint ``--resume`` continues from and its iteration: the newest periodic one under
        ``--out``/checkpoints or the final ``--out``/checkpoint, whichever holds the later iteration (the
        final one on a tie); None when the run has neither. An iteration that cannot be read counts as -1
        (the restore then names what is wrong)."""
        from rllib_search.algos.checkpoints.periodic import (
            checkpoint_iteration,
            latest_checkpoint,
            recover_checkpoint,
            remove_leftovers,
        )

        for directory in (self.out, self.out / "checkpoints"):  # what interrupted saves left, recovered first
            remove_leftovers(directory)
        found = []
        for rank, path in enumerate(
            (latest_checkpoint(self.out / "checkpoints"), recover_checkpoint(self.out / "checkpoint"))
        ):
            if path is not None:
                iteration = checkpoint_iteration(path)
                found.append((iteration if iteration is not None else -1, rank, path))
        if not found:
            return None
        iteration, _, path = max(found)
        return path, iteration

    def _finished_summary(self, path: Path, iteration: int) -> dict[str, Any] | None:
        """The summary of a finished run whose final checkpoint is ``path`` at ``iteration``, or None when
        ``path`` is not the final checkpoint or the run's outputs do not go as far."""
        summary_file = self.out / "summary.json"
        if path != self.out / "checkpoint" or not summary_file.exists():
            return None
        try:
            summary = json.loads(summary_file.read_text())
            rows = summary["iterations"]
        except (ValueError, KeyError, TypeError):
            return None
        last = rows[-1]["iteration"] if rows else 0
        return summary if last == iteration else None

    def _resumed_history(self, history_file: Path, iteration: int) -> list[dict[str, Any]]:
        """The rows up to ``iteration`` (those after it are trained again); the file is rewritten, atomically,
        only when it holds more (or a line that a kill cut short)."""
        rows = read_history(history_file)
        kept = [row for row in rows if row["iteration"] <= iteration]
        text = "".join(json.dumps(row) + "\n" for row in kept)
        if not history_file.exists() or history_file.read_text() != text:
            write_atomically(history_file, text)
        if len(rows) > len(kept):
            self.say(
                f"history: {len(kept)} rows kept; {len(rows) - len(kept)} after iteration {iteration} dropped"
            )
        if kept and kept[-1]["iteration"] < iteration:
            self.say(f"history: {history_file} has rows up to iteration {kept[-1]['iteration']} only")
        return kept

    def _fresh_history(self, history_file: Path) -> list[dict[str, Any]]:
        """An empty history for a run starting at iteration 0; rows already there are kept aside."""
        if read_history(history_file):
            aside = history_file.with_name(f"history.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
            history_file.rename(aside)
            self.say(f"history: the earlier rows are kept in {aside}")
        history_file.write_text("")
        return []

    def _start_over(self) -> None:
        """A new run (no ``--resume``) in an ``--out`` that holds an earlier run's checkpoints: stop and say
        so (``--resume`` continues it), except under ``--smoke``, whose runs start over in place."""
        from rllib_search.algos.checkpoints.periodic import (
            checkpoints,
            discard_checkpoint,
            recover_checkpoint,
        )

        earlier = checkpoints(self.out / "checkpoints")
        final = recover_checkpoint(self.out / "checkpoint", wait_s=0.0)
        earlier += [final] if final is not None else []
        if not earlier:
            return
        if not self.args.smoke:
            raise SystemExit(
                f"{self.out} holds an earlier run's checkpoints ({', '.join(p.name for p in earlier)}): "
                f"--resume continues it (up to --iterations); to start over, delete "
                f"{self.out / 'checkpoints'} and {self.out / 'checkpoint'}, or pass another --out"
            )
        for path in earlier:
            discard_checkpoint(path)
        self.say(f"--smoke: starting over in {self.out} (the earlier run's checkpoints deleted)")


def default_checkpoint_every(args: argparse.Namespace) -> int:
    """Iterations between periodic checkpoints when ``--checkpoint-every`` is not given: every iteration of
    a ``--smoke`` run, every 5 with ``--embedded`` and every 10 at paper scale (a paper-scale checkpoint of
    a 3B policy with its optimizer takes minutes and tens of GB)."""
    if args.smoke:
        return 1
    return 5 if args.embedded else 10


def submitted_job() -> str | None:
    """``"Ray job <id>"`` when this driver runs as a submitted Ray job (``ray job submit``), else None. A job
    is recognised by what Ray sets for its driver (``RAY_JOB_CONFIG_JSON_ENV_VAR``; ``RAY_JOB_ID``) or by
    a working directory inside a Ray session's directory (the unpacked ``--working-dir``)."""
    config = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if config:
        try:
            metadata = json.loads(config).get("metadata") or {}
        except (ValueError, AttributeError):
            metadata = {}
        return f"Ray job {metadata.get('job_submission_id') or metadata.get('job_name') or ''}".strip()
    if os.environ.get("RAY_JOB_ID"):
        return f"Ray job {os.environ['RAY_JOB_ID']}"
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return None
    parts = cwd.parts
    in_package = "runtime_resources" in parts or any(part.startswith("_ray_pkg_") for part in parts)
    ray_temp = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()).resolve() / "ray"
    in_session = cwd.is_relative_to(ray_temp) and any(part.startswith("session_") for part in parts)
    return "a Ray job" if in_package or in_session else None


def output_directory(name: str, out: str | None) -> Path:
    """Where a run of example ``name`` writes, absolute: ``out`` when given (relative to the working
    directory; in a submitted Ray job, to the runs directory), else ``<runs directory>/<name>``. The runs
    directory is ``$RLLIB_SEARCH_RUNS`` when set, else ``runs`` standalone and ``~/rllib_search_runs`` in a
    submitted job (whose working directory Ray deletes)."""
    job = submitted_job() is not None
    configured = os.environ.get("RLLIB_SEARCH_RUNS")
    if configured:
        runs = Path(configured).expanduser()
        runs = runs if runs.is_absolute() or not job else Path.home() / runs
    else:
        runs = Path.home() / "rllib_search_runs" if job else Path("runs")
    if out is None:
        path = runs / name
    else:
        path = Path(out).expanduser()
        if job and not path.is_absolute():
            path = runs / path
    return path.resolve()


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path``'s contents with ``text`` by a rename: a kill leaves the old contents or the new."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def read_history(path: Path) -> list[dict[str, Any]]:
    """The iteration rows a run wrote so far (one JSON object a line; a torn last line is dropped)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the line a kill cut short
    return rows


def iteration_row(iteration: int, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one ``train()`` result that a person reads per iteration."""
    runners, learner = result.get("env_runners", {}), result.get("learners", {})
    policy = learner.get("default_policy", {})
    row: dict[str, Any] = {
        "iteration": iteration,
        "reward": _number(runners.get("episode_return_mean")),
        "reward_components": {k: _number(v) for k, v in runners.get("reward", {}).items()},
        "searches": _number(runners.get("searches_per_episode")),
        "generation_tokens_per_s": _number(runners.get("generation_tokens_per_s")),
        "trained_tokens_per_s": _number(learner.get("trained_tokens_per_s")),
        "kl": _number(policy.get("kl")),
        "reward_stage": _number(runners.get("reward_stage")),
        "judge_errors": _number(runners.get("judge_errors")),
    }
    evaluation = result.get("evaluation", {})
    if evaluation:
        row["held_out"] = {k: v for k, v in evaluation.items() if k != "em_by_source"}
    return row


def format_row(row: dict[str, Any], total: int) -> str:
    parts = [
        f"iter {row['iteration']:3d}/{total}",
        f"reward {row['reward']:.3f}",
        f"searches {row['searches']:.2f}",
        f"gen {row['generation_tokens_per_s']:.0f} tok/s",
        f"train {row['trained_tokens_per_s']:.0f} tok/s",
        f"kl {row['kl']:.4f}",
    ]
    if "held_out" in row:
        parts.append(f"held-out EM {row['held_out']['em']:.3f}")
    return "  ".join(parts)


def plot_history(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """Reward (and its components) per iteration beside held-out EM and searches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iterations = [row["iteration"] for row in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(iterations, [row["reward"] for row in history], marker="o", label="reward")
    for name in history[0]["reward_components"] if history else []:
        left.plot(iterations, [row["reward_components"].get(name, 0.0) for row in history], "--", label=name)
    left.set_xlabel("iteration")
    left.set_title(f"{title}: training reward")
    left.legend(fontsize=8)
    if history and "held_out" in history[0]:
        right.plot(iterations, [row["held_out"]["em"] for row in history], marker="o", label="held-out EM")
    right.plot(iterations, [row["searches"] for row in history], marker="s", label="searches / episode")
    right.set_xlabel("iteration")
    right.set_title("held-out EM and searches")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
