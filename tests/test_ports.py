"""free_port picks ports that neither the kernel nor Ray hands out implicitly, and they bind."""

from __future__ import annotations

import random
import socket

from rllib_search.serve.http.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    HIGHEST_PORT,
    LOWEST_PORT,
    ephemeral_range,
    free_port,
    is_free,
)


def test_free_ports_sit_below_the_ephemeral_range_and_bind():
    high = min(HIGHEST_PORT, ephemeral_range()[0])
    ports = [free_port(random.Random(seed)) for seed in range(20)]
    assert all(LOWEST_PORT <= port < high for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_a_port_in_use_is_not_free_and_is_skipped():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port(random.Random(0))))
        held.listen()
        taken = held.getsockname()[1]
        assert not is_free(taken)
        # the same seed draws `taken` again; the picker skips it for a later free draw
        assert free_port(random.Random(0)) != taken


def test_an_excluded_port_is_skipped_though_free():
    """Two servers handed ports before either binds must not get the same one."""
    first = free_port(random.Random(0))
    assert is_free(first)  # nobody bound it: only ``exclude`` keeps the same draw from returning it
    assert free_port(random.Random(0), exclude=[first]) != first


def test_ephemeral_range_reads_the_kernel_file_and_falls_back(tmp_path):
    kernel_file = tmp_path / "ip_local_port_range"
    kernel_file.write_text("40000\t50000\n")
    assert ephemeral_range(kernel_file) == (40000, 50000)
    kernel_file.write_text("garbage")
    assert ephemeral_range(kernel_file) == DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL_RANGE
