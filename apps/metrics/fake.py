"""The simulated exporter's server: real dcgm-exporter text (and node-exporter InfiniBand
counters) for every node of the chosen clusters, at `/clusters/<cluster>/nodes/<node>/metrics`,
recomputed every `refresh_s` seconds from the jobs placed now (see `simulate`)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from django.db import DatabaseError, close_old_connections

from apps.placement.jobs import load_job
from apps.scheduling import snapshot as snap
from apps.scheduling.models import Job
from apps.topology.models import Cluster, Node

from .simulate import DEFAULT_NIC_EFFICIENCY, NicCounters, RunningJob, gpu_states, network_scaled, node_pages

log = logging.getLogger(__name__)


def exporter_url(base: str, cluster: str, node: str) -> str:
    """The URL at which the simulated exporter serves one node."""
    return f"{base.rstrip('/')}/clusters/{cluster}/nodes/{node}/metrics"


class _ClusterSim:
    def __init__(self, cluster: Cluster, efficiency: float):
        self.cluster_id = cluster.pk
        self.efficiency = efficiency
        self.topology = None
        self.true_topology = None
        self.counters: NicCounters | None = None
        self.last = time.monotonic()
        self.scrapes = 0

    def pages(self) -> dict[str, str]:
        cluster = Cluster.objects.get(pk=self.cluster_id)
        snapshot = snap.cluster_snapshot(cluster=cluster)
        topology = snapshot.topology
        if topology is not self.topology:
            self.topology = topology
            self.true_topology = network_scaled(topology, self.efficiency)
            self.counters = NicCounters(topology)
        running = {a.job_id: a for a in snapshot.active if a.running and a.gids}
        rows = {
            pk: (spec, predicted)
            for pk, spec, predicted in Job.objects.filter(pk__in=running).values_list(
                "pk", "spec", "predicted"
            )
        }
        jobs = [
            RunningJob(load_job(rows[pk][0]), a.gids, rows[pk][1]) for pk, a in running.items() if pk in rows
        ]
        states = gpu_states(topology, self.true_topology, jobs, snapshot.link_load)
        now = time.monotonic()
        self.counters.advance(states, now - self.last)
        self.last = now
        self.scrapes += 1
        pages = node_pages(topology, states, seed=self.scrapes)
        return {node: text + self.counters.text(node) for node, text in pages.items()}


class SimulatedExporter:
    """Pages of the simulated exporter for clusters `names` (all when empty), kept fresh by a
    daemon thread; `serve(host, port)` answers them over HTTP."""

    def __init__(self, names: list[str] | None = None, *, nic_efficiency: float = DEFAULT_NIC_EFFICIENCY):
        self.names = names or []
        self.efficiency = nic_efficiency
        self.pages: dict[tuple[str, str], str] = {}
        self._sims: dict[str, _ClusterSim] = {}
        self._stop = threading.Event()
        self.server: ThreadingHTTPServer | None = None

    def refresh(self) -> None:
        """Recompute every node's page from the jobs placed now; a failure keeps the last pages."""
        clusters = Cluster.objects.order_by("pk")
        if self.names:
            clusters = clusters.filter(name__in=self.names)
        pages = {}
        try:
            clusters = list(clusters)
        except DatabaseError:
            log.exception("simulated exporter: cannot read the clusters")
            return
        for cluster in clusters:
            sim = self._sims.get(cluster.name)
            if sim is None or sim.cluster_id != cluster.pk:
                sim = self._sims[cluster.name] = _ClusterSim(cluster, self.efficiency)
            try:
                pages.update({(cluster.name, node): text for node, text in sim.pages().items()})
            except Exception:
                log.exception("simulated exporter: cluster %s failed", cluster.name)
        self.pages = pages

    def point_nodes(self, base: str, *, only_unset: bool = True) -> int:
        """Set the nodes' dcgm_url to this exporter (only empty or simulated ones unless told);
        returns how many changed. A queryset update: the topology itself is unchanged."""
        changed = 0
        nodes = Node.objects.select_related("cluster")
        if self.names:
            nodes = nodes.filter(cluster__name__in=self.names)
        for node in nodes.only("id", "name", "dcgm_url", "cluster__name"):
            url = exporter_url(base, node.cluster.name, node.name)
            simulated = "/clusters/" in node.dcgm_url and node.dcgm_url.endswith("/metrics")
            if node.dcgm_url != url and (not only_unset or not node.dcgm_url or simulated):
                Node.objects.filter(pk=node.pk).update(dcgm_url=url)
                changed += 1
        return changed

    def serve(self, host: str, port: int, *, refresh_s: float = 5.0) -> ThreadingHTTPServer:
        """Start the refresher and the HTTP server threads; returns the server (port 0: any)."""
        self.refresh()
        self.server = _Server((host, port), _handler(self))
        threading.Thread(target=self.server.serve_forever, name="fake-dcgm-http", daemon=True).start()
        threading.Thread(target=self._loop, args=(refresh_s,), name="fake-dcgm-refresh", daemon=True).start()
        return self.server

    def stop(self) -> None:
        """Stop refreshing and serving."""
        self._stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def _loop(self, refresh_s: float) -> None:
        while not self._stop.wait(refresh_s):
            close_old_connections()
            try:
                self.refresh()
            finally:
                close_old_connections()


class _Server(ThreadingHTTPServer):
    # A collector opens a hundred connections at once; the default backlog of 5 would drop them.
    request_queue_size = 1024
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A collector past its timeout (a loaded machine) closes its connection before the page
        # is written: as a real exporter, nothing to report. Anything else is printed as before.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _handler(exporter: SimulatedExporter):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # one line per scrape would drown the server log
            pass

        def do_GET(self):
            parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
            page = None
            if len(parts) == 5 and parts[0] == "clusters" and parts[2] == "nodes" and parts[4] == "metrics":
                page = exporter.pages.get((parts[1], parts[3]))
            if page is None:
                self.send_error(404, "no such node")
                return
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler
