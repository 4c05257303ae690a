"""Scheduling cycles on a 16,384-GPU cluster on Postgres with 2,000 running and 1,000 queued
jobs: cycle p50 / p99 (goal under 1 s) and submit-to-placed under a submission burst.

Creates a scratch Postgres database (dropped at the end) and works in-process through the
services: imports a leaf-spine cluster of --nodes 8-GPU nodes, books --running jobs (1 to 16 GPUs)
and marks them running with agent-reported ranks, queues --queued jobs of 10,240 to 16,384 GPUs
that wait for the running ones (the head holds a reservation, the rest are walked every cycle),
then times --cycles scheduling cycles (the full service: lock, snapshot, plan, commit, audit).
Burst: --burst small jobs of a higher priority submitted by 4 threads while one thread plays the Celery worker
(a cycle whenever a request arrived since the last one started, as coalesced requests do);
submit-to-placed is placed_at - submitted_at of each burst job. Other work on this machine skews
every figure; the 1-minute load average before and after is recorded.

    .venv/bin/python bench/cycle_scale.py [--nodes 2048] [--running 2000] [--queued 1000] [--cycles 20]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import threading
import time
from pathlib import Path

import scratch_db

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def stage_figures(costs: list) -> dict:
    """p50 ms of each stage of the cycles (cycle.LAST_CYCLE after each), and how many of them read
    the occupancy whole (the others re-read only the jobs that changed)."""
    costs = [c for c in costs if c is not None]
    if not costs:
        return {}
    names = list(costs[0].stages_ms)
    return {
        "stage_ms_p50": {
            n: round(percentile([c.stages_ms.get(n, 0.0) for c in costs], 0.5), 1) for n in names
        },
        "read_whole": sum(c.read_whole for c in costs),
        "jobs_read_p50": percentile([c.jobs_read for c in costs], 0.5),
    }


def spec(name: str, gpus: int, priority: int = 0) -> dict:
    tp = 8 if gpus >= 8 else 1
    return {
        "version": 1,
        "name": name,
        "cluster": "bench",
        "priority": priority,
        "gpus": gpus,
        "parallelism": {"tp": tp, "pp": 1, "dp": gpus // tp},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e9}] if gpus // tp > 1 else [],
        "estimated_runtime_s": 3600,
        "command": ["python", "train.py"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--running", type=int, default=2000)
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--profile", type=int, default=0, help="print the N costliest calls of the timed cycles")
    scratch_db.add_arguments(ap, "cycle")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "cycle_scale.json"))
    args = ap.parse_args()

    load_before = os.getloadavg()[0]
    with scratch_db.in_process_django(args):
        result = run(args)
    result["load_average_1m"] = {"before": load_before, "after": os.getloadavg()[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


def run(args) -> dict:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connections, transaction
    from django.utils import timezone

    from apps.scheduling import cycle, services
    from apps.scheduling.choices import JobStatus, RankState
    from apps.scheduling.models import Allocation, Job, RankRun
    from apps.topology.models import Gpu
    from apps.topology.services import cluster_import

    call_command("migrate", verbosity=0)
    rng = random.Random(7)
    leaves = -(-args.nodes // 32)
    t0 = time.perf_counter()
    cluster = cluster_import(
        data={
            "version": 1,
            "name": "bench",
            "generate": {
                "shape": "leaf-spine",
                "spines": 16,
                "leaves": leaves,
                "nodes_per_leaf": min(32, args.nodes),
                "gpus_per_node": 8,
                "gpu_model": "H100",
                "peak_tflops": 989,
                "nvlink_bw_GBps": 450,
                "nic_bw_GBps": 50,
                "nics_per_node": 8,
                "uplink_bw_GBps": 3200,
            },
        }
    )
    import_s = time.perf_counter() - t0
    user = get_user_model().objects.create_user("bench")
    requests: list[float] = []
    requested = threading.Event()

    def record(cluster_id: int) -> None:
        requests.append(time.monotonic())
        requested.set()

    # Cycles run where this benchmark says (queue_cycle calls cycle.request_cycle on commit).
    cycle.request_cycle = record

    t0 = time.perf_counter()
    with transaction.atomic():
        for i in range(args.running):
            services.job_submit(
                user=user, spec=spec(f"run-{i}", rng.choice((1, 2, 4, 8, 8, 16))), cluster=cluster
            )
    services.schedule_cluster(cluster=cluster)
    now = timezone.now()
    Job.objects.filter(status=JobStatus.PLACING).update(status=JobStatus.RUNNING, started_at=now)
    node_of = dict(Gpu.objects.filter(node__cluster=cluster).values_list("pk", "node_id"))
    runs = [
        RankRun(
            job_id=job,
            generation=gen,
            rank=rank,
            node_id=node_of[gpu],
            state=RankState.STARTED,
            started_at=now,
        )
        for job, gen, rank, gpu in Allocation.objects.filter(live=True).values_list(
            "job_id", "generation", "rank", "gpu_id"
        )
    ]
    RankRun.objects.bulk_create(runs, batch_size=2000)
    with transaction.atomic():
        for i in range(args.queued):
            services.job_submit(
                user=user,
                spec=spec(f"wait-{i}", rng.choice((10240, 12288, 16384)) * args.nodes // 2048),
                cluster=cluster,
            )
    setup_s = time.perf_counter() - t0

    durations = []
    costs: list = []
    profile = cProfile.Profile() if args.profile else None
    for _ in range(args.cycles):
        t = time.perf_counter()
        if profile is not None:
            profile.enable()
        services.schedule_cluster(cluster=cluster)
        if profile is not None:
            profile.disable()
        durations.append(time.perf_counter() - t)
        costs.append(cycle.LAST_CYCLE.get(cluster.pk))
    if profile is not None:
        for key in ("cumulative", "tottime"):
            pstats.Stats(profile, stream=sys.stderr).sort_stats(key).print_stats(args.profile)
    counts = {s: Job.objects.filter(status=s).count() for s in ("running", "placing", "queued")}
    gpus_free = (
        Gpu.objects.filter(node__cluster=cluster).count() - Allocation.objects.filter(live=True).count()
    )

    # Burst: 4 submitting threads, one worker thread running coalesced cycles.
    stop = threading.Event()
    burst_ids: list[int] = []
    lock = threading.Lock()
    worker_cycles = []
    worker_costs: list = []

    def worker() -> None:
        try:
            while not stop.is_set() or requested.is_set():
                if not requested.wait(timeout=0.05):
                    continue
                requested.clear()
                t = time.perf_counter()
                cycle.schedule_cluster(cluster=cluster)
                worker_cycles.append(time.perf_counter() - t)
                worker_costs.append(cycle.LAST_CYCLE.get(cluster.pk))
        finally:
            connections.close_all()

    def submitter(k: int) -> None:
        try:
            for i in range(k, args.burst, 4):
                # Interactive jobs ahead of the waiting big ones (equal priority would queue behind them).
                body = spec(f"burst-{i}", rng.choice((1, 2, 4, 8)), priority=10)
                job = services.job_submit(user=user, spec=body, cluster=cluster)
                with lock:
                    burst_ids.append(job.pk)
        finally:
            connections.close_all()

    w = threading.Thread(target=worker)
    w.start()
    t = time.perf_counter()
    subs = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    for s in subs:
        s.start()
    for s in subs:
        s.join()
    submit_s = time.perf_counter() - t
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if not Job.objects.filter(pk__in=burst_ids, placed_at__isnull=True).exists():
            break
        time.sleep(0.05)
    stop.set()
    w.join()
    latencies = [
        (placed_at - submitted_at).total_seconds()
        for submitted_at, placed_at in Job.objects.filter(
            pk__in=burst_ids, placed_at__isnull=False
        ).values_list("submitted_at", "placed_at")
    ]
    return {
        "cluster": {"nodes": args.nodes, "gpus": args.nodes * 8, "import_s": round(import_s, 1)},
        "setup_s": round(setup_s, 1),
        "jobs": counts,
        "gpus_free": gpus_free,
        "cycle_s": {
            "cycles": len(durations),
            "p50": round(percentile(durations, 0.5), 3),
            "p99": round(percentile(durations, 0.99), 3),
            "max": round(max(durations), 3),
            **stage_figures(costs),
        },
        "burst": {
            "jobs": args.burst,
            "submitted_per_s": round(args.burst / submit_s, 1),
            "placed": len(latencies),
            "submit_to_placed_s_p50": round(percentile(latencies, 0.5), 3),
            "submit_to_placed_s_p99": round(percentile(latencies, 0.99), 3),
            "worker_cycles": len(worker_cycles),
            "worker_cycle_s_p50": round(percentile(worker_cycles, 0.5), 3),
            "worker_cycle": stage_figures(worker_costs),
        },
    }


if __name__ == "__main__":
    sys.exit(main())
