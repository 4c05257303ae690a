"""REST throughput and latency on Postgres + Redis + one Celery worker.

Creates a scratch Postgres database, migrates it, imports a generated leaf-spine cluster big
enough for every job, starts the web server as production runs it (granian, WSGI on threads) and
one Celery worker against it, then measures:
  - submissions per second through POST /api/v1/jobs/ (several client threads, keep-alive);
  - jobs placed per second and submit-to-placed latency p50/p99 (placed_at - submitted_at);
  - API latency p50/p99 of GET job list/detail at a fixed request rate, while submitting and alone.
Targets: >= 100 jobs/s placed, API p99 < 100 ms at 50 requests/s. A warm-up of --warmup jobs
with the GET load runs first and is left out of every figure. The database is dropped at the
end. Throttling is lifted for the run (a settings module layered over topoweb.settings). The
machine's 1-minute load average before and after is recorded: other work on it skews every figure.

    .venv/bin/python bench/api_throughput.py [--jobs 600] [--clients 6] [--rate 50] [--seconds 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import proc_cpu
import psycopg
import scratch_db
from figures import figure

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TARGET_PLACED_PER_S = 100.0
TARGET_API_P99_MS = 100.0
PLACED_WAIT_S = 300.0

SETUP = """\
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from apps.topology.services import cluster_import
spec = {{"version": 1, "name": "bench", "generate": {{"shape": "leaf-spine", "spines": 4, "leaves": {leaves},
        "nodes_per_leaf": 16, "gpus_per_node": 8, "gpu_model": "H100", "peak_tflops": 989,
        "nvlink_bw_GBps": 450, "nic_bw_GBps": 50, "nics_per_node": 8, "uplink_bw_GBps": 800}}}}
cluster_import(data=spec)
user = get_user_model().objects.create_user("bench")
print("TOKEN", Token.objects.create(user=user).key)
"""


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def placed_per_s(placed_at: list[float], t_submit: float) -> float:
    """Jobs placed per second from the burst's start to the last placement; ValueError when
    nothing was placed (there is no rate to give, and no last placement to measure to)."""
    if not placed_at:
        raise ValueError("nothing was placed")
    return len(placed_at) / max(max(placed_at) - t_submit, 1e-9)


def nothing_placed(submitted: int, jobs: int, failed: list[int], wait_s: float) -> str:
    """What to say when none of the burst's jobs was placed."""
    codes = f" (the rest answered {sorted(set(failed))})" if failed else ""
    return (
        f"api_throughput: NOTHING WAS PLACED: {submitted} of {jobs} submissions accepted{codes}, and none"
        f" of them placed within {wait_s:.0f} s; no throughput to report (see the worker log above)"
    )


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_spec(i: int, rng: random.Random) -> dict:
    """A small tensor-parallel job (1-8 GPUs) with an estimated runtime."""
    gpus = rng.choice([1, 1, 2, 4, 8])
    return {
        "version": 1,
        "name": f"bench-{i}",
        "cluster": "bench",
        "gpus": gpus,
        "parallelism": {"tp": gpus, "pp": 1, "dp": 1},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}] if gpus > 1 else [],
        "estimated_runtime_s": rng.choice([600, 3600, 86400]),
    }


class Api:
    """A keep-alive HTTP connection per thread to the server under test."""

    def __init__(self, port: int, token: str):
        self.port = port
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.local = threading.local()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes, float]:
        """(status, body, latency in ms) of one request."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = json.dumps(body).encode() if body is not None else None
        t0 = time.perf_counter()
        try:
            conn.request(method, path, body=data, headers=self.headers)
            resp = conn.getresponse()
            payload = resp.read()
        except (http.client.HTTPException, OSError):
            self.local.conn = None
            conn.close()
            raise
        return resp.status, payload, (time.perf_counter() - t0) * 1000.0


def cpu_parts(procs: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    """CPU seconds now of each part's processes: those of `procs` (part -> root pids, with their
    descendants), Postgres and Redis (every process of theirs on this machine) and this client."""
    parts = {name: proc_cpu.tree(pids) for name, pids in procs.items()}
    parts |= {"postgres": proc_cpu.named("postgres"), "redis": proc_cpu.named("redis-server")}
    parts["client"] = {os.getpid()}
    return {name: proc_cpu.snapshot(pids) for name, pids in parts.items()}


def cpu_ms_per(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]], n: int) -> dict:
    """CPU ms per one of `n` (jobs) of each part between two `cpu_parts`, and their total."""
    out = {
        name: round(proc_cpu.spent_s(before.get(name, {}), now) * 1000.0 / max(n, 1), 2)
        for name, now in after.items()
    }
    out["total"] = round(sum(out.values()), 2)
    return out


def submit_all(api: Api, n: int, clients: int, first: int = 0) -> tuple[float, list[float], list[int]]:
    """Submit n jobs (named from bench-`first` on) from `clients` threads; returns wall seconds,
    latencies (ms), failed codes."""
    rng = random.Random(7 + first)
    specs = [job_spec(first + i, rng) for i in range(n)]
    latencies: list[float] = []
    failed: list[int] = []
    lock = threading.Lock()
    it = iter(specs)

    def run() -> None:
        while True:
            with lock:
                spec = next(it, None)
            if spec is None:
                return
            code, _, ms = api.request("POST", "/api/v1/jobs/", spec)
            with lock:
                latencies.append(ms)
                if code != 201:
                    failed.append(code)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies, failed


def read_load(api: Api, rate: float, seconds: float, stop: threading.Event | None = None) -> list[float]:
    """Open-loop GETs at `rate` per second (job list and job detail, alternating) for `seconds`
    or until `stop`, sent by a pool of keep-alive clients; returns latencies in ms."""
    latencies: list[float] = []
    lock = threading.Lock()
    due: queue.Queue[str | None] = queue.Queue()

    def client() -> None:
        while (path := due.get()) is not None:
            try:
                code, _, ms = api.request("GET", path)
            except (http.client.HTTPException, OSError):
                continue
            if code == 200:
                with lock:
                    latencies.append(ms)

    pool = [threading.Thread(target=client, daemon=True) for _ in range(16)]
    for t in pool:
        t.start()
    start = time.perf_counter()
    k = 0
    while time.perf_counter() - start < seconds and not (stop and stop.is_set()):
        delay = start + k / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        due.put("/api/v1/jobs/?page_size=50" if k % 2 == 0 else f"/api/v1/jobs/{1 + (k // 2) % 50}/")
        k += 1
    for _ in pool:
        due.put(None)
    for t in pool:
        t.join(timeout=30)
    return latencies


def unit_of(name: str) -> str:
    """The unit of a result figure, from its dotted name."""
    if name.endswith(".n"):
        return "requests"
    if name.endswith("per_s"):
        return "1/s"
    if "_ms" in name:
        return "ms"
    return {"placed": "jobs", "cycles.count": "cycles", "cycles.placed": "jobs"}.get(name, "")


def print_figures(result: dict, prefix: str = "") -> None:
    """FIGURE lines of the result's numeric leaves, named by their dotted path as bench/ab.py
    names the leaves of the JSON printed by earlier versions."""
    for key, value in result.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            print_figures(value, name)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            figure(name, value, unit_of(name))


def wait_ready(port: int, timeout_s: float = 60) -> None:
    """Block until the web server answers /healthz (RuntimeError after `timeout_s` s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the web server on port {port} did not answer within {timeout_s} s")


def main() -> int:
    """Run the benchmark, print and save the JSON result; 0 on success."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=600, help="jobs to submit")
    ap.add_argument("--clients", type=int, default=6, help="concurrent submitting clients")
    ap.add_argument("--rate", type=float, default=50.0, help="GET requests per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the GET-only phase")
    ap.add_argument(
        "--warmup", type=int, default=50, help="jobs submitted, with the GET load, before measuring"
    )
    ap.add_argument("--web-workers", type=int, default=2, help="web server worker processes")
    ap.add_argument("--web-threads", type=int, default=4, help="threads per web worker process")
    ap.add_argument(
        "--access-log", help="write the web server's log with its access log (request time in ms) here"
    )
    scratch_db.add_arguments(ap, "api")
    ap.add_argument("--redis", default=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15"))
    ap.add_argument("--cache", default=os.environ.get("BENCH_CACHE", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "api_throughput.json"))
    args = ap.parse_args()
    with scratch_db.scratch_database(args) as url:
        return run(args, url)


def run(args, url: str) -> int:
    """One run against the scratch database at `url`."""
    load_before = os.getloadavg()[0]
    tmp = tempfile.TemporaryDirectory(prefix="topoweb-bench-")
    env = scratch_db.served_env(url, tmp.name, CELERY_BROKER_URL=args.redis, CACHE_URL=args.cache)
    procs: list[subprocess.Popen] = []
    logs = Path(tmp.name)
    try:
        subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
        # 128 GPUs per leaf, ~3.2 GPUs per job.
        leaves = max(2, -(-(args.jobs + args.warmup) * 4 // 128) + 1)
        out = subprocess.run(
            [PY, "manage.py", "shell", "-c", SETUP.format(leaves=leaves)],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        token = next(line.split()[1] for line in out.splitlines() if line.startswith("TOKEN"))
        subprocess.run(
            [PY, "-m", "celery", "-A", "topoweb", "purge", "-f"], cwd=REPO, env=env, capture_output=True
        )
        port = free_port()
        web = [str(Path(PY).parent / "granian"), "--interface", "wsgi", "--host", "127.0.0.1"]
        web += [
            "--port",
            str(port),
            "--workers",
            str(args.web_workers),
            "--blocking-threads",
            str(args.web_threads),
        ]
        web += ["--log-level", "info", "--access-log"] if args.access_log else ["--log-level", "warning"]
        web_log = Path(args.access_log) if args.access_log else logs / "web.log"
        procs.append(
            subprocess.Popen(
                [*web, "topoweb.wsgi:application"],
                cwd=REPO,
                env=env,
                stdout=open(web_log, "wb"),
                stderr=subprocess.STDOUT,
            )
        )
        worker = [PY, "-m", "celery", "-A", "topoweb", "worker", "--pool", "solo", "--loglevel", "WARNING"]
        procs.append(
            subprocess.Popen(
                worker, cwd=REPO, env=env, stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT
            )
        )
        wait_ready(port)
        api = Api(port, token)
        api.request("GET", "/api/v1/jobs/")
        pg = psycopg.connect(url, autocommit=True)

        def count_placed() -> int:
            return pg.execute("SELECT count(*) FROM scheduling_job WHERE placed_at IS NOT NULL").fetchone()[0]

        def wait_placed(n: int) -> None:
            deadline = time.monotonic() + PLACED_WAIT_S
            while count_placed() < n and time.monotonic() < deadline:
                time.sleep(0.1)

        # Warm-up, not measured: each web worker's first requests import the URLconf and views and
        # load the topology, as a long-running server did long ago.
        warm_stop = threading.Event()
        warm_reader = threading.Thread(target=read_load, args=(api, args.rate, 3600, warm_stop))
        warm_reader.start()
        _, _, warm_failed = submit_all(api, args.warmup, 2 * args.clients, first=args.jobs)
        wait_placed(args.warmup - len(warm_failed))
        warm_stop.set()
        warm_reader.join()
        last_warm_job = pg.execute("SELECT coalesce(max(id), 0) FROM scheduling_job").fetchone()[0]
        last_warm_cycle = pg.execute(
            "SELECT coalesce(max(id), 0) FROM scheduling_schedulingcycle"
        ).fetchone()[0]

        # Phase 1: submissions, with the GET load running alongside.
        stop = threading.Event()
        under_load: list[float] = []
        reader = threading.Thread(target=lambda: under_load.extend(read_load(api, args.rate, 3600, stop)))
        reader.start()
        roots = {"web": [procs[0].pid], "worker": [procs[1].pid]}
        cpu_before = cpu_parts(roots)
        t_submit = time.time()
        wall_s, post_ms, failed = submit_all(api, args.jobs, args.clients)
        wait_placed(args.warmup - len(warm_failed) + args.jobs - len(failed))
        cpu_after = cpu_parts(roots)
        stop.set()
        reader.join()
        rows = pg.execute(
            "SELECT extract(epoch FROM submitted_at), extract(epoch FROM placed_at) FROM scheduling_job"
            " WHERE placed_at IS NOT NULL AND id > %s",
            (last_warm_job,),
        ).fetchall()
        waits_ms = [(float(p) - float(s)) * 1000.0 for s, p in rows]
        if not rows:
            pg.close()
            for log in (web_log, logs / "worker.log"):
                print(f"--- tail of {log.name}", log.read_text()[-4000:], sep="\n", file=sys.stderr)
            print(nothing_placed(args.jobs - len(failed), args.jobs, failed, PLACED_WAIT_S), file=sys.stderr)
            return 1
        cycles = pg.execute(
            "SELECT count(*), avg(duration_ms), sum(placed) FROM scheduling_schedulingcycle WHERE id > %s",
            (last_warm_cycle,),
        ).fetchone()
        pg.close()

        # Phase 2: the same GET load with nothing else running.
        alone = read_load(api, args.rate, args.seconds)

        result = {
            "jobs": args.jobs,
            "warmup_jobs": args.warmup,
            "submitted_ok": args.jobs - len(failed),
            "failed_status_codes": sorted(set(failed)),
            "submit_per_s": round((args.jobs - len(failed)) / wall_s, 1),
            "submit_latency_ms": {
                "p50": round(percentile(post_ms, 50), 1),
                "p99": round(percentile(post_ms, 99), 1),
            },
            "placed": len(rows),
            "placed_per_s": round(placed_per_s([float(p) for _, p in rows], t_submit), 1),
            "submit_to_placed_ms": {
                "p50": round(percentile(waits_ms, 50), 1),
                "p99": round(percentile(waits_ms, 99), 1),
            },
            # Where the burst's CPU went (the GET load's included), ms per job submitted.
            "cpu_ms_per_job": cpu_ms_per(cpu_before, cpu_after, args.jobs - len(failed)),
            "cycles": {"count": cycles[0], "mean_ms": round(float(cycles[1] or 0), 1), "placed": cycles[2]},
            "get_rate_per_s": args.rate,
            "get_latency_during_submissions_ms": {
                "n": len(under_load),
                "p50": round(percentile(under_load, 50), 1),
                "p99": round(percentile(under_load, 99), 1),
            },
            "get_latency_alone_ms": {
                "n": len(alone),
                "p50": round(percentile(alone, 50), 1),
                "p99": round(percentile(alone, 99), 1),
            },
            "cpus": os.cpu_count(),
            "load_avg_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
            "web": {"server": "granian", "workers": args.web_workers, "threads": args.web_threads},
        }
        result["targets"] = {
            f"placed_per_s >= {TARGET_PLACED_PER_S:.0f}": result["placed_per_s"] >= TARGET_PLACED_PER_S,
            f"GET p99 alone < {TARGET_API_P99_MS:.0f} ms": result["get_latency_alone_ms"]["p99"]
            < TARGET_API_P99_MS,
            f"GET p99 during submissions < {TARGET_API_P99_MS:.0f} ms": result[
                "get_latency_during_submissions_ms"
            ]["p99"]
            < TARGET_API_P99_MS,
        }
        if failed:
            # The server's own account of the failures, before its log is deleted with the scratch dir.
            for log in (web_log, logs / "worker.log"):
                print(f"--- tail of {log.name}", log.read_text()[-4000:], sep="\n", file=sys.stderr)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print_figures(result)
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
