"""Server time of every dashboard page on a 16,384-GPU cluster with a few hundred jobs.

Builds (or reuses, --db) the scratch SQLite database of bench/dashboard_render.py with its
16,384-GPU rail-optimized cluster (the `many` mix by default: several hundred jobs of 1 to 64
GPUs, the case where lists and legends are longest), then visits every page an operator opens,
in this process through Django's test client signed in as a superuser: the cluster graph, the
node list, the hot links, a leaf and a spine switch page, a node page, the path between two GPUs
of a job, the leaf matrix, the measured view, the Now, queue, usage and search pages, and the
pages of the largest and of a few other jobs. Each page is rendered --runs times after one
warm-up visit; the median server time, the HTML size and the ratio to the 500 ms target are
printed, with the 1-minute load average before and after (the machine may be running other work).

    .venv/bin/python bench/pages_scale.py [--runs 3] [--gpus 16384] [--mix many|train] [--db FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from dashboard_render import MIXES, USER, cluster_name, prepare  # noqa: E402
from figures import figure  # noqa: E402

TARGET_MS = 500.0


def pages(cluster_name_: str) -> list[tuple[str, str]]:
    """(label, path) of every page visited, read from the database."""
    from apps.scheduling.models import Allocation, Job
    from apps.topology.models import Cluster, Node, Switch

    cluster = Cluster.objects.get(name=cluster_name_)
    base = f"/clusters/{cluster.name}"
    leaf = Switch.objects.filter(cluster=cluster, tier="leaf").order_by("name").first()
    spine = Switch.objects.filter(cluster=cluster, tier="spine").order_by("name").first()
    node = Node.objects.filter(cluster=cluster).order_by("name").first()
    jobs = list(Job.objects.filter(cluster=cluster, status="running").order_by("-gpus", "pk"))
    out = [
        ("cluster graph", f"{base}/"),
        ("node list", f"{base}/nodes/"),
        ("hot links", f"{base}/links/"),
        ("leaf switch", f"{base}/switches/{leaf.name}/"),
        ("spine switch", f"{base}/switches/{spine.name}/"),
        ("node", f"{base}/nodes/{node.name}/"),
        ("leaf matrix", f"{base}/leaf-matrix/?leaf={leaf.name}"),
        ("graph version", f"{base}/version/"),
        ("measured", f"{base}/measured/"),
        ("now", "/now/"),
        ("queue", "/queue/"),
        ("usage", "/usage/"),
        ("search", f"/search/?q={node.name[:-2]}"),
    ]
    if jobs:
        big = jobs[0]
        gpus = list(
            Allocation.objects.filter(job=big, live=True)
            .order_by("rank")
            .values_list("gpu__node__name", "gpu__index")
        )
        (a_node, a_gpu), (b_node, b_gpu) = gpus[0], gpus[-1]
        out.append(("path (largest job)", f"{base}/path/?a={a_node}:{a_gpu}&b={b_node}:{b_gpu}"))
        out.append((f"job ({big.gpus} GPUs)", f"/jobs/{big.pk}/"))
        for job in jobs[len(jobs) // 2 :: max(1, len(jobs) // 3)][:3]:
            out.append((f"job ({job.gpus} GPUs)", f"/jobs/{job.pk}/"))
    return out


def measure(cluster: str, runs: int) -> list[dict]:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.get(username=USER))
    from apps.dashboard import selectors
    from apps.dashboard.views import cluster as cluster_views
    from apps.dashboard.views import job as job_views

    visits = pages(cluster)
    t0 = time.perf_counter()
    client.get(visits[0][1])
    print(f"the process's first visit (every job view built): {(time.perf_counter() - t0) * 1000:.0f} ms")
    results = []
    for label, path in visits:
        # First: the page caches dropped, as after any change of the cluster's jobs (views of the
        # jobs that did not change are kept, as they are then).
        for cache in (selectors._GRAPH_DATA, cluster_views._GRAPHS, job_views._WHAT_IF):
            cache.clear()
        t0 = time.perf_counter()
        response = client.get(path)
        first = (time.perf_counter() - t0) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{path}: HTTP {response.status_code}")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - t0) * 1000)
        size = len(response.content)
        results.append(
            {"page": label, "path": path, "first": first, "ms": statistics.median(times), "kB": size / 1024}
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=16384)
    parser.add_argument("--mix", choices=sorted(MIXES), default="many")
    parser.add_argument("--db", help="reuse this scratch SQLite file (built when missing)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cluster = cluster_name(args.gpus, args.mix, "rail")
    if args.measure:
        load = os.getloadavg()[0]
        results = measure(cluster, args.runs)
        after = os.getloadavg()[0]
        print(f"{cluster}: server time per page in ms (load {load:.1f} -> {after:.1f}); first = the page")
        print("caches dropped (as after a job started or ended), again = median of repeat visits")
        print(f"{'page':<24}{'first':>8}{'again':>8}{'kB':>8}{'first/target':>14}  path")
        for r in results:
            cells = f"{r['first']:>8.0f}{r['ms']:>8.0f}{r['kB']:>8.0f}{r['first'] / TARGET_MS:>14.2f}"
            print(f"{r['page']:<24}{cells}  {r['path']}")
        slow = [r for r in results if r["first"] >= TARGET_MS]
        worst = max(results, key=lambda r: r["first"])
        figure("pages.worst_first_ms", round(worst["first"]), "ms")
        figure("pages.worst_again_ms", round(max(r["ms"] for r in results)), "ms")
        print(
            f"worst: {worst['page']} {worst['first']:.0f} ms first; "
            + (
                f"{len(slow)} page(s) over {TARGET_MS:.0f} ms"
                if slow
                else f"every page under {TARGET_MS:.0f} ms"
            )
        )
        return 0
    env = prepare(args.db, str(args.gpus), args.mix, "rail")
    py = sys.executable
    run = [py, __file__, "--measure", "--runs", str(args.runs), "--gpus", str(args.gpus), "--mix", args.mix]
    return subprocess.run(run, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
