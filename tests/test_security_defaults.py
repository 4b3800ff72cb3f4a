"""Security defaults: what our commands start binds 127.0.0.1 unless told otherwise, exposure is warned
about, shipped Serve configs stay on loopback, and the Prometheus metrics port of a local Ray listens
where docs/security.md says (all interfaces, unless the node's IP is a loopback address)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import psutil
import pytest
import yaml

from rllib_search.serve.cli import add_serve_commands, exposure_warnings, http_options

ROOT = Path(__file__).resolve().parents[1]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rllib-search")
    add_serve_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv", [("serve", "retriever", "--index", "idx"), ("serve", "judge")])
def test_serve_commands_bind_loopback_by_default(argv):
    args = _parse(*argv)
    assert http_options(args)["host"] == "127.0.0.1"
    assert exposure_warnings(args.host, getattr(args, "high_throughput", False)) == []
    exposed = _parse(*argv, "--host", "0.0.0.0")
    assert http_options(exposed)["host"] == "0.0.0.0"
    assert "binds 0.0.0.0" in exposure_warnings(exposed.host, False)[0]


def test_high_throughput_mode_states_its_all_interfaces_binding():
    args = _parse("serve", "retriever", "--index", "idx", "--high-throughput")
    (line,) = exposure_warnings(args.host, args.high_throughput)
    assert "ALL interfaces" in line and "30000-31000" in line


@pytest.mark.parametrize("name", ["serve_cpu.yaml", "serve_gpu.yaml", "serve_gpu_llm.yaml"])
def test_shipped_serve_configs_bind_loopback(name):
    config = yaml.safe_load((ROOT / "tuned_examples" / name).read_text())
    assert config["http_options"]["host"] == "127.0.0.1"


@pytest.mark.slow
def test_serve_http_listens_on_loopback_only(service):
    """The HTTP port Serve opened with our http_options (the session's retriever) listens on 127.0.0.1
    and on no other address."""
    port = int(service.split(":")[2].split("/")[0])
    listening = {
        c.laddr.ip
        for c in psutil.net_connections(kind="inet")
        if c.status == "LISTEN" and c.laddr.port == port
    }
    assert listening == {"127.0.0.1"}


def _listening(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.net_connections(kind="inet")
        if c.status == "LISTEN" and c.laddr.port == port
    }


@pytest.mark.slow
def test_the_metrics_port_listens_where_docs_security_says(ray_cluster):
    """Ray binds its Prometheus exporter (``_metrics_export_port``, the port ``recipes/jobs.py`` prints) to
    127.0.0.1 only when the node's IP is a loopback address; on a Linux node with a network address it
    listens on all interfaces, with no authentication (docs/security.md)."""
    import ray

    (node,) = [node for node in ray.nodes() if node.get("Alive")]
    port = node.get("MetricsExportPort")
    assert port, node
    deadline = time.monotonic() + 60  # the node's agent opens it after the node registers
    while not _listening(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    loopback = node["NodeManagerAddress"] in ("127.0.0.1", "localhost", "::1")
    assert _listening(port) == ({"127.0.0.1"} if loopback else {"0.0.0.0"})
