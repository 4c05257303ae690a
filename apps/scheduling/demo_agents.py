"""The embedded demo's node agents: one `apps.agent` Agent per node of every cluster, each on its
own event loop in a daemon thread of the server process, talking to the server over loopback
HTTP with its cluster's launcher token, exactly as on a real node."""

from __future__ import annotations

import logging
import tempfile

from apps.agent.runner import DEFAULT_POLL_S, Agent, run_in_thread
from apps.topology.models import Cluster, Node

from .models import LauncherToken
from .services import launcher_token_create

log = logging.getLogger(__name__)


def start_demo_agents(
    *, server: str, poll_s: float = DEFAULT_POLL_S, log_dir: str | None = None
) -> list[Agent]:
    """Start an agent for every node of every cluster against `server` (base URL), rank output
    under `log_dir` (a new temporary folder by default); returns them."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="topoweb-demo-agents-")
    started: list[Agent] = []
    for cluster in Cluster.objects.order_by("pk"):
        token = LauncherToken.objects.filter(cluster=cluster).first() or launcher_token_create(
            cluster=cluster
        )
        for name in (
            Node.objects.filter(cluster=cluster).order_by("position", "pk").values_list("name", flat=True)
        ):
            agent = Agent(
                server=server,
                node=name,
                token=token.key,
                log_dir=f"{log_dir}/{cluster.name}/{name}",
                poll_s=poll_s,
                addr="127.0.0.1",
            )
            run_in_thread(agent)
            started.append(agent)
    log.info("started %d demo node agents (rank output in %s)", len(started), log_dir)
    return started
