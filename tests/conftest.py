"""Shared fixtures: real tokenizers (a tiny one built here, the bundled SmolLM2), a small real corpus, and
one real retrieval service (Ray + Serve on 127.0.0.1) for the whole session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from rllib_search.data.formats import write_corpus_jsonl
from rllib_search.data.synthetic import SyntheticWorldConfig, generate_world
from rllib_search.serve.cluster import patient_serve_proxies
from rllib_search.serve.http.ports import free_port
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from rllib_search.serve.retrieval.build import build_index
from rllib_search.serve.retrieval.deployment import APP_NAME, build_retriever_app
from tests.helpers import PASSAGES, RECORDS, build_tiny_sliding_window_lm

# The files that take minutes (Tune studies, Ray jobs, a dozen actors), collected first: each pytest-xdist
# worker runs whole files, so the longest ones starting first let the workers finish together rather than
# one worker running a long file alone at the end.
LONGEST_FILES = (
    "test_placement.py",
    "test_findings.py",
    "test_tuned_examples.py",
    "test_evidence.py",
    "test_sft_trainer.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine they lose a lot
    (measured: 0.4 s against 18 s for the same engine test while another process held a core)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seeded_global_rngs():
    """Every test starts from the same global RNG state (Python, numpy, torch), so a draw that a test
    forgot to seed is still the same on every run. Ray actors seed from the configs' ``seed``."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer trained here, saved to a temp dir and loaded back by path."""
    from transformers import AutoTokenizer

    from rllib_search.llm.tiny import build_tiny_tokenizer

    path = build_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The tokenizer of the bundled SmolLM2-135M-Instruct (GGUF converted once, then cached)."""
    from rllib_search.llm.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def retriever():
    return BM25Retriever(PASSAGES)


@pytest.fixture(scope="session")
def world_retriever(world):
    """BM25 over the session world's passages (teacher episodes in the rollout and reading tests)."""
    return BM25Retriever(world.passages)


@pytest.fixture
def records():
    return list(RECORDS)


@pytest.fixture(scope="session")
def world():
    return generate_world(SyntheticWorldConfig(seed=3, num_passages=300, num_train=20, num_test=30))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, world) -> str:
    """The session world's passages as a corpus.jsonl (its path), for BM25 retrievers in training tests."""
    path = tmp_path_factory.mktemp("world_corpus") / "corpus.jsonl"
    write_corpus_jsonl(world.passages, path)
    return str(path)


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory, world) -> Path:
    root = tmp_path_factory.mktemp("retriever_index")
    write_corpus_jsonl(world.passages, root / "corpus.jsonl")
    build_index(root / "corpus.jsonl", root / "flat", kind="flat", encoder="all-minilm-l6-v2", progress=False)
    return root / "flat"


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the session (4 logical CPUs: two retriever replicas and two learners fit)."""
    import ray

    # address="local": a private Ray even where another cluster runs on this machine (`ray start`, another
    # test run): joining it would refuse num_cpus and tie the tests to its lifetime.
    patient_serve_proxies()
    ray.init(
        address="local", num_cpus=4, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def service(ray_cluster, index_dir):
    """Serve on loopback with two retriever replicas; yields the /retrieve URL."""
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_retriever_app(
        {
            "index_dir": str(index_dir),
            "encoder": "all-minilm-l6-v2",
            "num_replicas": 2,
            "ray_actor_options": {"num_cpus": 0.5},
            "limits": {"max_queries": 64, "max_query_chars": 500, "max_topk": 10},
            "max_batch_queries": 256,
            "batch_wait_timeout_s": 0.01,
        }
    )
    serve.run(app, name=APP_NAME, route_prefix="/")
    yield f"http://127.0.0.1:{port}/retrieve"
    serve.shutdown()


JUDGE_LIMITS = {"max_prompts": 8, "max_prompt_chars": 4000, "max_prompt_tokens": 300, "max_tokens": 16}


@pytest.fixture(scope="session")
def judge_model_dir(tmp_path_factory):
    """A tiny Gemma-3: another family than the tiny Llama policies of the tests."""
    from rllib_search.llm.tiny import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("judge_model")
    return build_tiny_sliding_window_lm(root / "model", build_tiny_tokenizer(root / "tok"))


@pytest.fixture(scope="session")
def judge_url(service, judge_model_dir):
    """The tiny judge as the Serve app ``judge`` (one replica) beside the session's retriever; yields its
    OpenAI base URL."""
    from ray import serve

    from rllib_search.serve.judge.deployment import build_judge_app

    app = build_judge_app(
        {
            "model": str(judge_model_dir),
            "served_model_name": "tiny-judge",
            "num_replicas": 1,
            "ray_actor_options": {"num_cpus": 0.5},
            "limits": JUDGE_LIMITS,
            "max_batch_prompts": 64,
            "batch_wait_timeout_s": 0.02,
            "default_max_tokens": 6,
        }
    )
    serve.run(app, name="judge", route_prefix="/judge")
    return service.rsplit("/", 1)[0] + "/judge/v1"
