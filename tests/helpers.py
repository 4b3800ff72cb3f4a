"""A small hand-written world shared by the env tests (passages a BM25 index can answer from), and the
tiny GRPO/PPO configs that the learner and fault-tolerance tests train."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage

PASSAGES = [
    Passage("p1", "Tarquin Oskaley", "Tarquin Oskaley was born in Velmora, a river town."),
    Passage("p2", "Velmora", "Velmora is a city located in the country of Dravenia."),
    Passage("p3", "Dravenia", "Dravenia is a country whose capital is Ostrel."),
    Passage("p4", "Mirelle Dask", "Mirelle Dask was born in Carvossa and founded Quellon Works."),
    Passage("p5", "Quellon Works", "Quellon Works is a company founded by Mirelle Dask in 1987."),
    Passage("p6", "Carvossa", "Carvossa is a city located in the country of Lunethia."),
]

RECORDS = [
    QARecord("1", "Where was Tarquin Oskaley born?", ["Velmora"], "synthetic"),
    QARecord("2", "In which country is the city where Tarquin Oskaley was born?", ["Dravenia"], "synthetic"),
    QARecord("3", "Who founded Quellon Works?", ["Mirelle Dask"], "synthetic"),
]


def build_tiny_sliding_window_lm(out_dir, tokenizer_dir, sliding_window: int = 16):
    """A tiny Gemma-3 (one sliding-window layer, one full-attention layer) over the tokenizer in
    ``tokenizer_dir``, saved with it to ``out_dir``; returns ``out_dir``."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    Gemma3ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_tiny_qwen2_lm(out_dir, tokenizer_dir=None, hidden_size: int = 32, seed: int = 3):
    """A tiny Qwen2 (tied embeddings, biases on q, k and v, grouped-query attention) over the tokenizer in
    ``tokenizer_dir`` (saved with it), or a 300-token vocabulary without one; returns ``out_dir``."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else None
    config = Qwen2Config(
        vocab_size=len(tokenizer) if tokenizer else 300,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id if tokenizer else None,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Qwen2ForCausalLM(config).save_pretrained(out_dir)
    if tokenizer:
        tokenizer.save_pretrained(out_dir)
    return out_dir


ENV_SETTINGS = {"protocol": "search_r1", "max_turns": 3, "max_total_tokens": 700, "max_obs_tokens": 80}


def make_config(cls: Any, model_dir: str, world: Any, corpus: str, *, model=None, **training) -> Any:
    """A tiny, seeded config of ``cls`` (a Search*Config): ``world.train`` questions, BM25 over ``corpus``,
    2 prompts x 2 samples of at most 16 tokens a turn, lr 1e-3."""
    from rllib_search import ENV_ID
    from rllib_search.algos import SearchPPOConfig

    env_config = {"retriever": {"type": "bm25", "corpus": corpus}, "dataset": world.train, **ENV_SETTINGS}
    model_config = {"model": model_dir, **(model or {})}
    if cls is SearchPPOConfig:
        model_config.setdefault("value_head", True)
    return (
        cls()
        .environment(ENV_ID, env_config=env_config)
        .rl_module(model_config=model_config)
        .rollouts(group_size=2, prompts_per_sample=2, max_turn_tokens=16)
        .training(**{"lr": 1e-3, "micro_batch_size": 2, **training})
        .debugging(seed=11)
    )


def generated_logprobs(learner: Any, batch: Any) -> list[float]:
    """Each episode's mean log-probability of its generated tokens under ``learner``'s policy now, for the
    rows of ``batch`` (a train batch)."""
    import torch

    columns = {k: torch.as_tensor(v) for k, v in batch.policy_batches["default_policy"].items()}
    module = learner.module["default_policy"].unwrapped()
    with torch.no_grad():
        logprobs = module.forward_train(columns)["logprobs"]
    mask = columns["loss_mask"]
    return [float((logprobs[row] * mask[row]).sum() / mask[row].sum()) for row in range(len(mask))]


def policy_weights(algo: Any) -> dict[str, Any]:
    """The (local) learner's policy weights, cloned."""
    module = algo.learner_group._learner.module["default_policy"].unwrapped()
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


class KillsItsRunnerOnce:
    """A BM25 retriever over ``corpus`` that kills the EnvRunner actor holding it (``ray.kill``, so RLlib's
    restart applies) in the middle of a search: the first search of any runner after ``trigger`` appears.
    The trigger is claimed by an atomic rename (to ``trigger + ".fired"``), so exactly one runner dies
    once, mid-sample; every other search is BM25's own."""

    def __init__(self, corpus: str, trigger: str) -> None:
        self.corpus = corpus
        self.trigger = trigger
        self._bm25: Any = None

    def search(self, queries: Any, topk: int) -> Any:
        import os

        try:
            os.rename(self.trigger, self.trigger + ".fired")
        except FileNotFoundError:
            pass
        else:
            import time

            import ray

            ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
            time.sleep(120)  # the kill lands here; a restarted runner never gets this far
        if self._bm25 is None:
            from rllib_search.data.formats import iter_passages, read_corpus
            from rllib_search.serve.retrieval.bm25 import BM25Retriever

            self._bm25 = BM25Retriever(list(iter_passages(read_corpus(self.corpus))))
        return self._bm25.search(queries, topk)


