"""Demo jobs for `manage.py load_demo`: a realistic mix on pod-256 and the seed's job on case-4-4.

`load_demo_jobs()` is idempotent: a cluster that already holds the demo jobs is left alone.
`demo_workload_refill()` keeps the demo busy: a demo job that finished is submitted again, so the
graph never empties however long the demo runs (`serve_embedded` calls it every few seconds).
"""

from __future__ import annotations

import logging
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import close_old_connections, transaction
from django.utils import timezone

from apps.placement.topology import read_spec_file
from apps.topology.models import Cluster, Node
from apps.topology.retry import retry_when_locked

from . import services
from .choices import FINISHED_STATUSES, JobStatus
from .models import Account, AccountLimit, AccountMembership, Allocation, Job, NodeHealth, Qos

log = logging.getLogger(__name__)

DEMO_USERS = ("alice", "bob")
POD = "pod-256"
SU = "su-h100"
CASE = "case-4-4"
CASE_JOB_FILE = "examples/case-4-4-job.yaml"

GB = 1e9
MB = 1e6


def _job(
    name, gpus, tp, pp, dp, *, ep=1, priority=0, compute_ms, flops, comm, runtime_s, policy=None, overlap=0.3
) -> dict:
    spec = {
        "version": 1,
        "name": name,
        "priority": priority,
        "gpus": gpus,
        "parallelism": {"tp": tp, "pp": pp, "dp": dp, "ep": ep},
        "model": {"flops_per_step": flops},
        "step": {"compute_ms": compute_ms, "overlap": overlap},
        "comm": comm,
        "estimated_runtime_s": runtime_s,
    }
    if policy:
        spec["policy"] = policy
    spec["command"] = dummy_command(runtime_s)
    return spec


# The demo's stand-in for a training script: prints a step line a second, exits 0 after argv[1] s.
DUMMY_TRAINER = """
import os, sys, time
total = float(sys.argv[1])
rank = os.environ.get("RANK", "?")
t0 = time.monotonic()
step = 0
while time.monotonic() - t0 < total:
    step += 1
    print(f"rank {rank} step {step} on GPU {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    time.sleep(1.0)
print(f"rank {rank} done after {step} steps", flush=True)
"""
DEMO_RUN_S = (60.0, 3600.0)  # a demo job's dummy processes run this long, scaled from its estimate


def dummy_command(runtime_s: float) -> list[str]:
    """The argv of the demo's dummy trainer: a minute for a job estimated at an hour or less, an
    hour for one estimated at three days (so a demo session sees jobs complete and others run)."""
    low, high = DEMO_RUN_S
    seconds = min(max(runtime_s / 72.0, low), high)
    return [sys.executable, "-c", DUMMY_TRAINER, f"{seconds:.0f}"]


