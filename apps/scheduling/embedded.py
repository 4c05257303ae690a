"""The embedded default's stand-in for celery beat: a daemon thread that runs a scheduling cycle
and migration proposals for every cluster every `interval_s` seconds."""

from __future__ import annotations

import logging
import threading
from functools import partial

from django.db import close_old_connections

from apps.topology.retry import retry_when_locked

log = logging.getLogger(__name__)

_RUNNING: PeriodicScheduler | None = None
_START_LOCK = threading.Lock()


class PeriodicScheduler(threading.Thread):
    """Runs `tick()` every `interval_s` seconds until `stop()`."""

    def __init__(self, interval_s: float):
        super().__init__(name="topoweb-periodic-scheduler", daemon=True)
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be positive, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._stop_event = threading.Event()
        self.ticks = 0

    def stop(self) -> None:
        """Ask the thread to finish after its current tick."""
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.tick()
            self._stop_event.wait(self.interval_s)

    def tick(self) -> None:
        """One round on every cluster: node health and start timeouts, a cycle, re-pricing of the
        active jobs, then migration proposals; errors are logged."""
        from apps.topology.models import Cluster

        from .cycle import schedule_cluster
        from .executor import reconcile
        from .pricing import active_jobs_reprice
        from .proposals import migrations_propose

        close_old_connections()
        try:
            for cluster in Cluster.objects.order_by("pk"):
                # The executor's convergence first: node health, fenced ranks, Slurm's states.
                for step in (reconcile, schedule_cluster, active_jobs_reprice, migrations_propose):
                    try:
                        retry_when_locked(partial(step, cluster=cluster), what=step.__name__)
                    except Cluster.DoesNotExist:
                        break
                    except Exception:
                        log.exception("periodic %s on cluster %s failed", step.__name__, cluster.name)
        finally:
            self.ticks += 1
            close_old_connections()


def start_periodic_scheduler(interval_s: float = 10) -> PeriodicScheduler:
    """Start (once per process) the daemon thread that schedules every cluster each `interval_s`
    seconds; returns the running thread."""
    global _RUNNING
    with _START_LOCK:
        if _RUNNING is None or not _RUNNING.is_alive():
            _RUNNING = PeriodicScheduler(interval_s)
            _RUNNING.start()
        return _RUNNING
