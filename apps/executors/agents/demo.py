"""The embedded demo's node agents: one `apps.agent` Agent per node of every cluster, each on its
own event loop in a daemon thread of the server process, talking to the server over loopback
HTTP with its node's own token, exactly as on a real node.

They run in single-user mode (every rank as the user running the server, without cgroups): a
one-user demo, which a production configuration refuses."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.agent.runner import DEFAULT_POLL_S, Agent, run_in_thread
from apps.topology.models import Cluster, Node

from .services import node_token_create

log = logging.getLogger(__name__)


def start_demo_agents(
    *,
    server: str,
    poll_s: float = DEFAULT_POLL_S,
    log_dir: str | None = None,
    on_start: Callable[[Agent], None] | None = None,
) -> list[Agent]:
    """Start an agent for every node of every cluster against `server` (base URL), rank output
    under `log_dir` (a new temporary folder by default); returns them. `on_start` is given each
    agent before it runs (a host that stops meanwhile can stop it: starting 68 agents takes a
    while). Refused (ImproperlyConfigured) in a production configuration (a server database, not
    under tests)."""
    if not settings.EMBEDDED and not settings.TESTING:
        raise ImproperlyConfigured(
            "the demo's single-user node agents run every rank as the server's user: refused with a"
            " server database; run `python -m apps.agent` as root on each node instead"
        )
    log_dir = log_dir or tempfile.mkdtemp(prefix="topoweb-demo-agents-")
    started: list[Agent] = []
    for cluster in Cluster.objects.order_by("pk"):
        for node in Node.objects.filter(cluster=cluster).order_by("position", "pk"):
            _, key = node_token_create(node=node)
            agent = Agent(
                server=server,
                node=node.name,
                token=key,
                log_dir=f"{log_dir}/{cluster.name}/{node.name}",
                poll_s=poll_s,
                addr="127.0.0.1",
                single_user=True,
                allow_root=True,
                stop_ranks_on_exit=True,
            )
            if on_start is not None:
                on_start(agent)
            run_in_thread(agent)
            started.append(agent)
    # The demo's own choice, not a problem: said once, at info.
    log.info(
        "started %d demo node agents in single-user mode: every rank runs as this server's user,"
        " without cgroups (rank output in %s)",
        len(started),
        log_dir,
    )
    return started