def pod_jobs() -> list[tuple[str, dict]]:
    """(owner, job spec) of the pod-256 mix, in submission order."""
    return [
        (
            "alice",
            _job(
                "llm-dense-tp8-pp4-dp2",
                64,
                8,
                4,
                2,
                priority=10,
                compute_ms=10_000,
                flops=3.2e17,
                runtime_s=3 * 86400,
                comm=[
                    {"group": "tp", "collective": "allreduce", "bytes": 64 * MB, "count": 48},
                    {"group": "pp", "collective": "p2p", "bytes": 32 * MB, "count": 16},
                    {"group": "dp", "collective": "allreduce", "bytes": 1.6 * GB},
                ],
            ),
        ),
        (
            "bob",
            _job(
                "moe-ep8-alltoall",
                32,
                1,
                4,
                8,
                ep=8,
                priority=5,
                compute_ms=2_000,
                flops=4.0e16,
                runtime_s=86400,
                comm=[
                    {"group": "ep", "collective": "alltoall", "bytes": 128 * MB, "count": 24},
                    {"group": "pp", "collective": "p2p", "bytes": 32 * MB, "count": 8},
                    {"group": "dp", "collective": "allreduce", "bytes": 400 * MB},
                ],
            ),
        ),
        (
            "alice",
            _job(
                "bert-large-dp16",
                16,
                1,
                1,
                16,
                compute_ms=300,
                flops=1.2e15,
                runtime_s=6 * 3600,
                comm=[{"group": "dp", "collective": "allreduce", "bytes": 1.36 * GB}],
            ),
        ),
        (
            "bob",
            _job(
                "llm-tp8-dp2-naive",
                16,
                8,
                1,
                2,
                compute_ms=400,
                flops=2.4e15,
                runtime_s=12 * 3600,
                policy="naive",
                overlap=0.0,
                comm=[
                    # Megatron TP: 4 activation allreduces per layer, 40 layers.
                    {"group": "tp", "collective": "allreduce", "bytes": 64 * MB, "count": 160},
                    {"group": "dp", "collective": "allreduce", "bytes": 200 * MB},
                ],
            ),
        ),
        ("bob", _small("finetune-1gpu", 1, 3600)),
        ("bob", _small("finetune-2gpu", 2, 2 * 3600)),
        ("alice", _small("eval-4gpu", 4, 1800)),
        ("alice", _small("notebook-1gpu", 1, 8 * 3600)),
        (
            "alice",
            _job(
                "llm-wait-tp8-pp4-dp6",
                192,
                8,
                4,
                6,
                compute_ms=10_000,
                flops=9.6e17,
                runtime_s=5 * 86400,
                comm=[
                    {"group": "tp", "collective": "allreduce", "bytes": 64 * MB, "count": 48},
                    {"group": "pp", "collective": "p2p", "bytes": 32 * MB, "count": 16},
                    {"group": "dp", "collective": "allreduce", "bytes": 1.6 * GB},
                ],
            ),
        ),
    ]


def su_jobs() -> list[tuple[str, dict]]:
    """(owner, job spec) on the rail-optimized su-h100: DP rings that topo keeps on one rail's leaf."""
    return [
        (
            "alice",
            _job(
                "llm-rail-tp8-dp8",
                64,
                8,
                1,
                8,
                compute_ms=1_500,
                flops=2.9e16,
                runtime_s=2 * 86400,
                comm=[
                    {"group": "tp", "collective": "allreduce", "bytes": 64 * MB, "count": 96},
                    {"group": "dp", "collective": "allreduce", "bytes": 2.0 * GB},
                ],
            ),
        ),
        (
            "bob",
            _job(
                "moe-rail-ep8",
                32,
                1,
                1,
                32,
                ep=8,
                compute_ms=900,
                flops=1.1e16,
                runtime_s=86400,
                comm=[
                    {"group": "ep", "collective": "alltoall", "bytes": 96 * MB, "count": 16},
                    {"group": "dp", "collective": "allreduce", "bytes": 300 * MB},
                ],
            ),
        ),
    ]


def _small(name: str, gpus: int, runtime_s: int) -> dict:
    comm = [{"group": "dp", "collective": "allreduce", "bytes": 500 * MB}] if gpus > 1 else []
    return _job(name, gpus, 1, 1, gpus, compute_ms=400, flops=1.5e14 * gpus, runtime_s=runtime_s, comm=comm)


def _users() -> dict:
    users = {}
    model = get_user_model()
    for name in DEMO_USERS:
        user, created = model.objects.get_or_create(username=name, defaults={"email": f"{name}@example.org"})
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        users[name] = user
    return users


# Two teams with different fair-share weights; product may borrow research's idle GPUs on pod-256.
DEMO_ACCOUNTS = (
    ("research", 3, "alice", {POD: (None, 60000.0, False)}),
    ("product", 1, "bob", {POD: (64, 2000.0, True)}),
)


