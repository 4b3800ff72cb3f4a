"""Which Ray cluster a command joins: the one it was submitted to, or the one ``ray start`` started here.

``ray job submit`` sets ``RAY_ADDRESS`` for the job's driver; a local ``ray start`` records its address in
``/tmp/ray/ray_current_cluster``. Ray's own ``address="auto"`` also falls back to ANY Ray running on the
machine, which includes other programs' private ``ray.init`` sessions (a test suite, a notebook); joining
one of those would tie a job to a process that can end at any moment. So a command joins only a cluster it
was pointed at or one ``ray start`` started (and that is still alive), and otherwise starts its own.
"""

from __future__ import annotations

import os


def cluster_address() -> str | None:
    """The address of the cluster to join, or None to start a local Ray."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        return address
    # Ray keeps no public API for "the cluster `ray start` started here"; these are what ray.init() reads.
    from ray._private.services import find_bootstrap_address, find_gcs_addresses

    started = find_bootstrap_address(None)
    return started if started and started in find_gcs_addresses() else None


# Serve's controller kills an HTTP proxy that is not ready within RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S
# (5 s by default). A fresh worker process that imports Serve on a loaded 2-core machine can take longer,
# and `serve.start` then fails with "the actor is dead because it was killed by ray.kill".
PROXY_READY_TIMEOUT_S = "60"


def patient_serve_proxies() -> None:
    """Give Serve's proxies of a Ray this process is about to start a minute to come up (unless the user set
    the timeout). Call before ``ray.init``: the cluster's processes inherit this environment."""
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", PROXY_READY_TIMEOUT_S)
