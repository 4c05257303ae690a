"""The fault matrix's harness: a /proc watcher of the ranks' processes, the scheduler's periodic
work run beside the server, the rank program, a CPU throttle for the agent, the real web server, and
the results file the figures come from (`bench/chaos_report.py` prints them).

The watcher is the processes' truth, not the database's: every `period_s` it reads the
environment of every live process whose OUT_DIR lies under the test's folder and records
- a GPU (TOPOWEB_NODE, a GPU of CUDA_VISIBLE_DEVICES) used by two jobs' processes at once, as
  GPU-seconds of double use;
- a rank (job, rank) running twice at once: two processes carrying it whose parents do not
  (two launches: two generations, two agents, a start repeated), in two samples in a row (a
  forked child whose parent just died is briefly parentless);
- a job alive in two generations at once;
and, per (job, rank), the most processes it had at once (a pids limit holds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(os.environ.get("TOPOWEB_CHAOS_RESULTS") or REPO / "tests" / "chaos" / ".results.jsonl")
SHIM_MARK = "apps/agent/shim.py"

# The ranks' program (system Python, standard library; ranks run as the tenants' accounts):
# writes its environment to $OUT_DIR/<job>-<generation>-<rank>.json, then does what $BEHAVIOUR
# says: "sleep" (SLEEP_S, then exit 0: healthy), "forkbomb" (forks without end, every process
# forking again; never exits on its own), "flood" (FLOOD_MB of NUL and invalid UTF-8 on stdout,
# then exit 0).
RANK = r"""
import json, os, sys, time
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "TOPOWEB_JOB_ID",
        "TOPOWEB_GENERATION", "TOPOWEB_NODE", "MASTER_PORT")
env = {k: os.environ.get(k) for k in keys}
env["uid"] = os.getuid()
env["pid"] = os.getpid()
tag = f"{env['TOPOWEB_JOB_ID']}-{env['TOPOWEB_GENERATION']}-{env['RANK']}"
out = os.environ["OUT_DIR"]
with open(os.path.join(out, tag + ".tmp"), "w") as fh:
    json.dump(env, fh)
os.replace(os.path.join(out, tag + ".tmp"), os.path.join(out, tag + ".json"))
mode = os.environ.get("BEHAVIOUR", "sleep")
if mode == "forkbomb":
    while True:
        try:
            os.fork()
        except OSError:
            time.sleep(0.05)
if mode == "flood":
    chunk = (b"\x00\xff\xfe bad \xc3\x28 utf8 \x00" * 64 + b"\n") * 64
    out = sys.stdout.buffer
    for _ in range(int(float(os.environ["FLOOD_MB"]) * 1024 * 1024 // len(chunk))):
        out.write(chunk)
    out.write(b"flood done\n")
    out.flush()
    sys.exit(0)
time.sleep(float(os.environ.get("SLEEP_S", "60")))
print("rank", env["RANK"], "done", flush=True)
"""


def rank_command() -> list[str]:
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return [python, "-c", RANK]


# -- the watcher -----------------------------------------------------------------------------------


@dataclass
class Proc:
    pid: int
    ppid: int
    job: int
    generation: int
    rank: int
    node: str
    gpus: tuple[str, ...]

    @property
    def launch(self) -> tuple[int, int, int]:
        return (self.job, self.generation, self.rank)


def rank_processes(marker: str) -> list[Proc]:
    """Live (not zombie) processes whose OUT_DIR is under `marker` and that carry a rank's env."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                raw = fh.read()
            if b"TOPOWEB_JOB_ID=" not in raw:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] == b"Z":
            continue
        env = dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)
        if not env.get("OUT_DIR", "").startswith(marker):
            continue
        try:
            found.append(
                Proc(
                    pid=int(entry.name),
                    ppid=int(fields[1]),
                    job=int(env["TOPOWEB_JOB_ID"]),
                    generation=int(env.get("TOPOWEB_GENERATION", "0")),
                    rank=int(env["RANK"]),
                    node=env.get("TOPOWEB_NODE", "?"),
                    gpus=tuple(g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g),
                )
            )
        except (KeyError, ValueError):
            continue
    return found


