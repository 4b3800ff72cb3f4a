"""Our Serve replicas' lifecycle: how often a stopping replica checks for requests in flight, and how many
replicas of a deployment are running (as the autoscaling test and benchmark watch it)."""

from __future__ import annotations

# A replica told to stop (its app deleted at a job's end, a scale-down) waits for its requests in flight,
# checking every this many seconds; Serve's default of 2 s is also the least a stop takes (an app's delete
# took 3 s instead of 1 s).
GRACEFUL_SHUTDOWN_CHECK_S = 0.2


def running_replicas(app: str, deployment: str) -> int:
    """The RUNNING replicas of ``deployment`` in the Serve application ``app`` (0 when either is absent)."""
    from ray import serve

    # serve.status() is Serve's public status API; replica_states maps a ReplicaState (a str enum) to a count.
    application = serve.status().applications.get(app)
    if application is None or deployment not in application.deployments:
        return 0
    states = application.deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))
