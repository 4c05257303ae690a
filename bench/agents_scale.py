"""2,048 simulated node agents against one web host: request rate, the web host's CPU share, and
the time from placement to every rank started.

Creates a scratch Postgres database (dropped at the end), imports a 2,048-node leaf-spine cluster
(16,384 GPUs), starts the web server (--server wsgi: granian as the users' web service runs it,
one thread per open long-poll; --server uvicorn: the ASGI application topoweb.asgi, each waiting
poll an idle future of its event loop; scheduling cycles run in it, as in the embedded default, so
a placement wakes its nodes' polls at once), and
runs 2,048 simulated agents in this process (asyncio + httpx): each long-polls
POST /api/v1/agents/sync/ with wait_s = --poll-s (its heartbeat), and reports every rank the
server hands it as started at once (no processes). For each interval of --poll-s (several in
one run, on the same server and agents: they switch, then spread their polls again), measured:
  - idle: sync requests per second and the web process's CPU share (its utime + stime over the
    window, from /proc) while every agent waits in its long-poll, and Postgres's beside it;
  - placement: --jobs jobs of --job-gpus GPUs submitted one after another; for each, the time
    from placed_at to started_at (every rank reported started), both server timestamps.
The server's TOPOWEB_AGENT_POLL_S is the longest interval, TOPOWEB_AGENT_DOWN_AFTER_S three times
it. --workers N runs N server processes (the polls spread over them; --redis carries the
wakeups between them as CACHE_URL, as in a deployment; CPU is summed over them). Goal: the web
host well under one core for a 2,048-node cluster. --agent-body full: each sync carries what a
real agent's does (GPU inventory, NIC counters, which the server stores, its instance and
host). This machine runs other work; the 1-minute load average before and after is recorded,
and the simulated agents share its cores.

    .venv/bin/python bench/agents_scale.py [--nodes 2048] [--poll-s 30 60] [--seconds 60] [--jobs 8]
        [--workers 2 --redis redis://127.0.0.1:6379/10] [--server wsgi|uvicorn]
        [--agent-body minimal|full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
import scratch_db
from proc_cpu import named, snapshot, spent_s, total_s

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
GPUS_PER_NODE = 8
NODES_PER_LEAF = 32

SETUP = """\
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from apps.topology.services import cluster_import
from apps.scheduling.node_models import new_node_key, node_key_hash
from apps.scheduling.models import NodeToken
spec = {{"version": 1, "name": "bench", "generate": {{"shape": "leaf-spine", "spines": 8, "leaves": {leaves},
        "nodes_per_leaf": {per_leaf}, "gpus_per_node": 8, "gpu_model": "H100", "peak_tflops": 989,
        "nvlink_bw_GBps": 450, "nic_bw_GBps": 50, "nics_per_node": 8, "uplink_bw_GBps": 3200}}}}
cluster = cluster_import(data=spec)
user = get_user_model().objects.create_user("bench", is_staff=True)
print("TOKEN", Token.objects.create(user=user).key)
nodes = list(cluster.nodes.order_by("position"))
keys = [new_node_key() for _ in nodes]
NodeToken.objects.bulk_create(
    NodeToken(node=n, key_hash=node_key_hash(k), prefix=k[:10]) for n, k in zip(nodes, keys)
)
print("NODES", ",".join(n.name for n in nodes))
print("KEYS", ",".join(keys))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Connection:
    """One keep-alive HTTP/1.1 connection (httpx's pool does not scale to thousands of open
    long-polls in one process; an agent has exactly one connection anyway)."""

    def __init__(self, host: str, port: int, headers: dict[str, str]):
        self.host, self.port = host, port
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> tuple[int, dict]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        try:
            self.writer.write(head.encode() + data)
            await self.writer.drain()
            status = int((await self.reader.readline()).split()[1])
            length, close = 0, False
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "connection" and value.strip().lower() == "close":
                    close = True
            payload = await self.reader.readexactly(length) if length else b"{}"
        except (OSError, IndexError, ValueError, asyncio.IncompleteReadError):
            self.close()
            raise
        if close:
            self.close()
        return status, json.loads(payload) if status == 200 else {}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def full_body(node: str, instance: str, started: float, *, sent: int) -> dict:
    """What a real agent's sync carries besides its ranks (apps/agent/runner.py `_body`): 8 GPUs,
    8 InfiniBand ports' byte counters (growing), its instance, host, address and isolation."""
    moved = sent * 1_000_003
    return {
        "addr": f"10.{hash(node) % 250}.0.1",
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{i:08x}-0000-0000-0000-{abs(hash(node)) % 10**12:012d}",
                "name": "NVIDIA H100 80GB HBM3",
            }
            for i in range(GPUS_PER_NODE)
        ],
        "stopping": [],
        "logs": [],
        "isolation": "cgroup2 devices pids memory",
        "instance": instance,
        "previous": "",
        "host": node,
        "started_at": started,
        "orphans": [],
        "nics": [
            {"device": f"mlx5_{i}", "port": "1", "tx_bytes": 10**12 + moved, "rx_bytes": 10**12 + 2 * moved}
            for i in range(GPUS_PER_NODE)
        ],
    }