@dataclass
class Watch:
    """What the watcher saw (see the module's docstring)."""

    samples: int = 0
    gpu_double_s: float = 0.0
    gpu_double: list[str] = field(default_factory=list)
    rank_twice_s: float = 0.0
    ranks_twice: list[str] = field(default_factory=list)
    generation_overlaps: list[str] = field(default_factory=list)
    most_processes: dict[tuple[int, int], int] = field(default_factory=dict)
    # Every (job, generation, rank) seen alive, and when each job was last seen alive.
    launches: set[tuple[int, int, int]] = field(default_factory=set)
    last_seen: dict[int, float] = field(default_factory=dict)
    live: list[Proc] = field(default_factory=list)

    def findings(self) -> list[str]:
        return self.gpu_double[:5] + self.ranks_twice[:5] + self.generation_overlaps[:5]


class Watcher:
    def __init__(self, marker: Path, period_s: float = 0.2):
        self.marker = str(marker)
        self.period_s = period_s
        self.seen = Watch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-watcher")
        self._twice_before: set[tuple[int, int]] = set()

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.seen

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            procs = rank_processes(self.marker)
            now = time.monotonic()
            dt = min(now - last, 2.0)
            last = now
            self._sample(procs, dt, time.time())
            self._stop.wait(self.period_s)

    def _sample(self, procs: list[Proc], dt: float, wall: float) -> None:
        seen = self.seen
        seen.samples += 1
        seen.live = procs
        holders: dict[tuple[str, str], set[int]] = {}
        generations: dict[int, set[int]] = {}
        by_rank: dict[tuple[int, int], list[Proc]] = {}
        for p in procs:
            seen.launches.add(p.launch)
            seen.last_seen[p.job] = wall
            generations.setdefault(p.job, set()).add(p.generation)
            by_rank.setdefault((p.job, p.rank), []).append(p)
            for gpu in p.gpus:
                holders.setdefault((p.node, gpu), set()).add(p.job)
        for where, jobs in holders.items():
            if len(jobs) > 1:
                seen.gpu_double_s += dt
                seen.gpu_double.append(f"GPU {where} used by jobs {sorted(jobs)} at {wall:.1f}")
        for job, gens in generations.items():
            if len(gens) > 1:
                seen.generation_overlaps.append(
                    f"job {job} alive in generations {sorted(gens)} at {wall:.1f}"
                )
        twice = set()
        for key, group in by_rank.items():
            seen.most_processes[key] = max(seen.most_processes.get(key, 0), len(group))
            pids = {p.pid: p for p in group}
            roots = [p for p in group if p.ppid not in pids or pids[p.ppid].launch != p.launch]
            if len(roots) > 1:
                twice.add(key)
                if key in self._twice_before:
                    seen.rank_twice_s += dt
                    where = sorted((p.pid, p.node, p.generation) for p in roots)
                    seen.ranks_twice.append(f"job {key[0]} rank {key[1]} runs twice {where} at {wall:.1f}")
        self._twice_before = twice


# -- the scheduler's periodic work ------------------------------------------------------------------


