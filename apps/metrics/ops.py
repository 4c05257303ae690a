"""TopoWeb's own state in Prometheus exposition (`GET /metrics`): queue depth and wait by reason
class, GPUs by state, nodes by state, agents behind, scheduling cycle time, predicted against
measured step time, jobs by status.

Everything is computed at scrape time by `OpsCollector` in a few aggregate queries (about ten,
whatever the cluster's size). Labels are bounded: cluster, a fixed set of states and reason
classes, and job ids only for the `TOP_GAPS` running jobs furthest from their prediction.
Alert rules and a Grafana dashboard over these series are in deploy/.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections import Counter, defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Exists, Min, OuterRef, Subquery
from django.db.models.functions import Substr
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from apps.scheduling.choices import WAITING_STATUSES, JobStatus, NodeState
from apps.scheduling.models import Allocation, Job, NodeHealth, SchedulingCycle
from apps.scheduling.reconcile import booked_without_rank
from apps.topology.models import Cluster, Gpu, Node

from .models import JobSample

TOP_GAPS = 10  # running jobs furthest from their predicted step time, with a job label
SAMPLE_FRESH = timedelta(minutes=15)  # older job samples are not "measured now"
GPU_STATES = ("free", "placed", "unhealthy", "unavailable")

# Pending reasons (apps/placement/planner.py, apps/scheduling) by what holds the job back, first
# match wins; a reason matching none is "other", an empty one "none" (not yet seen by a cycle).
REASON_CLASSES = (
    ("account_limit", ("account ",)),
    ("reservation", ("waiting behind job", "reserved to start", "start time unknown")),
    ("preempting", ("preempting ", "waiting for the ranks")),
    ("requeued", ("requeued", "preempted", "node ")),
    ("resources", ("not enough", "no ", "needs ", "only ")),
)
REASON_NAMES = (*(name for name, _ in REASON_CLASSES), "other", "none")


def reason_class(reason: str) -> str:
    """The bounded class of a pending reason (one of REASON_NAMES)."""
    text = reason.strip().lower()
    if not text:
        return "none"
    for name, prefixes in REASON_CLASSES:
        if text.startswith(prefixes):
            return name
    return "other"


def behind_after_s() -> float:
    """An agent is behind when its last sync is older than this: two polls, and never less than
    when an idle agent's unchanged heartbeat is written (half the down time) plus one poll."""
    poll = settings.TOPOWEB_AGENT_POLL_S
    return max(2 * poll, settings.TOPOWEB_AGENT_DOWN_AFTER_S / 2 + poll)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class OpsCollector(Collector):
    """The series of the module docstring, read from the database at each scrape."""

    def collect(self):
        started = time.monotonic()
        now = timezone.now()
        clusters = dict(Cluster.objects.values_list("id", "name"))
        yield from self._jobs(clusters, now)
        yield from self._gpus(clusters)
        yield from self._nodes(clusters, now)
        yield from self._cycles(now)
        yield from self._step_gaps(clusters, now)
        took = GaugeMetricFamily("topoweb_metrics_collect_seconds", "Time this scrape took to compute.")
        took.add_metric([], time.monotonic() - started)
        yield took

    def _jobs(self, clusters, now):
        by_status = _gauge("topoweb_jobs", "Jobs by status.", ["cluster", "status"])
        counts = Counter(
            {
                (c, s): n
                for c, s, n in Job.objects.values_list("cluster_id", "status")
                .annotate(n=Count("id"))
                .order_by()
                .values_list("cluster_id", "status", "n")
            }
        )
        for cid, name in clusters.items():
            for status in JobStatus.values:
                by_status.add_metric([name, status], counts[(cid, status)])
        yield by_status
        depth = _gauge(
            "topoweb_queue_jobs", "Waiting jobs (queued or preempted) by reason class.", ["cluster", "reason"]
        )
        oldest = _gauge(
            "topoweb_queue_wait_seconds_max",
            "Longest wait (since submission) of a waiting job, by reason class.",
            ["cluster", "reason"],
        )
        n: Counter = Counter()
        first: dict = {}
        waiting = (
            Job.objects.filter(status__in=WAITING_STATUSES)
            .annotate(head=Substr("pending_reason", 1, 40))
            .values("cluster_id", "head")
            .annotate(n=Count("id"), first=Min("submitted_at"))
            .order_by()
        )
        for row in waiting:
            key = (row["cluster_id"], reason_class(row["head"]))
            n[key] += row["n"]
            first[key] = min(first.get(key, row["first"]), row["first"])
        for cid, name in clusters.items():
            for reason in REASON_NAMES:
                depth.add_metric([name, reason], n[(cid, reason)])
                since = first.get((cid, reason))
                oldest.add_metric([name, reason], 0.0 if since is None else (now - since).total_seconds())
        yield depth
        yield oldest

    def _gpus(self, clusters):
        gpus = _gauge(
            "topoweb_gpus",
            "GPUs by state: placed (a live allocation), unavailable (its node down, draining or"
            " drained), unhealthy (reported by its agent), free (the rest).",
            ["cluster", "state"],
        )
        count: Counter = Counter()
        live = Allocation.objects.filter(gpu=OuterRef("pk"), live=True)
        rows = (
            Gpu.objects.annotate(placed=Exists(live))
            .values_list("node__cluster_id", "node__agent__state", "placed")
            .annotate(n=Count("id"))
            .order_by()
        )
        for cid, state, placed, k in rows:
            if placed:
                count[(cid, "placed")] += k
            elif state in (NodeState.DOWN, NodeState.DRAINING, NodeState.DRAINED):
                count[(cid, "unavailable")] += k
            else:
                count[(cid, "free")] += k
        # Reported unhealthy GPUs on nodes that are up, not placed: out of the free count.
        sick = NodeHealth.objects.filter(state=NodeState.UP).exclude(unhealthy_gpus=[])
        sick = {
            nid: (cid, bad)
            for nid, cid, bad in sick.values_list("node_id", "node__cluster_id", "unhealthy_gpus")
        }
        if sick:
            taken = set(
                Allocation.objects.filter(live=True, gpu__node_id__in=sick).values_list(
                    "gpu__node_id", "gpu__index"
                )
            )
            for nid, (cid, bad) in sick.items():
                indexes = {b.get("gpu") for b in bad if isinstance(b, dict)}
                k = sum(1 for i in indexes if i is not None and (nid, i) not in taken)
                count[(cid, "unhealthy")] += k
                count[(cid, "free")] -= k
        for cid, name in clusters.items():
            for state in GPU_STATES:
                gpus.add_metric([name, state], count[(cid, state)])
        yield gpus
        stray = _gauge(
            "topoweb_gpus_booked_without_rank",
            "Live allocations whose rank runs no process although its job no longer runs that"
            " generation (nothing will release them; manage.py reconcile lists them).",
            ["cluster"],
        )
        found = dict(
            booked_without_rank()
            .values_list("job__cluster_id")
            .annotate(n=Count("id"))
            .order_by()
            .values_list("job__cluster_id", "n")
        )
        for cid, name in clusters.items():
            stray.add_metric([name], found.get(cid, 0))
        yield stray

    def _nodes(self, clusters, now):
        nodes = _gauge(
            "topoweb_nodes",
            "Nodes by state (no_agent: a node no agent or Slurm ever reported).",
            ["cluster", "state"],
        )
        count: Counter = Counter()
        for cid, state, n in (
            Node.objects.values_list("cluster_id", "agent__state").annotate(n=Count("id")).order_by()
        ):
            count[(cid, state or "no_agent")] += n
        for cid, name in clusters.items():
            for state in (*NodeState.values, "no_agent"):
                nodes.add_metric([name, state], count[(cid, state)])
        yield nodes
        behind = _gauge(
            "topoweb_agents_behind",
            "Agents of nodes not yet down whose last sync is older than topoweb_agent_behind_after_seconds.",
            ["cluster"],
        )
        late = dict(
            NodeHealth.objects.exclude(state=NodeState.DOWN)
            .filter(last_seen__lt=now - timedelta(seconds=behind_after_s()))
            .values_list("node__cluster_id")
            .annotate(n=Count("id"))
            .order_by()
            .values_list("node__cluster_id", "n")
        )
        for cid, name in clusters.items():
            behind.add_metric([name], late.get(cid, 0))
        yield behind
        after = GaugeMetricFamily("topoweb_agent_behind_after_seconds", "When an agent counts as behind.")
        after.add_metric([], behind_after_s())
        yield after

    def _cycles(self, now):
        last = SchedulingCycle.objects.filter(cluster=OuterRef("pk")).order_by("-started_at", "-id")
        rows = Cluster.objects.annotate(
            ms=Subquery(last.values("duration_ms")[:1]), at=Subquery(last.values("started_at")[:1])
        ).values_list("name", "ms", "at")
        took = _gauge(
            "topoweb_scheduling_cycle_seconds",
            "Wall time of the cluster's last scheduling cycle.",
            ["cluster"],
        )
        age = _gauge(
            "topoweb_scheduling_cycle_age_seconds",
            "Time since the cluster's last scheduling cycle started.",
            ["cluster"],
        )
        for name, ms, at in rows:
            if ms is not None:
                took.add_metric([name], ms / 1000.0)
                age.add_metric([name], (now - at).total_seconds())
        yield took
        yield age

    def _step_gaps(self, clusters, now):
        latest = JobSample.objects.filter(
            job=OuterRef("pk"), at__gte=now - SAMPLE_FRESH, step_ms__gt=0, predicted_step_ms__gt=0
        ).order_by("-at")
        rows = (
            Job.objects.filter(status=JobStatus.RUNNING)
            .annotate(
                m=Subquery(latest.values("step_ms")[:1]), p=Subquery(latest.values("predicted_step_ms")[:1])
            )
            .filter(m__isnull=False)
            .values_list("id", "cluster_id", "m", "p")
        )
        ratios = [(jid, cid, m / p) for jid, cid, m, p in rows]
        measured = _gauge(
            "topoweb_jobs_step_measured", "Running jobs with a fresh measured step time.", ["cluster"]
        )
        worst = _gauge(
            "topoweb_step_time_ratio_max",
            "Largest measured / predicted step time among the cluster's running jobs (1: as predicted).",
            ["cluster"],
        )
        top = _gauge(
            "topoweb_job_step_time_ratio",
            f"Measured / predicted step time of the {TOP_GAPS} running jobs furthest from their prediction.",
            ["cluster", "job"],
        )
        per: defaultdict = defaultdict(list)
        for _, cid, r in ratios:
            per[cid].append(r)
        for cid, name in clusters.items():
            measured.add_metric([name], len(per[cid]))
            if per[cid]:
                worst.add_metric([name], max(per[cid]))
        for jid, cid, r in sorted(ratios, key=lambda x: -abs(x[2] - 1.0))[:TOP_GAPS]:
            top.add_metric([clusters.get(cid, ""), str(jid)], r)
        yield measured
        yield worst
        yield top


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(OpsCollector())


def allowed(request) -> bool:
    """A bearer token equal to TOPOWEB_METRICS_TOKEN when one is set; else a client address in
    TOPOWEB_METRICS_ALLOW."""
    token = settings.TOPOWEB_METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(addr in net for net in settings.TOPOWEB_METRICS_ALLOW)


@require_GET
def metrics_view(request):
    """`GET /metrics`: the Prometheus exposition; 401 without the token, 403 from an address not allowed."""
    if not allowed(request):
        status = 401 if settings.TOPOWEB_METRICS_TOKEN else 403
        response = HttpResponse("metrics: not allowed\n", status=status, content_type="text/plain")
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