class SimulatedAgents:
    """N agents in one event loop: long-poll, report handed-out ranks as started at once."""

    def __init__(
        self, url: str, keys: dict[str, str], nodes: list[str], poll_s: float, body: str = "minimal"
    ):
        # poll_s may be changed while running: each agent then waits a random part of the new
        # interval once, so the polls are spread over it again. body "full": each sync says what
        # the real agent's does besides (its GPUs, NIC counters, instance, host, isolation).
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.keys = keys
        self.nodes = nodes
        self.poll_s = poll_s
        self.requests = 0
        self.errors = 0
        self.stop = False
        self.full = body == "full"

    async def agent(self, node: str) -> None:
        poll_s = self.poll_s
        await asyncio.sleep(random.uniform(0, poll_s))
        conn = Connection(self.host, self.port, {"Authorization": f"Node {self.keys[node]}"})
        instance, started = f"{random.getrandbits(128):032x}", time.time()
        running: set[tuple[int, int, int]] = set()
        reports: list[dict] = []
        while not self.stop:
            if poll_s != self.poll_s:
                poll_s = self.poll_s
                await asyncio.sleep(random.uniform(0, poll_s))
            body = {
                "node": node,
                "version": "bench",
                "running": [list(k) for k in sorted(running)],
                "reports": reports,
                "wait_s": 0.0 if reports else poll_s,
            }
            if self.full:
                body.update(full_body(node, instance, started, sent=self.requests))
            try:
                status, answer = await asyncio.wait_for(conn.post("/api/v1/agents/sync/", body), poll_s + 120)
            except (OSError, IndexError, ValueError, asyncio.IncompleteReadError, TimeoutError):
                conn.close()
                self.errors += 1
                await asyncio.sleep(1.0)
                continue
            self.requests += 1
            if status != 200:
                self.errors += 1
                await asyncio.sleep(1.0)
                continue
            reports = []
            wanted = set()
            for entry in answer["work"]:
                for r in entry["ranks"]:
                    key = (entry["job"], entry["generation"], r["rank"])
                    wanted.add(key)
                    if key not in running:
                        reports.append(
                            {"job": key[0], "generation": key[1], "rank": key[2], "event": "started"}
                        )
            running = wanted
        conn.close()

    async def run(self) -> None:
        await asyncio.gather(*(self.agent(n) for n in self.nodes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument(
        "--poll-s",
        type=float,
        nargs="+",
        default=[60.0],
        help="long-poll waits (= heartbeat intervals) to measure one after another, each 0 < s <= 60",
    )
    ap.add_argument("--seconds", type=float, default=60.0, help="idle measuring window per interval")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument(
        "--server",
        choices=("wsgi", "uvicorn"),
        default="wsgi",
        help="granian serving topoweb.wsgi on threads, or uvicorn serving topoweb.asgi (the sync long-poll in its event loop)",
    )
    ap.add_argument("--workers", type=int, default=1, help="server processes (more than one needs --redis)")
    ap.add_argument("--redis", default="", help="Redis URL for the wakeups between web processes (CACHE_URL)")
    ap.add_argument("--job-gpus", type=int, default=256)
    ap.add_argument(
        "--agent-body",
        choices=("minimal", "full"),
        default="minimal",
        help="minimal: node, version, ranks (as measured since v0.3); full: also the GPUs, NIC"
        " counters, instance and host a real agent sends with every sync",
    )
    scratch_db.add_arguments(ap, "agents")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "agents_scale.json"))
    args = ap.parse_args()
    if not all(0 < p <= 60 for p in args.poll_s):
        ap.error("--poll-s: every interval must be between 0 and 60 seconds")
    if not 1 <= args.nodes <= 8192 or args.seconds <= 0 or not 1 <= args.jobs <= 100:
        ap.error("--nodes 1..8192, --seconds > 0, --jobs 1..100")
    if not 1 <= args.workers <= 8 or (args.workers > 1 and not args.redis.startswith("redis://")):
        ap.error("--workers 1..8; more than one needs --redis redis://host:port/db for the wakeups")
    with scratch_db.scratch_database(args) as url:
        return run(args, url)