class KillsReplicasOnce:
    """The Serve retriever client of ``spec`` (``{"type": "serve", ...}``) that, at its first search (in
    the middle of a rollout), kills every replica of the retriever deployment (``ray.kill``; Serve's
    controller starts new ones) and then searches as usual: that turn's queries must be retried until a
    new replica answers. ``killed`` names the replicas it killed; ``stats`` are the client's."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = dict(spec)
        self.killed: list[str] = []
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from rllib_search.serve.retrieval.client import build_retriever

            self._client = build_retriever(self.spec)
        return self._client

    @property
    def stats(self) -> Any:
        return self.client.stats

    def search(self, queries: Any, topk: int) -> Any:
        if not self.killed:
            self.killed = kill_retriever_replicas()
        return self.client.search(queries, topk)


def retriever_replicas() -> list[str]:
    """The names of the retriever deployment's live replica actors."""
    import ray

    from rllib_search.serve.retrieval.deployment import DEPLOYMENT_NAME

    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve"
        and DEPLOYMENT_NAME in actor["name"]
        and "REPLICA" in actor["name"].upper()
    ]


def kill_retriever_replicas() -> list[str]:
    """Kill every replica of the retriever deployment (no restart of those actors); returns their names."""
    import ray

    names = retriever_replicas()
    assert names, "no retriever replica found"
    for name in names:
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return names


def tuned_example(name: str) -> ModuleType:
    """``tuned_examples/<name>.py`` loaded as a module (the folder is scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "tuned_examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RayHead:
    """``ray start --head`` on 127.0.0.1 as a user starts one, on free ports and in a temp dir of its own
    (``ray start`` records its address there, not in /tmp/ray where every later ``ray.init()`` on this
    machine would find it; short, for socket paths). Returns once the dashboard answers, starting a fresh
    head when one dies or stays deaf on a loaded machine. :meth:`stop` kills its processes and removes the
    dir."""

    def __init__(self, prefix: str, environment: dict[str, str], *, attempts: int = 3) -> None:
        self.prefix, self.environment = prefix, environment
        for _ in range(attempts):
            self._start()
            if self._wait_for_dashboard(timeout_s=240):
                return
            log = self.log
            self.stop()  # died or deaf (a port taken between choosing and binding, a dashboard that failed)
        raise AssertionError(f"ray start --head: no dashboard after {attempts} heads; last log:\n{log}")

    def _start(self) -> None:
        from rllib_search.serve.http.ports import free_port

        ray_cli = str(Path(sys.executable).parent / "ray")
        gcs_port, agent_port, client_port = free_port(), free_port(), free_port()
        self.dashboard_port = free_port()
        self.temp_dir = Path(tempfile.mkdtemp(prefix=self.prefix, dir="/tmp"))
        self.log_path = Path(tempfile.mkstemp(prefix=f"{self.prefix}-", suffix=".log")[1])
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    ray_cli,
                    *("start", "--head", "--block", "--temp-dir", str(self.temp_dir)),
                    *("--node-ip-address", "127.0.0.1", "--port", str(gcs_port)),
                    *("--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port)),
                    "--num-cpus=2",
                    # Every fixed default port elsewhere: the test session's own Ray may hold them.
                    *(
                        "--dashboard-agent-listen-port",
                        str(agent_port),
                        "--ray-client-server-port",
                        str(client_port),
                    ),
                ],
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def log(self) -> str:
        """The last lines ``ray start`` printed, for a failure's message."""
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _wait_for_dashboard(self, timeout_s: float) -> bool:
        """True once the dashboard answers HTTP (any status: with token auth some routes say 401); False
        when ``ray start`` exits first or nothing answers within ``timeout_s``."""
        import requests

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(requests.RequestException):
                requests.get(f"{self.dashboard}/api/version", timeout=10)
                return True
            time.sleep(2)
        return False

    def submit(self, command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess:
        """``RAY_AUTH_MODE=token ray job submit --address <this head> <command>``, submitted again while the
        head is still coming up: its dashboard and job agent take a few seconds to answer, and on a loaded
        machine a starting head can drop the working dir's upload check or the hand-over to its job agent
        (RemoteDisconnected in _package_exists, a 500 with ServerDisconnectedError from
        submit_job_internal), in which case the job did not start."""
        ray_cli = str(Path(sys.executable).parent / "ray")
        submit = [ray_cli, "job", "submit", "--address", self.dashboard, *command]
        deadline = time.monotonic() + 600
        while True:
            done = subprocess.run(
                submit,
                env={**environment, "RAY_AUTH_MODE": "token"},
                capture_output=True,
                text=True,
                timeout=600,
            )
            logs = done.stdout + done.stderr
            starting = any(text in logs for text in ("Failed to connect", "No available agent"))
            starting |= "RemoteDisconnected" in logs and "_upload_package_if_needed" in logs
            starting |= "ServerDisconnectedError" in logs and "submit_job_internal" in logs
            if done.returncode == 0 or not starting:
                return done
            assert time.monotonic() < deadline, logs[-2000:]
            time.sleep(3)

    def stop(self) -> None:
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            for process in [self.process, *psutil.Process(self.process.pid).children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)
