"""The control plane under fault while agents run ranks: a web server restart and terminated
database connections while ranks start (granian, as production runs it, serving the test
database), and a 3-minute web outage with the product's default lease settings."""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import urlparse

import psycopg
import pytest
from django.db import connection

from apps.scheduling.choices import RankState
from apps.scheduling.models import RankRun
from tests.integration.agents import TcpProxy

from .harness import WebServer, wait_until
from .test_agent_faults import NODES, running, synced_since

# The outage of class 10; TOPOWEB_CHAOS_OUTAGE_S shortens it on a developer's machine only.
OUTAGE_S = float(os.environ.get("TOPOWEB_CHAOS_OUTAGE_S", "180"))


def _terminate_backends(stop: threading.Event, spare: int, every_s: float = 0.3) -> int:
    """pg_terminate_backend every session of the test database but `spare` (the test's own) and
    this one until `stop`; how many."""
    s = connection.settings_dict
    killed = 0
    with psycopg.connect(
        host=s["HOST"] or None,
        port=s["PORT"] or None,
        user=s["USER"] or None,
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=True,
    ) as admin:
        while not stop.is_set():
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> %s",
                (spare,),
            ).fetchall()
            killed += sum(1 for (ok,) in rows if ok)
            stop.wait(every_s)
    return killed


def test_web_server_restart_and_dropped_db_connections(chaos, settings, tmp_path):
    """The agents talk to the real web server (granian, WSGI on threads). Right after two jobs
    are placed, while their ranks start and report, every database session is terminated every
    0.3 s for 4 s and the server is restarted: the reports are retried, both jobs run in their
    first generation, nothing runs twice. Lease settings valid for the product's checks (down
    30 s, fence 20 s) in both processes; cycles run in the web server on reports (no broker given: eager, the
    embedded default) and in the checker."""
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = 20.0
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "CACHE_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        TOPOWEB_TESTING="1",
        TOPOWEB_AGENT_DOWN_AFTER_S="30",
        TOPOWEB_AGENT_FENCE_AFTER_S="20",
        TOPOWEB_AGENT_POLL_S="5",
    )
    web = WebServer(tmp_path, env)
    web.start()
    try:
        for node in NODES:
            chaos.agents.start(node, multi_user=True, server=web.url)
        wait_until(lambda: all(synced_since(chaos, n, 0) for n in NODES), 60, "both agents synced")
        stop = threading.Event()
        killed: list[int] = []
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            own = cursor.fetchone()[0]
        terminator = threading.Thread(
            target=lambda: killed.append(_terminate_backends(stop, own)), daemon=True
        )
        first = chaos.submit(0, "alice-8", 8)
        second = chaos.submit(1, "bob-8", 8)
        chaos.fault()
        terminator.start()
        try:
            # While the ranks start: the first start reports are in, or a second went by.
            wait_until(
                lambda: RankRun.objects.filter(job__in=(first, second)).exists()
                or time.monotonic() - chaos.fault_at > 1,
                10,
                "the ranks to start",
                period_s=0.05,
            )
            web.restart()
            while time.monotonic() - chaos.fault_at < 4:
                time.sleep(0.1)
        finally:
            stop.set()
            terminator.join(timeout=30)
        chaos.extra.update(backends_terminated=sum(killed))
        assert sum(killed) > 0
        chaos.recovered(
            lambda: running(chaos, first, 1) and running(chaos, second, 1), 120, "both jobs running"
        )
        chaos.finish()
    finally:
        web.stop()


@pytest.mark.chaos_slow
def test_web_outage_3_minutes(chaos, settings, live_server):
    """Every agent is cut off from the web for 3 minutes (a TCP proxy; the database and the
    checker keep running), with the product's default lease settings and poll: 0 ranks stop,
    both jobs run on in their first generation, both nodes sync again after."""
    for name, value in chaos.defaults.items():
        setattr(settings, name, value)
    where = urlparse(live_server.url)
    proxy = TcpProxy((where.hostname, where.port))
    try:
        for node in NODES:
            chaos.agents.start(node, 60.0, multi_user=True, server=proxy.url)
        first = chaos.submit(0, "alice-8", 8, SLEEP_S=str(OUTAGE_S + 300))
        second = chaos.submit(1, "bob-8", 8, SLEEP_S=str(OUTAGE_S + 300))
        for job in (first, second):
            wait_until(lambda job=job: running(chaos, job), 90, f"{job.name} to run")
        before = {p.launch for p in chaos.watcher.seen.live}
        assert len(before) == 16
        proxy.cut()
        chaos.fault()
        time.sleep(OUTAGE_S)
        proxy.heal()
        healed = time.time()
        chaos.recovered(
            lambda: all(synced_since(chaos, n, healed) for n in NODES), 90, "both nodes syncing again"
        )
        time.sleep(1)
        stopped = before - {p.launch for p in chaos.watcher.seen.live}
        chaos.extra.update(ranks_stopped=len(stopped), outage_s=OUTAGE_S)
        assert not stopped, f"{len(stopped)} ranks stopped by the outage: {sorted(stopped)[:8]}"
        assert not RankRun.objects.filter(job__in=(first, second), state=RankState.EXITED).exists()
        assert running(chaos, first, 1) and running(chaos, second, 1)
        chaos.finish()
    finally:
        proxy.close()
