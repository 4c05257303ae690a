"""`manage.py serve_embedded --addr HOST:PORT`: the embedded default's web server.

Django's development server without the autoreloader (one process, so in-process background work
stays single), static files served by WhiteNoise so it works with DEBUG off.
"""

import logging
import signal
import socket
import sys
import threading
import time

from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DatabaseError


def _quiet_agent_polls(record: logging.LogRecord) -> bool:
    """False for a successful node-agent poll's request-log line (errors are still logged)."""
    return "/api/v1/agents/sync/" not in record.getMessage() or getattr(record, "status_code", 200) >= 400


LISTEN_WAIT_S = 120.0  # how long the demo agents wait for the server to listen before starting anyway
CLOSE_WAIT_S = 5.0  # how long a stopping server lets its agents' loops signal the ranks they were starting


def wait_listening(host: str, port: int, *, timeout_s: float = LISTEN_WAIT_S, step_s: float = 0.1) -> bool:
    """Whether host:port accepts a TCP connection within `timeout_s` (tried every `step_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=step_s):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(step_s)


class _DemoAgents:
    """The demo's agents as they start (from another thread); once `close`d, every rank of theirs
    is stopped and an agent added later is stopped before it runs (the server may stop while the
    agents are being started)."""

    def __init__(self):
        self.items: list = []
        self._lock = threading.Lock()
        self._closed = False

    def add(self, agent) -> None:
        with self._lock:
            self.items.append(agent)
            if not self._closed:
                return
        agent.terminate_ranks()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            items = list(self.items)
        for agent in items:
            agent.terminate_ranks()
        # A rank whose start was under way gets its SIGTERM from its agent's loop once its process
        # exists: the loops (daemon threads, which end with this process) get that long to run,
        # or the rank would outlive the server in its own session.
        deadline = time.monotonic() + CLOSE_WAIT_S
        for agent in items:
            if agent.thread is not None:
                agent.thread.join(max(0.0, deadline - time.monotonic()))


class Command(BaseCommand):
    help = "Serve TopoWeb on HOST:PORT with Django's server, without autoreload."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="HOST:PORT to listen on")
        parser.add_argument(
            "--dcgm-port",
            type=int,
            default=9400,
            help="port of the in-process simulated dcgm-exporter (0: any)",
        )
        parser.add_argument(
            "--no-agents",
            action="store_true",
            help="do not run the simulated nodes' agents in this process",
        )

    def _start_agents(self, addr: str, agents: _DemoAgents) -> None:
        """Start the demo's node agents once the server answers on `addr` (into `agents`)."""
        from django.db import close_old_connections

        from apps.executors.agents.demo import start_demo_agents

        host, port = addr.rsplit(":", 1)
        if not wait_listening(host or "127.0.0.1", int(port)):
            self.stderr.write(
                f"the server did not listen on {addr} within {LISTEN_WAIT_S:.0f} s; no node agents"
            )
            return
        try:
            start_demo_agents(server=f"http://{addr}", on_start=agents.add)
        except (DatabaseError, ImproperlyConfigured) as exc:
            # An unmigrated database serves its pages (and errors) without agents.
            self.stderr.write(f"no node agents: {exc}")
            return
        finally:
            close_old_connections()
        self.stdout.write(
            f"{len(agents.items)} node agents run the demo nodes' ranks in this process, in single-user"
            " mode: every rank runs as this server's user, without cgroups"
        )

    def handle(self, *args, addr: str, dcgm_port: int, no_agents: bool = False, **options):
        self.stdout.write(f"TopoWeb on http://{addr}/ (admin at http://{addr}/admin/)")
        # No celery beat in the embedded default: a thread runs the scheduling cycles instead.
        from apps.scheduling.embedded import start_periodic_scheduler

        start_periodic_scheduler(interval_s=10)
        # The demo is measured too: a simulated exporter for every node and a collector thread.
        from apps.metrics.embedded import start_embedded_metrics

        start_embedded_metrics(host=addr.rsplit(":", 1)[0] or "127.0.0.1", port=dcgm_port)
        agents = _DemoAgents()
        if not no_agents:
            # The demo's nodes run their agents here: jobs run real (dummy) rank processes. They
            # start once the server listens: a poll before that would only fail and warn.
            threading.Thread(
                target=self._start_agents, args=(addr, agents), name="demo-agents-start", daemon=True
            ).start()
            # The demo's jobs come back as they finish, so the graph stays busy however long it runs.
            from apps.scheduling.demo import start_demo_workload

            start_demo_workload()
            # Every agent polls at least once a minute: keep their successful polls out of the request log.
            logging.getLogger("django.server").addFilter(_quiet_agent_polls)
        # SIGTERM ends the server like Ctrl-C, so the ranks are stopped below.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            call_command("runserver", addr, use_reloader=False, skip_checks=False)
        finally:
            # Rank processes run in their own sessions: they would outlive the server.
            agents.close()