# QOS on pod-256 beside `normal`: `high` (a priority term, at most 128 running GPUs per user, a
# week per job) and `scavenger` (no GPUs of its own: it borrows idle ones and any other QOS's job
# preempts it). Both accounts may use all three; their jobs get normal unless they name another.
DEMO_QOS = (
    ("high", {"priority": 50, "max_running_gpus_per_user": 128, "max_wall_s": 7 * 86400.0}),
    (
        "scavenger",
        {"priority": -50, "max_running_gpus_per_account": 0, "may_borrow": True, "preemptible": True},
    ),
)
# alice works for both teams: research pays unless her job names "account": "product".
DEMO_SECOND_MEMBERSHIPS = (("alice", "product"),)
# Each team's coordinator (docs/accounts.md, "Coordinators"): holds, releases, requeues,
# re-prioritises and cancels the team's jobs and picks which of its QOS each member may use.
DEMO_COORDINATORS = (("alice", "research"), ("bob", "product"))


def _accounts(users: dict) -> None:
    """The demo accounts, their members and limits (running GPUs, GPU-hours a day, may borrow),
    and the QOS they may use on pod-256."""
    pod = Cluster.objects.filter(name=POD).first()
    qos = []
    if pod is not None:
        qos = [Qos.objects.get_or_create(cluster=pod, name="normal")[0]]
        for name, fields in DEMO_QOS:
            qos.append(Qos.objects.get_or_create(cluster=pod, name=name, defaults=fields)[0])
    for name, share, member, limits in DEMO_ACCOUNTS:
        account, _ = Account.objects.get_or_create(
            name=name, defaults={"share": share, "description": f"demo team {name}"}
        )
        account.qos.add(*qos)
        AccountMembership.objects.get_or_create(
            user=users[member], account=account, defaults={"is_default": True}
        )
        for cluster_name, (gpus, gpu_hours, borrow) in limits.items():
            cluster = Cluster.objects.filter(name=cluster_name).first()
            if cluster is not None:
                AccountLimit.objects.get_or_create(
                    account=account,
                    cluster=cluster,
                    defaults={
                        "max_running_gpus": gpus,
                        "gpu_hours_per_period": gpu_hours,
                        "may_borrow": borrow,
                    },
                )
    for member, name in DEMO_SECOND_MEMBERSHIPS:
        AccountMembership.objects.get_or_create(user=users[member], account=Account.objects.get(name=name))
    for member, name in DEMO_COORDINATORS:
        AccountMembership.objects.filter(user=users[member], account__name=name).update(is_coordinator=True)


def _submit_and_start(
    cluster: Cluster, jobs: list[tuple[str, dict]], users: dict, *, start_all: bool
) -> list[Job]:
    with transaction.atomic():
        submitted = [
            services.job_submit(user=users[owner], spec=spec, cluster=cluster) for owner, spec in jobs
        ]
    services.schedule_cluster(cluster=cluster)
    # Jobs with a command start when the node agents run their ranks (`serve_embedded` runs them).
    for job in Job.objects.filter(pk__in=[j.pk for j in submitted], status=JobStatus.PLACING):
        if start_all or not job.spec.get("command"):
            services.job_start(job=job)
    return submitted


def load_demo_jobs(*, start_all: bool = False) -> dict[str, int]:
    """Submit and place the demo jobs on pod-256, su-h100 and case-4-4 (the seed's job, placed
    naive) as users alice and bob, and record migration proposals; returns how many jobs each
    cluster got (0: already there). Jobs with a command start when their node agents run them;
    `start_all` starts every placed job at once, as their agents would (for callers without agents)."""
    users = _users()
    _accounts(users)
    loaded: dict[str, int] = {}
    for name, jobs in ((POD, pod_jobs()), (SU, su_jobs())):
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            continue
        if Job.objects.filter(cluster=cluster, name__in=[spec["name"] for _, spec in jobs]).exists():
            loaded[name] = 0
        else:
            loaded[name] = len(_submit_and_start(cluster, jobs, users, start_all=start_all))
            services.migrations_propose(cluster=cluster)
    case = Cluster.objects.filter(name=CASE).first()
    if case is not None:
        spec = case_job()
        if Job.objects.filter(cluster=case, name=spec["name"]).exists():
            loaded[CASE] = 0
        else:
            loaded[CASE] = len(_submit_and_start(case, [("alice", spec)], users, start_all=start_all))
    demo_maintenance()
    log.info("demo jobs loaded: %s", loaded)
    return loaded


