"""One metrics collection pass over 2,048 simulated dcgm-exporter endpoints (16,384 GPUs) on
loopback, end to end on Postgres: fetch (concurrent httpx), parse (prometheus-client), store
(bulk upserts and inserts), per-job samples and hotspots. Target: a pass well inside the 15 s
collection interval on this 2-core machine.

The exporter runs as its own process (`manage.py fake_dcgm`, as exporters run on other hosts),
serving every node of a generated 2,048-node leaf-spine cluster with jobs placed on half of its
GPUs. After a warm-up pass, --passes passes run 15 s apart in simulated time; printed: the pass
time (median, max), the share of each stage, and the storage per day at a 15 s interval from the
table sizes Postgres reports (rows and bytes, indexes included): raw samples (kept an hour),
1-minute rollups (kept a day), latest values. The machine's load average is printed too: other
work on it skews every figure.

A/B in the same run (--path both, the default): the passes alternate, in alternating order,
between the path collection takes now (its own HTTP/1.1 client, the fast parser) and the path
before it (httpx, looking for sniffio at every request, and prometheus-client's parser); the
table is the current path's, and a last table compares the two.

    .venv/bin/python bench/metrics_scale.py [--nodes 2048] [--passes 3] [--path both|now|before]
        [--postgres URL] [--db-name N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import scratch_db
from figures import figure

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
INTERVAL_S = 15.0
CLUSTER = "bench-metrics"
TABLES = ("metrics_gpusample", "metrics_gpurollup", "metrics_gpulatest")


def cluster_spec(nodes: int) -> dict:
    per_leaf = 32
    return {
        "version": 1,
        "name": CLUSTER,
        "generate": {
            "shape": "leaf-spine",
            "spines": 8,
            "leaves": max(nodes // per_leaf, 1),
            "nodes_per_leaf": min(per_leaf, nodes),
            "gpus_per_node": 8,
            "gpu_model": "H100",
            "peak_tflops": 989,
            "nvlink_bw_GBps": 450,
            "nic_bw_GBps": 50,
            "nics_per_node": 8,
            "uplink_bw_GBps": 800,
        },
    }


def setup(nodes: int):
    """Migrate and create the benchmark cluster with jobs on half its GPUs; returns it."""
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, check=True)
    import logging

    import django

    django.setup()
    logging.getLogger("celery").setLevel(logging.WARNING)
    from django.contrib.auth import get_user_model

    from apps.scheduling import services
    from apps.scheduling.choices import JobStatus
    from apps.scheduling.models import Job
    from apps.topology.services import cluster_import

    cluster = cluster_import(data=cluster_spec(nodes))
    user = get_user_model().objects.create_user(username="bench-metrics")
    n_jobs = nodes // 16  # 64-GPU data-parallel jobs on half the GPUs
    for i in range(n_jobs):
        spec = {
            "version": 1,
            "name": f"dp64-{i}",
            "gpus": 64,
            "parallelism": {"tp": 8, "pp": 1, "dp": 8, "ep": 1},
            "model": {"flops_per_step": 1.2e16},
            "step": {"compute_ms": 400, "overlap": 0.2},
            "comm": [
                {"group": "tp", "collective": "allreduce", "bytes": 64e6, "count": 32},
                {"group": "dp", "collective": "allreduce", "bytes": 1.0e9},
            ],
        }
        services.job_submit(user=user, spec=spec, cluster=cluster)
    services.schedule_cluster(cluster=cluster)
    for job in Job.objects.filter(cluster=cluster, status=JobStatus.PLACING):
        services.job_start(job=job)
    return cluster


def start_exporter(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "fake_dcgm",
            "--cluster",
            CLUSTER,
            "--port",
            str(port),
            "--point-nodes",
            "--refresh-s",
            "3600",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith("Simulated dcgm-exporter"):
            return proc
    raise RuntimeError("the simulated exporter did not start")


def table_bytes(cursor, table: str) -> tuple[int, int]:
    cursor.execute(f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}")  # noqa: S608
    rows, size = cursor.fetchone()
    return int(rows), int(size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--port", type=int, default=8137)
    parser.add_argument("--path", choices=("both", "now", "before"), default="both")
    scratch_db.add_arguments(parser, "metrics")
    args = parser.parse_args()
    with scratch_db.scratch_database(args) as url:
        try:
            run(args, url)
        finally:
            if "django" in sys.modules:
                from django.db import connections

                connections.close_all()


def run(args, url: str) -> None:
    """Set up, measure and print, on the scratch database at `url`."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "topoweb.settings")
    os.environ.setdefault("SECRET_KEY", scratch_db.BENCH_SECRET_KEY)
    os.environ.pop("CELERY_BROKER_URL", None)
    os.chdir(REPO)
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    cluster = setup(args.nodes)
    print(f"setup: {args.nodes} nodes, {args.nodes * 8} GPUs, jobs placed ({time.perf_counter() - t:.1f} s)")

    from django.db import connection
    from django.utils import timezone

    from apps.metrics.models import JobSample
    from apps.metrics.services import metrics_collect, metrics_rollup, source_settings
    from apps.metrics.sources.dcgm import DcgmSource

    with connection.cursor() as cursor:  # TRUNCATE, not DELETE: table sizes without dead rows
        cursor.execute("TRUNCATE metrics_gpusample, metrics_gpurollup, metrics_gpulatest, metrics_nodescrape")
    exporter = start_exporter(args.port)
    try:
        start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
        warm = metrics_collect(cluster=cluster, now=start)
        print(f"warm-up pass: {warm.nodes_ok} nodes read, {warm.nodes_failed} failed")
        kinds = ("now", "before") if args.path == "both" else (args.path,)
        timeout_s = source_settings(cluster=cluster).timeout_s
        runs = {k: {"walls": [], "stages": [], "parse_cpu": [], "main_cpu": []} for k in kinds}
        at = 0
        for i in range(1, args.passes + 1):
            # Alternating order: neither parser always runs first after the other's pass.
            for kind in kinds if i % 2 else kinds[::-1]:
                at += 1
                if kind == "before":
                    sys.modules.pop("sniffio", None)  # httpcore searches the import path again
                    source = DcgmSource(timeout_s=timeout_s, parser="reference", client="httpx")
                else:
                    sys.modules.setdefault("sniffio", None)  # as apps/metrics/sources/dcgm.py sets it
                    source = DcgmSource(timeout_s=timeout_s)
                t, cpu = time.perf_counter(), time.process_time()
                r = metrics_collect(
                    cluster=cluster, source=source, now=start + timedelta(seconds=INTERVAL_S * at)
                )
                run_ = runs[kind]
                run_["walls"].append(time.perf_counter() - t)
                run_["main_cpu"].append(time.process_time() - cpu)
                run_["stages"].append(r.stage_ms)
                run_["parse_cpu"].append(r.parse_cpu_ms)
                assert r.nodes_failed == 0, f"{r.nodes_failed} nodes failed"
                print(
                    f"pass {i} ({kind}): {run_['walls'][-1]:.2f} s, fetch + parse"
                    f" {r.stage_ms['fetch_parse'] / 1e3:.2f} s, {r.readings} GPU readings,"
                    f" {r.jobs_measured} jobs measured"
                )
        walls, stages, parse_cpu, main_cpu = (
            runs[kinds[0]][k] for k in ("walls", "stages", "parse_cpu", "main_cpu")
        )
        rolled = metrics_rollup(now=start + timedelta(minutes=10))
        with connection.cursor() as cursor:
            sizes = {t: table_bytes(cursor, t) for t in TABLES}
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
    load_after = os.getloadavg()[0]

    gpus = args.nodes * 8
    total_ms = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    whole = sum(total_ms.values())
    print()
    print(f"| pass over {args.nodes} endpoints, {gpus} GPUs | measured | target |")
    print("|---|---|---|")
    print(
        f"| pass time, median / max of {args.passes} | {statistics.median(walls):.2f} / {max(walls):.2f} s"
        f" | < {INTERVAL_S:.0f} s |"
    )
    print(f"| pass time / interval | {statistics.median(walls) / INTERVAL_S:.2f} | < 1 |")
    for k, v in total_ms.items():
        print(f"| {k.replace('_', ' + ')} | {v / 1e3:.2f} s ({v / whole:.0%}) | |")
    parse_s = statistics.median(parse_cpu) / 1e3
    cpu_s = statistics.median(main_cpu) + parse_s
    print(
        f"| CPU time: parsers (in {os.cpu_count()} processes) + collector process | {parse_s:.2f} + "
        f"{statistics.median(main_cpu):.2f} s | |"
    )
    print(
        f"| CPU-bound pass on {os.cpu_count()} idle cores (CPU time / cores; Postgres and exporter excluded)"
        f" | {cpu_s / (os.cpu_count() or 1):.2f} s | < {INTERVAL_S:.0f} s |"
    )
    figure("pass_s.median", statistics.median(walls), "s")
    figure("pass_s.max", max(walls), "s")
    for k, v in total_ms.items():
        figure(f"stage_s.{k}", v / 1e3, "s")
    figure("cpu_s.parsers", parse_s, "s")
    figure("cpu_s.collector", statistics.median(main_cpu), "s")
    figure("cpu_bound_pass_s", cpu_s / (os.cpu_count() or 1), "s")
    raw_rows, raw_bytes = sizes["metrics_gpusample"]
    roll_rows, roll_bytes = sizes["metrics_gpurollup"]
    latest_rows, latest_bytes = sizes["metrics_gpulatest"]
    per_raw = raw_bytes / max(raw_rows, 1)
    per_roll = roll_bytes / max(roll_rows, 1)
    passes_per_day = 86400 / INTERVAL_S
    print()
    print(f"| storage at a {INTERVAL_S:.0f} s interval, {gpus} GPUs | rows per day | bytes per day | kept |")
    print("|---|---|---|---|")
    raw_day = gpus * passes_per_day
    print(
        f"| raw samples ({per_raw:.0f} B/row measured) | {raw_day:,.0f} | {raw_day * per_raw / 1e9:.1f} GB"
        f" | 1 h: {gpus * 3600 / INTERVAL_S * per_raw / 1e9:.2f} GB on disk |"
    )
    roll_day = gpus * 1440
    print(
        f"| 1-minute rollups ({per_roll:.0f} B/row, {rolled} rows measured) | {roll_day:,.0f} |"
        f" {roll_day * per_roll / 1e9:.2f} GB | 1 day: {roll_day * per_roll / 1e9:.2f} GB on disk |"
    )
    print(f"| latest values | {latest_rows:,} rows, updated in place | | {latest_bytes / 1e6:.1f} MB |")
    per_pass = JobSample.objects.filter(job__cluster=cluster, at__gte=start).count() // (args.passes + 1)
    print(f"| per-job samples | {per_pass} per pass x {passes_per_day:.0f} | | with the job |")
    if len(kinds) == 2:
        print()
        print(f"| A/B in this run, median of {args.passes} passes each | before | now | before / now |")
        print("|---|---|---|---|")
        rows = {
            "fetch + parse (wall)": [
                statistics.median(s["fetch_parse"] for s in runs[k]["stages"]) / 1e3 for k in kinds
            ],
            "parsers' CPU time": [statistics.median(runs[k]["parse_cpu"]) / 1e3 for k in kinds],
            "collector process CPU time (fetch, store, jobs)": [
                statistics.median(runs[k]["main_cpu"]) for k in kinds
            ],
            "pass time (wall)": [statistics.median(runs[k]["walls"]) for k in kinds],
        }
        for label, (now, before) in rows.items():
            print(f"| {label} | {before:.2f} s | {now:.2f} s | {before / now:.1f}x |")
        fp = rows["fetch + parse (wall)"]
        print(
            f"| fetch + parse / {INTERVAL_S:.0f} s interval | {fp[1] / INTERVAL_S:.2f} | {fp[0] / INTERVAL_S:.2f} | |"
        )
        figure("ab.fetch_parse_s.before", fp[1], "s")
        figure("ab.fetch_parse_s.now", fp[0], "s")
        figure("ab.parse_cpu_s.before", rows["parsers' CPU time"][1], "s")
        figure("ab.parse_cpu_s.now", rows["parsers' CPU time"][0], "s")
    print()
    print(f"load average (1 min) before / after: {load_before:.2f} / {load_after:.2f}")


if __name__ == "__main__":
    main()
