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