MAINTENANCE_REASON = "demo: firmware update, back after the maintenance window"


def demo_maintenance() -> str | None:
    """Drain the last idle node of su-h100 for maintenance, once, so that the node states, the
    node list and the now page have something to show; returns its name (None: nothing done)."""
    from .nodes import node_drain

    cluster = Cluster.objects.filter(name=SU).first()
    if (
        cluster is None
        or NodeHealth.objects.filter(node__cluster=cluster, reason=MAINTENANCE_REASON).exists()
    ):
        return None
    busy = Allocation.objects.filter(live=True, gpu__node__cluster=cluster).values("gpu__node_id")
    node = Node.objects.filter(cluster=cluster).exclude(pk__in=busy).order_by("-position", "-id").first()
    if node is None:
        return None
    node_drain(node=node, reason=MAINTENANCE_REASON)
    return node.name


def case_job() -> dict:
    """The seed's job on case-4-4, placed as the seed did."""
    spec = read_spec_file(Path(settings.BASE_DIR) / CASE_JOB_FILE)
    # The seed's pattern: placed free-GPU-first, every DP group straddles the two nodes.
    spec["policy"] = "naive"
    # The seed's job runs its full estimate, so the demo keeps measuring (and flagging) it.
    spec["command"] = dummy_command(72.0 * spec.get("estimated_runtime_s", 3600))
    return spec


def demo_jobs() -> list[tuple[str, str, dict]]:
    """(cluster name, owner, job spec) of every demo job."""
    return [
        *((POD, owner, spec) for owner, spec in pod_jobs()),
        *((SU, owner, spec) for owner, spec in su_jobs()),
        (CASE, "alice", case_job()),
    ]


# A finished demo job stays on the pages as finished this long before its next copy is submitted.
REFILL_AFTER_S = 20.0


def demo_workload_refill(*, now: datetime | None = None, after_s: float = REFILL_AFTER_S) -> list[Job]:
    """Submit again every demo job whose latest copy on its cluster finished (completed, failed or
    cancelled) at least `after_s` seconds ago, as the same owner with the same spec; returns the
    jobs submitted. A cluster where the demo jobs were never loaded is left alone, and a copy that
    still waits or runs is never doubled."""
    now = now or timezone.now()
    users = _users()
    clusters = {c.name: c for c in Cluster.objects.filter(name__in=(POD, SU, CASE))}
    refill: list[tuple[Cluster, str, dict]] = []
    for cluster_name, owner, spec in demo_jobs():
        cluster = clusters.get(cluster_name)
        if cluster is None:
            continue
        latest = (
            Job.objects.filter(cluster=cluster, name=spec["name"])
            .order_by("-pk")
            .only("status", "finished_at")
            .first()
        )
        if latest is None or latest.status not in FINISHED_STATUSES:
            continue
        if latest.finished_at is not None and now - latest.finished_at < timedelta(seconds=after_s):
            continue
        refill.append((cluster, owner, spec))
    submitted: list[Job] = []
    for cluster, owner, spec in refill:
        # Each submission queues a scheduling cycle when it commits.
        with transaction.atomic():
            submitted.append(services.job_submit(user=users[owner], spec=spec, cluster=cluster))
    if submitted:
        log.info("demo workload: submitted %s again", ", ".join(j.name for j in submitted))
    return submitted


class DemoWorkload(threading.Thread):
    """Calls `demo_workload_refill()` every `interval_s` seconds until `stop()`."""

    def __init__(self, interval_s: float = 10.0):
        super().__init__(name="topoweb-demo-workload", daemon=True)
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            close_old_connections()
            try:
                retry_when_locked(demo_workload_refill, what="demo workload")
            except Exception:
                log.exception("demo workload refill failed")
            finally:
                close_old_connections()


def start_demo_workload(interval_s: float = 10.0) -> DemoWorkload:
    """Start the thread that keeps the demo's jobs coming; returns it."""
    workload = DemoWorkload(interval_s)
    workload.start()
    return workload
