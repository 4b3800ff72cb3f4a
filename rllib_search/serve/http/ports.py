"""A free local TCP port, for a Serve HTTP proxy, a test server or a benchmark's server.

The port is picked outside the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999
on Linux by default). A port the kernel hands out for ``bind(0)`` is free when it is returned but the
kernel may hand it out again before the caller binds it: every process that binds port 0 or opens an
outgoing connection draws from that range, and a local Ray starting up does both dozens of times. That
race failed a Serve proxy's bind in CI ("Failed to bind to address '127.0.0.1:34005'"). Ports below the
ephemeral range are never handed out implicitly, so one found free stays free unless someone names it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

# Ray's own named ports sit below LOWEST_PORT (GCS 6379, dashboard 8265, client 10001, workers
# 10002-19999) or from HIGHEST_PORT on (Serve's high-throughput mode gives replicas 30000-31000).
LOWEST_PORT = 20000
HIGHEST_PORT = 30000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default, used where the file cannot be read
TRIES = 200


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (low, high), or Linux's default where it cannot be read."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP socket can bind ``host:port`` now."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None, exclude: Collection[int] = ()) -> int:
    """A TCP port free on 127.0.0.1 now, in 20000-29999 (below the ephemeral range, clear of Ray's ports)
    so that no implicit bind takes it before the caller binds it. Falls back to a kernel-chosen port if
    the ephemeral range leaves no room there or nothing there is free. ``exclude``: ports already handed
    to servers that have not bound them yet (free now, taken soon: CI once gave two servers one port)."""
    rng = rng or random.SystemRandom()  # two pytest-xdist workers must not draw the same sequence
    high = min(HIGHEST_PORT, ephemeral_range()[0])
    if high - LOWEST_PORT >= 1000:
        for _ in range(TRIES):
            port = rng.randrange(LOWEST_PORT, high)
            if port not in exclude and is_free(port):
                return port
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in exclude:
            return port
