"""A long job history on Postgres: the search box, the queue page's history, the API's job list.

Creates a scratch Postgres database (dropped at the end), migrates it and fills the job table
with a history of `--jobs` finished jobs (default 1,000,000, and a small history of 10,000 for
the ratio), names like `llama-7b-sft-012345` from 40 project words, one finishing every 30 s up
to now. Times in milliseconds (median of `--runs`):

- for each search query, the job matches the search makes (`apps.dashboard.search._ranked`:
  exact, prefix, substring tiers, each bounded, newest first) against the one query it replaced
  (every substring match ranked by exact/prefix/name, then cut to 8), with the indexes of
  migration 0008 and without its trigram index (a role that may not create pg_trgm);
- the pages a staff user's browser or client asks again and again, in-process through Django's
  test client: the queue's history table (last week; the whole year) and the API's job list
  (newest first, finished ones, the last page), at 10,000 and at `--jobs` jobs;
- beside that history (8 released allocations per finished job), a 16,384-GPU cluster running
  300 jobs: its snapshot, a scheduling cycle and the cluster page's change signature.

    .venv/bin/python bench/history_scale.py [--jobs 1000000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import scratch_db
from figures import figure, slug

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORDS = (
    "llama gpt bert t5 mixtral moe vit clip whisper sdxl resnet yolo diffusion mamba rwkv opt bloom "
    "falcon gemma phi qwen mistral deepseek palm chinchilla gopher jurassic megatron nemo dlrm "
    "retinanet maskrcnn unet wav2vec hubert conformer ernie electra roberta deberta"
).split()
SMALL = 10_000
# Migration scheduling/0008's trigram index, dropped and rebuilt to measure the search where the
# database role may not create pg_trgm (the b-tree on UPPER(name) stays: it needs no extension).
TRIGRAM = ("job_name_upper_trgm", "USING gin (UPPER(name::text) gin_trgm_ops)")


def job_name(i: int) -> str:
    """The name `fill` gives its i-th job."""
    word = WORDS[(i * 7919) % len(WORDS)]
    return f"{word}-{('7b', '13b', '70b')[i % 3]}-{('pt', 'sft', 'rl')[(i // 3) % 3]}-{i:06d}"


# One letter, a common project word, the middle of one name, a name of none, a whole name.
QUERIES = ("l", "llama", job_name(417).split("-", 1)[1], "no-such-job", job_name(123))


def old_ranked(qs, field: str, query: str, limit: int) -> list:
    """The search's job query before the tiers: every substring match ranked, then cut."""
    from django.db.models import Case, IntegerField, Value, When

    rank = Case(
        When(**{f"{field}__iexact": query}, then=Value(0)),
        When(**{f"{field}__istartswith": query}, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    qs = qs.filter(**{f"{field}__icontains": query}).annotate(hit_rank=rank).order_by("hit_rank", field)
    return list(qs[:limit])


def fill(n: int, template_id: int) -> None:
    """n finished jobs copied from the template row, named from WORDS, each with 8 released
    allocations on the cluster's GPUs; then one job finishing every 30 s up to now."""
    from django.db import connection

    from apps.scheduling.models import Allocation, Job

    table, allocations = Job._meta.db_table, Allocation._meta.db_table
    skip = ("id", "name", "status", "predicted", "flows")
    cols = [f.column for f in Job._meta.concrete_fields if f.column not in skip]
    col_list = ", ".join(cols)
    words = "ARRAY[" + ", ".join(f"'{w}'" for w in WORDS) + "]"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(max(id), 0) FROM {table}")
        (before,) = cursor.fetchone()
        cursor.execute(
            f"INSERT INTO {table} (name, status, flows, {col_list}) "
            f"SELECT ({words})[1 + (i::bigint * 7919) %% {len(WORDS)}] || '-' || (ARRAY['7b', '13b', '70b'])[1 + i %% 3]"
            f" || '-' || (ARRAY['pt', 'sft', 'rl'])[1 + (i / 3) %% 3] || '-' || lpad(i::text, 6, '0'),"
            f" 'completed', '{{}}', {col_list} FROM {table}, generate_series(1, %s) AS i WHERE id = %s",
            [n, template_id],
        )
        cursor.execute("SELECT min(id), max(id) FROM topology_gpu")
        g0, g1 = cursor.fetchone()
        cursor.execute(
            f"INSERT INTO {allocations} (job_id, rank, gpu_id, node_name, gpu_index, nic_name, live,"
            " generation, created_at, released_at)"
            f" SELECT j.id, r, {g0} + ((j.id * 8 + r) %% {g1 - g0 + 1}), '', 0, '', false, 1, now(), now()"
            f" FROM {table} j, generate_series(0, 7) AS r WHERE j.id > %s AND j.status = 'completed'",
            [before],
        )
        # One job finishing every 30 s, the highest id last, submitted an hour before it finished.
        cursor.execute(
            f"UPDATE {table} SET finished_at = now() - make_interval(secs => ((SELECT max(id) FROM {table}) - id) * 30),"
            " submitted_at = now() - make_interval(secs => ((SELECT max(id) FROM {table}) - id) * 30 + 3600)"
            " WHERE status = 'completed'".replace("{table}", table)
        )
        # As autovacuum would leave it: no dead row versions from the update, statistics fresh.
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute(f"VACUUM ANALYZE {allocations}")


def measure_cycle(cluster, staff, runs: int) -> dict[str, float]:
    """The scheduler's reads of a cluster beside the history: its snapshot, a whole cycle (jobs
    running, none waiting that fits) and the cluster page's change signature."""
    from apps.dashboard.selectors import graph_signature
    from apps.scheduling import services
    from apps.scheduling.snapshot import cluster_snapshot

    steps = {
        "cluster snapshot": lambda: cluster_snapshot(cluster=cluster),
        "scheduling cycle": lambda: services.schedule_cluster(cluster=cluster),
        "cluster page signature": lambda: graph_signature(cluster=cluster, user=staff),
    }
    return {name: round(timed(fn, runs), 1) for name, fn in steps.items()}


def pages() -> dict[str, str]:
    """The repeated pages: name -> URL."""
    from datetime import timedelta

    from django.utils import timezone

    year_ago = (timezone.now() - timedelta(days=365)).strftime("%Y-%m-%dT%H:%M")
    return {
        "queue history, last 7 days (500 rows)": "/queue/?range=7d&fragment=1",
        "queue history, the whole year (500 rows)": f"/queue/?since={year_ago}&fragment=1",
        "API job list, newest first (50)": "/api/v1/jobs/",
        "API job list, ?status=completed": "/api/v1/jobs/?status=completed",
        "API job list, ?page=last": "/api/v1/jobs/?page=last",
    }


def measure_pages(staff, runs: int) -> dict[str, float]:
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(staff)
    out = {}
    for name, url in pages().items():
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        out[name] = round(timed(lambda url=url: client.get(url), runs), 1)
    return out


def timed(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def measure(runs: int) -> dict:
    from apps.dashboard.search import PER_KIND, _ranked
    from apps.scheduling.models import Job

    jobs = Job.objects.select_related("cluster", "owner")
    rows = {}
    for q in QUERIES:
        new = _ranked(jobs, "name", q, "-pk")
        old = old_ranked(jobs, "name", q, PER_KIND)
        rows[q] = {
            "hits": len(new),
            "tiers_ms": round(timed(lambda q=q: _ranked(jobs, "name", q, "-pk"), runs), 2),
            "ranked_ms": round(timed(lambda q=q: old_ranked(jobs, "name", q, PER_KIND), runs), 2),
            "same_first": bool(new) == bool(old) and (not new or new[0].name == old[0].name),
        }
    return rows


def run(args) -> dict:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from apps.scheduling import services
    from apps.scheduling.models import Job
    from apps.topology.services import cluster_import

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    staff = get_user_model().objects.create_superuser("ops", email="", password=None)
    # 16,384 GPUs, about 5,000 of them running 300 jobs: the cycle and the history share tables.
    cluster = cluster_import(
        data={
            "version": 1,
            "name": "bench",
            "generate": {
                "shape": "rail-optimized",
                "spines": 16,
                "leaves": 64,
                "nodes_per_leaf": 32,
                "gpus_per_node": 8,
                "gpu_model": "H100",
                "peak_tflops": 989,
                "nvlink_bw_GBps": 450,
                "nic_bw_GBps": 50,
                "nics_per_node": 8,
                "uplink_bw_GBps": 400,
            },
        }
    )
    for i in range(300):
        gpus = (8, 16, 64, 1)[i % 4]
        spec = {
            "version": 1,
            "name": f"running-{i}",
            "gpus": gpus,
            "parallelism": {"tp": min(8, gpus), "pp": 1, "dp": max(1, gpus // 8), "ep": 1},
            "step": {"compute_ms": 100},
            "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
        }
        services.job_submit(user=user, cluster=cluster, spec=spec)
    queued = -1
    while queued != (queued := Job.objects.filter(status="queued").count()):
        services.schedule_cluster(cluster=cluster)
        for job in Job.objects.filter(status="placing"):
            services.job_start(job=job)
    template = services.job_submit(
        user=user,
        cluster=cluster,
        spec={
            "version": 1,
            "name": "template",
            "gpus": 8,
            "parallelism": {"tp": 8, "pp": 1, "dp": 1, "ep": 1},
            "step": {"compute_ms": 100},
            "comm": [{"group": "tp", "collective": "allreduce", "bytes": 1e8}],
        },
    )
    result: dict = {"jobs": {}, "queries": list(QUERIES)}
    filled = 0
    for n in (SMALL, args.jobs):
        t0 = time.perf_counter()
        fill(n - filled, template.pk)
        filled = n
        fill_s = time.perf_counter() - t0
        with_index = measure(args.runs)
        page_ms = measure_pages(staff, args.runs)
        cycle_ms = measure_cycle(cluster, staff, args.runs)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX {TRIGRAM[0]}")
            cursor.execute(f"ANALYZE {Job._meta.db_table}")
        without_index = measure(args.runs)
        with connection.cursor() as cursor:
            t0 = time.perf_counter()
            cursor.execute(f"CREATE INDEX {TRIGRAM[0]} ON {Job._meta.db_table} {TRIGRAM[1]}")
            cursor.execute(f"ANALYZE {Job._meta.db_table}")
            index_s = time.perf_counter() - t0
        result["jobs"][n] = {
            "fill_s": round(fill_s, 1),
            "index_build_s": round(index_s, 1),
            "with_index": with_index,
            "without_trigram": without_index,
            "pages_ms": page_ms,
            "cycle_ms": cycle_ms,
        }
        print(
            f"{n:,} jobs (filled in {fill_s:.1f} s, trigram index built in {index_s:.1f} s); ms, median",
            flush=True,
        )
        print(
            f"  {'query':<26}{'hits':>5}{'tiers':>10}{'ranked':>10}{'tiers, no trgm':>16}{'ranked, no trgm':>17}"
        )
        for q in QUERIES:
            a, b = with_index[q], without_index[q]
            print(
                f"  {q:<26}{a['hits']:>5}{a['tiers_ms']:>10}{a['ranked_ms']:>10}{b['tiers_ms']:>16}{b['ranked_ms']:>17}",
                flush=True,
            )
    print(f"pages and cycle (ms, median): {SMALL:,} jobs, {args.jobs:,} jobs, ratio")
    for kind in ("pages_ms", "cycle_ms"):
        for name, a in result["jobs"][SMALL][kind].items():
            b = result["jobs"][args.jobs][kind][name]
            print(f"  {name:<44}{a:>9}{b:>9}{b / a:>7.1f}x")
    small, large = result["jobs"][SMALL]["with_index"], result["jobs"][args.jobs]["with_index"]
    worst_new = max(large[q]["tiers_ms"] for q in QUERIES)
    worst_old = max(large[q]["ranked_ms"] for q in QUERIES)
    print(
        f"worst query at {args.jobs:,} jobs: tiers {worst_new:.1f} ms, ranked {worst_old:.1f} ms "
        f"({worst_old / worst_new:.0f}x); tiers at {args.jobs:,} vs {SMALL:,} jobs: "
        f"{worst_new / max(small[q]['tiers_ms'] for q in QUERIES):.1f}x"
    )
    for n in (SMALL, args.jobs):
        for kind in ("pages_ms", "cycle_ms"):
            for name, ms in result["jobs"][n][kind].items():
                figure(f"{slug(name)}.jobs_{n}_ms", ms, "ms")
    figure("worst_query.tiers_ms", worst_new, "ms")
    figure("worst_query.ranked_ms", worst_old, "ms")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    scratch_db.add_arguments(ap, "history")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "history_scale.json"))
    args = ap.parse_args()
    if args.jobs <= SMALL:
        raise SystemExit(f"--jobs: more than {SMALL:,} (the small history it is compared with)")
    with scratch_db.in_process_django(args):
        result = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