def run(args, url: str) -> int:
    load_before = os.getloadavg()[0]
    tmp = tempfile.TemporaryDirectory(prefix="topoweb-bench-agents-")
    env = scratch_db.served_env(
        url,
        tmp.name,
        TOPOWEB_AGENT_POLL_S=str(max(args.poll_s)),
        TOPOWEB_AGENT_DOWN_AFTER_S=str(max(args.poll_s) * 3),
    )
    if args.server == "wsgi":
        # Thousands of threads wait in long-polls: they share a pool of connections. (uvicorn's
        # sync threads keep a connection each, as the agents service of docker-compose.yml does.)
        env["TOPOWEB_DB_POOL_MAX"] = "40"
    if args.redis:
        env["CACHE_URL"] = args.redis
    web = None
    worker_pids: list[int] = []
    try:
        subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
        t0 = time.perf_counter()
        leaves = -(-args.nodes // NODES_PER_LEAF)
        out = subprocess.run(
            [
                PY,
                "manage.py",
                "shell",
                "-c",
                SETUP.format(leaves=leaves, per_leaf=min(args.nodes, NODES_PER_LEAF)),
            ],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        lines = dict(line.split(" ", 1) for line in out.splitlines() if line[:1].isupper() and " " in line)
        token, nodes = lines["TOKEN"], lines["NODES"].split(",")
        keys = dict(zip(nodes, lines["KEYS"].split(","), strict=True))
        print(f"imported {len(nodes)} nodes in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        port = free_port()
        # Each process may be handed any share of the connections: room for all of them.
        threads = len(nodes) + 64
        web = subprocess.Popen(
            server_argv(args, port, threads),
            cwd=REPO,
            env=env,
            stdout=open(Path(tmp.name) / "web.log", "wb"),
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if web.poll() is not None:
                log = (Path(tmp.name) / "web.log").read_text()[-3000:]
                raise RuntimeError(f"the web server exited with code {web.returncode}:\n{log}")
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        for _ in range(300):
            worker_pids = [
                int(p)
                for p in subprocess.run(
                    ["pgrep", "-P", str(web.pid)], capture_output=True, text=True
                ).stdout.split()
            ]
            # uvicorn with one worker serves in its own process.
            if len(worker_pids) >= args.workers or (args.server == "uvicorn" and args.workers == 1):
                break
            time.sleep(0.1)
        result = asyncio.run(measure(args, url, token, keys, nodes, web.pid, worker_pids, env))
        if result["agent_errors"]:
            print("web server log (tail):", (Path(tmp.name) / "web.log").read_text()[-3000:], file=sys.stderr)
        result["server"] = args.server
        result["agent_body"] = args.agent_body
        result["load_average_1m"] = {"before": load_before, "after": os.getloadavg()[0]}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return 0
    finally:
        if web is not None:
            web.terminate()
            try:
                web.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # Thousands of open long-polls can outlast the server's graceful stop.
                web.kill()
                web.wait(timeout=30)
            # A killed master leaves its workers running, serving a dropped database.
            for pid in worker_pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        tmp.cleanup()


def server_argv(args, port: int, threads: int) -> list[str]:
    if args.server == "uvicorn":
        return [
            str(Path(PY).parent / "uvicorn"),
            "topoweb.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--timeout-keep-alive",
            "75",
            "--backlog",
            str(threads),
            "--lifespan",
            "off",
            "--no-access-log",
            "--log-level",
            "warning",
        ]
    return [
        str(Path(PY).parent / "granian"),
        "--interface",
        "wsgi",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(args.workers),
        "--blocking-threads",
        str(threads),
        "--backlog",
        str(threads),
        "--backpressure",
        str(threads),
        "--log-level",
        "warning",
        "topoweb.wsgi:application",
    ]


async def measure(args, url, token, keys, nodes, master_pid, worker_pids, env) -> dict:
    agents = SimulatedAgents(url, keys, nodes, args.poll_s[0], args.agent_body)
    task = asyncio.ensure_future(agents.run())
    pg = await psycopg.AsyncConnection.connect(env["DATABASE_URL"], autocommit=True)
    # Warm-up: every agent registered (then, per interval, one more poll period: polls spread).
    deadline = time.monotonic() + args.poll_s[0] * 4 + 120
    while time.monotonic() < deadline:
        cur = await pg.execute("SELECT count(*) FROM scheduling_nodeagent")
        if (await cur.fetchone())[0] >= len(nodes):
            break
        await asyncio.sleep(1.0)

    def cpu() -> float:
        return total_s([master_pid, *worker_pids])

    def db_cpu() -> dict[int, float]:
        # Every Postgres process of this machine (its backends and its own): the scratch
        # database's work, and whatever else this machine's Postgres does meanwhile.
        return snapshot(named("postgres"))

    intervals = []
    previous = 0.0
    for n, poll_s in enumerate(args.poll_s):
        agents.poll_s = poll_s
        # Polls already waiting end within the previous interval; then each agent waits a random
        # part of the new one before its first poll at it: after both, the polls are spread.
        await asyncio.sleep(previous + poll_s + 2)
        previous = poll_s
        e0 = agents.errors
        r0, c0, d0, t0 = agents.requests, cpu(), db_cpu(), time.monotonic()
        await asyncio.sleep(args.seconds)
        r1, c1, d1, t1 = agents.requests, cpu(), db_cpu(), time.monotonic()
        db_s = spent_s(d0, d1)
        idle = {
            "seconds": round(t1 - t0, 1),
            "sync_requests_per_s": round((r1 - r0) / (t1 - t0), 1),
            "expected_requests_per_s": round(len(nodes) / poll_s, 1),
            "web_cpu_share_of_one_core": round((c1 - c0) / (t1 - t0), 3),
            "web_cpu_ms_per_request": round(1000 * (c1 - c0) / max(r1 - r0, 1), 2),
            "postgres_cpu_share_of_one_core": round(db_s / (t1 - t0), 3),
            "postgres_cpu_ms_per_request": round(1000 * db_s / max(r1 - r0, 1), 2),
        }
        print(f"poll {poll_s:g} s, idle: {json.dumps(idle)}", file=sys.stderr, flush=True)
        try:
            placement = await place_jobs(args, url, token, agents, pg, cpu, prefix=f"bench-{n}")
        except (httpx.HTTPError, RuntimeError) as exc:
            placement = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"poll {poll_s:g} s, placement: {json.dumps(placement)}", file=sys.stderr, flush=True)
        intervals.append(
            {"poll_s": poll_s, "idle": idle, "placement": placement, "agent_errors": agents.errors - e0}
        )
    agents.stop = True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await pg.close()
    return {
        "nodes": len(nodes),
        "gpus": len(nodes) * GPUS_PER_NODE,
        "web_processes": args.workers,
        "intervals": intervals,
        "agent_errors": agents.errors,
    }


async def place_jobs(args, url, token, agents, pg, cpu, *, prefix: str) -> dict:
    """Submit jobs one after another; per job the time from placed_at to started_at."""

    # A new connection per submission: none is left idle between two of them.
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Token {token}"},
        timeout=60,
        limits=httpx.Limits(max_keepalive_connections=0),
    ) as api:
        latencies = []
        c2, t2, r2 = cpu(), time.monotonic(), agents.requests
        for i in range(args.jobs):
            spec = {
                "version": 1,
                "name": f"{prefix}-{i}",
                "cluster": "bench",
                "gpus": args.job_gpus,
                "parallelism": {"tp": 8, "pp": 1, "dp": args.job_gpus // 8},
                "step": {"compute_ms": 100},
                "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e9}],
                "command": ["true"],
            }
            created = await api.post("/api/v1/jobs/", json=spec)
            created.raise_for_status()
            job_id = created.json()["id"]
            for _ in range(1200):
                cur = await pg.execute(
                    "SELECT EXTRACT(EPOCH FROM started_at - placed_at) FROM scheduling_job WHERE id = %s"
                    " AND started_at IS NOT NULL",
                    (job_id,),
                )
                row = await cur.fetchone()
                if row is not None:
                    latencies.append(float(row[0]))
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"job {job_id} did not start")
        c3, t3, r3 = cpu(), time.monotonic(), agents.requests
    return {
        "jobs": args.jobs,
        "gpus_per_job": args.job_gpus,
        "nodes_per_job": args.job_gpus // GPUS_PER_NODE,
        "placed_to_all_started_s_p50": round(percentile(latencies, 0.5), 3),
        "placed_to_all_started_s_p99": round(percentile(latencies, 0.99), 3),
        "placed_to_all_started_s_max": round(max(latencies), 3),
        "web_cpu_share_of_one_core": round((c3 - c2) / (t3 - t2), 3),
        # Robust to the machine's load: the web process's CPU for each job, idle syncs included.
        "web_cpu_ms_per_job": round(1000 * (c3 - c2) / args.jobs, 1),
        "seconds": round(t3 - t2, 1),
        "sync_requests_per_s": round((r3 - r2) / (t3 - t2), 1),
    }


if __name__ == "__main__":
    sys.exit(main())
