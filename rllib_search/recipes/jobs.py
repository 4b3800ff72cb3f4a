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
  ``--out``/checkpoint), writes ``summary.json`` and ``training.png`` under ``--out``, and deletes the Serve
  apps it started;
- with ``--resume``, continues a run that died (the driver killed, the machine lost) from its newest
  periodic checkpoint: same weights, optimizer, iteration count and data position of every EnvRunner; the
  iteration rows before it come back from ``history.jsonl``.

Ray 2.60's token authentication: ``ray job submit`` to a cluster started with ``ray start`` needs
``RAY_AUTH_MODE=token`` in the submitting shell (the CLI then reads ``~/.ray/auth_token``, which ``ray
start`` wrote; on another machine set ``RAY_AUTH_TOKEN`` to the output of ``ray get-auth-token`` on the
head node). The job's own driver joins its cluster without it.
"""

from __future__ import annotations

import argparse
import json
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
    ports = [node.get("MetricsExportPort") for node in ray.nodes() if node.get("Alive")]
    if ports and ports[0]:
        lines.append(
            f"Prometheus metrics: http://127.0.0.1:{ports[0]}/metrics (rllib_search_*, docs/grafana)"
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
    parser.add_argument("--out", help="output directory (default runs/<example>)")
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
        default=0,
        help="checkpoint every N iterations under OUT/checkpoints (0: only at the end, to OUT/checkpoint)",
    )
    parser.add_argument("--keep-last", type=int, default=3, help="periodic checkpoints kept (0: all)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint under OUT/checkpoints"
    )
    parser.set_defaults(default_iterations=iterations, smoke_iterations=smoke_iterations)
    return parser


class RecipeJob:
    """One run of a recipe (see the module docstring); a context manager that cleans up its Serve apps."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        # Absolute: Tune trials and Serve replicas run in other working directories.
        self.out = Path(args.out or f"runs/{name}").resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.scale = "paper" if not (args.smoke or args.embedded) else "cpu"
        self.iterations = args.iterations or (
            args.smoke_iterations if args.smoke else args.default_iterations
        )
        self._started_apps: list[str] = []
        self.world: embedded.EmbeddedWorld | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def __enter__(self) -> RecipeJob:
        for line in connect(self.args.num_cpus, metrics_port=self.args.metrics_port):
            self.say(line)
        if self.scale == "cpu":
            self.world = embedded.embedded_world(self.args.seed)
            self.say(f"embedded default: synthetic world in {self.world.root}")
        return self

    def __exit__(self, *exc: Any) -> None:
        embedded.stop_apps(self._started_apps)

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
        """Build the Algorithm (restored from the newest periodic checkpoint under ``--resume``), train up to
        ``self.iterations`` iterations with a line each, checkpoint, and write ``summary.json`` and
        ``training.png``; returns the summary."""
        from rllib_search.algos.checkpoints.periodic import save_atomically

        config = config.debugging(seed=self.args.seed).dashboard_metrics(run_name=self.name)
        if self.held_out is not None:
            config = config.held_out(dataset=self.held_out)
        if self.args.checkpoint_every:
            config = config.checkpointing(
                directory=str((self.out / "checkpoints").resolve()),
                every_n_iterations=self.args.checkpoint_every,
                keep_last=self.args.keep_last,
            )
        algo = config.build_algo()
        history_file = self.out / "history.jsonl"
        history: list[dict[str, Any]] = []
        if getattr(self.args, "resume", False):
            restored = algo.restore_latest(self.out / "checkpoints")
            if restored is None:
                self.say(f"--resume: no checkpoint under {self.out / 'checkpoints'}: starting afresh")
            else:
                self.say(f"resumed from {restored} at iteration {algo.iteration}")
                history = [row for row in read_history(history_file) if row["iteration"] <= algo.iteration]
        history_file.write_text("".join(json.dumps(row) + "\n" for row in history))
        checkpoint = None
        try:
            while algo.iteration < self.iterations:
                result = algo.train()
                row = iteration_row(algo.iteration, result)
                history.append(row)
                with history_file.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                self.say(format_row(row, self.iterations))
            checkpoint = save_atomically(algo, self.out / "checkpoint")
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
