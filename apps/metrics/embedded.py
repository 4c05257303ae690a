"""The embedded default's metrics: the simulated exporter served in-process and a thread that
collects every cluster each `interval_s` seconds (celery beat does the latter in production)."""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections

from .fake import SimulatedExporter

log = logging.getLogger(__name__)

_STARTED: dict[str, object] = {}
_LOCK = threading.Lock()


class PeriodicCollector(threading.Thread):
    """Runs a collection pass on every cluster every `interval_s` seconds until `stop()`."""

    def __init__(self, interval_s: float):
        super().__init__(name="topoweb-metrics-collector", daemon=True)
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be positive, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._stop_event = threading.Event()
        self.passes = 0

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """One pass over every cluster; a failing cluster is logged, the others still run."""
        from apps.topology.models import Cluster

        from .services import metrics_collect

        close_old_connections()
        try:
            for cluster in Cluster.objects.order_by("pk"):
                try:
                    metrics_collect(cluster=cluster)
                except Exception:
                    log.exception("metrics collection on cluster %s failed", cluster.name)
        finally:
            self.passes += 1
            close_old_connections()


def start_embedded_metrics(*, host: str, port: int, interval_s: float = 5.0) -> SimulatedExporter | None:
    """Serve the simulated exporter for every cluster on host:port (any free port if that one is
    taken), point the nodes without an exporter (or with a simulated one) at it, and collect every
    `interval_s` seconds. Once per process; returns the exporter, or None when it could not start
    (the web server runs on without measurements)."""
    with _LOCK:
        if "exporter" in _STARTED:
            return _STARTED["exporter"]
        exporter = SimulatedExporter()
        try:
            try:
                server = exporter.serve(host, port, refresh_s=interval_s)
            except OSError:
                log.warning("port %s is taken: the simulated dcgm-exporter takes any free port", port)
                server = exporter.serve(host, 0, refresh_s=interval_s)
            bound = f"http://{host}:{server.server_address[1]}"
            changed = exporter.point_nodes(bound)
        except Exception:
            log.exception("the simulated dcgm-exporter did not start; no measurements in this process")
            exporter.stop()
            return None
        log.info("simulated dcgm-exporter on %s (%d nodes pointed at it)", bound, changed)
        collector = PeriodicCollector(interval_s)
        collector.start()
        _STARTED.update(exporter=exporter, collector=collector)
        return exporter
