"""How many replicas of a Serve deployment are running, as the autoscaling test and benchmark watch it."""

from __future__ import annotations


def running_replicas(app: str, deployment: str) -> int:
    """The RUNNING replicas of ``deployment`` in the Serve application ``app`` (0 when either is absent)."""
    from ray import serve

    # serve.status() is Serve's public status API; replica_states maps a ReplicaState (a str enum) to a count.
    application = serve.status().applications.get(app)
    if application is None or deployment not in application.deployments:
        return 0
    states = application.deployments[deployment].replica_states
    return int(states.get("RUNNING", 0))