class Checker:
    """What beat runs for agent clusters, in a thread of the test process: `reconcile_all` (silent
    nodes down, fenced nodes' ranks gone, jobs that never started) every `reconcile_s` and a
    scheduling cycle of every cluster every `schedule_s` (beat: 3 s and 10 s). The same task
    functions a Celery worker would run, without two more processes on a shared machine, and
    stopped for sure before the test database is flushed."""

    def __init__(self, reconcile_s: float = 1.0, schedule_s: float = 3.0):
        self.reconcile_s = reconcile_s
        self.schedule_s = schedule_s
        self.errors: list[str] = []
        self.runs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-checker")

    def start(self) -> Checker:
        self._thread.start()
        return self

    def _run(self) -> None:
        from django.db import connections

        from apps.scheduling.tasks import reconcile_all_task, schedule_all_clusters_task

        next_cycle = 0.0
        try:
            while not self._stop.is_set():
                try:
                    reconcile_all_task()
                    if time.monotonic() >= next_cycle:
                        schedule_all_clusters_task()
                        next_cycle = time.monotonic() + self.schedule_s
                    self.runs += 1
                except Exception as exc:  # noqa: BLE001 - a database outage is part of some faults
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    connections.close_all()
                self._stop.wait(self.reconcile_s)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# -- waits -----------------------------------------------------------------------------------------


def wait_until(
    check: Callable[[], object],
    timeout_s: float,
    what: str,
    period_s: float = 0.25,
    explain: Callable[[], str] | None = None,
):
    """`check()`'s first truthy value within `timeout_s`; fails the test naming `what` (and what
    `explain()` says about the state) otherwise."""
    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            state = f": {explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}{state}", pytrace=False)
        time.sleep(period_s)


# -- the agent's CPU throttle (to widen the window of a rank's start) -------------------------------


class Throttle:
    """A cgroup of the cpu controller (v1 `cpu`, else the unified hierarchy's cpu.max) limited to
    `percent` of one CPU. A process moved into it runs that slowly, and so do the children it
    starts meanwhile; `release()` moves every process back to the root and removes it."""

    def __init__(self, name: str, percent: float = 2.0):
        v1 = Path("/sys/fs/cgroup/cpu")
        if (v1 / "cpu.cfs_quota_us").exists():
            self.dir = v1 / name
            self.dir.mkdir(exist_ok=True)
            (self.dir / "cpu.cfs_period_us").write_text("100000")
            (self.dir / "cpu.cfs_quota_us").write_text(str(int(1000 * percent)))
            self.root = v1
        else:
            base = (
                Path("/sys/fs/cgroup/unified")
                if Path("/sys/fs/cgroup/unified").is_dir()
                else Path("/sys/fs/cgroup")
            )
            self.dir = base / name
            self.dir.mkdir(exist_ok=True)
            (self.dir / "cpu.max").write_text(f"{int(1000 * percent)} 100000")
            self.root = base

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        for _ in range(20):
            with suppress(OSError):
                pids = (self.dir / "cgroup.procs").read_text().split()
                if not pids:
                    break
                for pid in pids:
                    with suppress(OSError):
                        (self.root / "cgroup.procs").write_text(pid)
            time.sleep(0.05)
        with suppress(OSError):
            self.dir.rmdir()


def shim_pids() -> dict[str, int]:
    """Live shims by the spec file they were started with."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(SHIM_MARK.encode()) for a in argv) and len(argv) >= 2:
            spec = next((a.decode() for a in argv if a.endswith(b"spec.json")), "")
            if spec:
                found[spec] = int(entry.name)
    return found


# -- the real web server ----------------------------------------------------------------------------


class WebServer:
    """granian serving the test database as the production command does (WSGI on threads, two
    worker processes), with the settings under test in its environment; `restart()` stops it
    (SIGTERM, graceful) and starts it again on the same port."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.root / "web.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1"]
            + ["--port", str(self.port), "--workers", "2", "--blocking-threads", "16"]
            + ["--respawn-failed-workers", "--workers-kill-timeout", "5", "topoweb.wsgi:application"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_until(self.answers, 90, "the web server to answer /healthz", period_s=0.5)

    def answers(self) -> bool:
        import httpx

        with suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/healthz", timeout=3).status_code == 200
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


# -- results ----------------------------------------------------------------------------------------


def record_result(row: dict) -> None:
    """Append one run's figures to the results file (JSON lines)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
