"""Helpers of the agent tests: agent processes on loopback, a program that records its
environment, and cleanup of every process started (waits: test_scheduling_postgres.wait_for)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The agent's log line when its lease ends and it stops its ranks (not merely the word, which a
# test's temporary directory in the same log may hold: "test_a_fenced_rank_...").
FENCED = "fenced: no contact with"
ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_IB_HCA",
    "TOPOWEB_JOB_ID",
    "TOPOWEB_GENERATION",
)
# Writes its environment (and uid) to $OUT_DIR/<generation>-<rank>.json, then does what
# $BEHAVIOUR says.
RECORD = f"""
import errno, json, os, signal, subprocess, sys, time
keys = {ENV_KEYS!r}
env = {{k: os.environ.get(k) for k in keys}}
env["uid"] = os.getuid()
env["pid"] = os.getpid()
out = os.environ["OUT_DIR"]
tag = f"{{env['TOPOWEB_GENERATION']}}-{{env['RANK']}}"
mode = os.environ.get("BEHAVIOUR", "exit")
rank = int(env["RANK"])
if mode == "devices":
    # Which GPU device stand-ins this rank may open: errno name per file.
    found = {{}}
    for name in sorted(os.listdir(os.environ["DEV_DIR"])):
        try:
            os.close(os.open(os.path.join(os.environ["DEV_DIR"], name), os.O_RDONLY))
            found[name] = "ok"
        except OSError as exc:
            found[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    env["devices"] = found
if mode == "spy":
    # Tries to read another rank's log and to signal another rank's process.
    try:
        open(os.environ["SPY_LOG"]).read()
        env["read_other_log"] = "ok"
    except OSError as exc:
        env["read_other_log"] = errno.errorcode.get(exc.errno, str(exc.errno))
    try:
        os.kill(int(os.environ["SPY_PID"]), signal.SIGTERM)
        env["signal_other"] = "ok"
    except OSError as exc:
        env["signal_other"] = errno.errorcode.get(exc.errno, str(exc.errno))
with open(os.path.join(out, tag + ".json.tmp"), "w") as fh:
    json.dump(env, fh)
os.replace(os.path.join(out, tag + ".json.tmp"), os.path.join(out, tag + ".json"))
if mode == "fail" and rank == int(os.environ["FAIL_RANK"]):
    # Fails mid-run: once every rank of its generation has started (written its record), so
    # that the others are running and must be stopped, whatever the machine's load (at most 120 s).
    gen, world = env["TOPOWEB_GENERATION"], int(env["WORLD_SIZE"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(
        os.path.exists(os.path.join(out, f"{{gen}}-{{r}}.json")) for r in range(world)
    ) < world:
        time.sleep(0.05)
    print("boom: rank", rank, "gives up", flush=True)
    sys.exit(3)
if mode == "stubborn":
    # Ignores SIGTERM for a while (a checkpoint that takes time), then exits.
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(float(os.environ["STUBBORN_S"])), sys.exit(0)))
if mode == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "fork":
    # Leaves two children behind: one in a new session ignoring SIGTERM, one plainly forked.
    child = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"],
        start_new_session=True,
    )
    pid = os.fork()
    if pid == 0:
        os.setsid()
        time.sleep(120)
        os._exit(0)
    # Atomically: the test reads every children file as soon as it sees it.
    with open(os.path.join(out, "tmp-children-" + tag), "w") as fh:
        fh.write(f"{{child.pid}} {{pid}}")
    os.replace(os.path.join(out, "tmp-children-" + tag), os.path.join(out, "children-" + tag))
if mode == "early" and rank == 0:
    # Done with its part at once; the other ranks go on.
    print("rank", rank, "done early", flush=True)
    sys.exit(0)
if mode in ("sleep", "fail", "stubborn", "deaf", "spy", "early"):
    time.sleep(float(os.environ.get("SLEEP_S", "60")))
print("rank", rank, "done", flush=True)
"""


def record_command() -> list[str]:
    """The argv of the recording program (the system Python where there is one: ranks running
    as other accounts may not reach this checkout's virtualenv)."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return [python, "-c", RECORD]


ROOT = os.geteuid() == 0


CGROUPS_MODE = os.environ.get("TOPOWEB_TEST_CGROUPS", "auto")


def cgroups_writable() -> bool:
    """Whether this process can create cgroups (root with a writable hierarchy), as CI does."""
    from apps.agent.cgroups import CgroupError, detect

    if not ROOT:
        return False
    try:
        found = detect(CGROUPS_MODE, "topoweb-probe")
    except CgroupError:
        return False
    if found is None:
        return False
    for parent in found.parents:
        parent.rmdir()
    return True


class Agents:
    """Agent processes (python -m apps.agent) for nodes of one cluster, all killed at close,
    with every rank they left (by cgroup, or by process group without cgroups).
    `token_for(node)` gives a node's agent token (written to a 0600 file per node).

    As root with cgroups (CI) each agent tracks its ranks by cgroup below a name unique to the
    test; `multi_user` runs ranks as their owners' accounts, otherwise in single-user mode."""

    def __init__(self, server: str, token_for: Callable[[str], str], tmp: Path):
        self.server = server
        self.tmp = tmp
        self.token_for = token_for
        self.procs: dict[str, subprocess.Popen] = {}
        self.cgroups = cgroups_writable()
        self.cgroup_name = f"topoweb-test-{os.getpid()}-{tmp.name}"

    def token_file(self, node: str) -> Path:
        """The node's token file (created with a new token on first use)."""
        path = self.tmp / f"token-{node}"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.token_for(node))
        return path

    def argv(
        self, node: str, poll_s: float = 1.0, *, multi_user: bool = False, extra=(), server: str = ""
    ) -> list[str]:
        """The agent's command line for `node`."""
        argv = [
            sys.executable,
            "-m",
            "apps.agent",
            "--server",
            server or self.server,
            "--node",
            node,
            "--token-file",
            str(self.token_file(node)),
            "--log-dir",
            str(self.tmp / f"logs-{node}"),
            "--state-dir",
            str(self.tmp / f"state-{node}"),
            "--lock-dir",
            str(self.tmp / "locks"),
            "--poll-s",
            str(poll_s),
            "--addr",
            "127.0.0.1",
            "--workdir-root",
            str(self.tmp),
        ]
        if self.cgroups:
            # TOPOWEB_TEST_CGROUPS=v1|v2 picks a hierarchy where the machine has both (default auto).
            argv += ["--cgroup-name", f"{self.cgroup_name}/{node}", "--cgroups", CGROUPS_MODE]
        else:
            argv += ["--no-cgroups"]
        if not multi_user:
            argv += ["--single-user"] + (["--allow-root"] if ROOT else [])
        return argv + list(extra)

    def start(
        self, node: str, poll_s: float = 1.0, *, multi_user: bool = False, extra=(), server: str = ""
    ) -> subprocess.Popen:
        """Start the agent of `node`."""
        log = (self.tmp / f"agent-{node}.out").open("ab")
        proc = subprocess.Popen(
            self.argv(node, poll_s, multi_user=multi_user, extra=extra, server=server),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[node] = proc
        return proc

    def kill(self, node: str) -> None:
        """SIGKILL the agent of `node` (its rank processes live on, as on a real crash)."""
        self.procs[node].kill()
        self.procs[node].wait(timeout=10)

    def terminate(self, node: str) -> int:
        """SIGTERM the agent of `node` and wait for it to exit; its exit code."""
        self.procs[node].terminate()
        return self.procs[node].wait(timeout=20)

    def cgroup_dirs(self) -> list[Path]:
        """The test's cgroup directories (one per hierarchy)."""
        base = Path("/sys/fs/cgroup")
        return [d for d in base.glob(f"*/{self.cgroup_name}")] + [d for d in base.glob(self.cgroup_name)]

    def lease_s(self, node: str) -> float | None:
        """The lease the agent of `node` took from its last answer (its lease.json), or None."""
        try:
            return float(json.loads((self.tmp / f"state-{node}" / "lease.json").read_text())["fence_after_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def explain(self) -> str:
        """What a failed wait should show: each rank cgroup (freezer state, its processes with
        their state and parent, from /proc), each rank record's files and each agent's last log
        lines."""
        lines = []
        for top in self.cgroup_dirs():
            for d in sorted(p for p in top.rglob("*") if p.is_dir()):
                state = d / "freezer.state"
                frozen = state.read_text().strip() if state.exists() else "-"
                try:
                    pids = (d / "cgroup.procs").read_text().split()
                except OSError:
                    pids = []
                procs = []
                for pid in pids:
                    try:
                        status = dict(
                            line.split(":\t", 1)
                            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                            if ":\t" in line
                        )
                        procs.append(
                            f"{pid} {status.get('Name')} {status.get('State')} ppid {status.get('PPid')}"
                        )
                    except OSError as exc:
                        procs.append(f"{pid} ({exc.strerror})")
                lines.append(f"cgroup {d.relative_to(top.parent)} [{frozen}]: {'; '.join(procs) or 'empty'}")
        for record in sorted(self.tmp.glob("state-*/job-*")):
            files = sorted(p.name for p in record.iterdir()) if record.is_dir() else []
            exit_file = record / "exit"
            lines.append(
                f"record {record.relative_to(self.tmp)}: {files}"
                + (f" exit {exit_file.read_text()}" if exit_file.exists() else "")
            )
        for node in self.procs:
            log = self.tmp / f"agent-{node}.out"
            if log.exists():
                lines += [
                    f"agent {node}: {line}" for line in log.read_text(errors="replace").splitlines()[-25:]
                ]
        return "\n".join(lines)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(timeout=15)
        kill_cgroups(self.cgroup_dirs())
        if self.procs:
            finish_live_requests()


def finish_live_requests() -> None:
    """Before the test database is flushed: long-polls of stopped agents may still wait in the
    live server. Woken, they answer at once, and every request is finished (at load 13 a sync
    still running deadlocked with the flush's TRUNCATE)."""
    wake_every_poll()
    wait_for_live_requests(timeout_s=60.0)


def wake_every_poll() -> None:
    """End every agent long-poll waiting in this process (the live server's threads)."""
    from apps.executors.agents import wakeups
    from apps.topology.models import Cluster

    for cluster in Cluster.objects.values_list("pk", flat=True):
        wakeups._bump(cluster, None)


def live_requests() -> list[threading.Thread]:
    """The live server's request threads still running in this process."""
    return [t for t in threading.enumerate() if t.name.endswith("(process_request_thread)")]


def wait_for_live_requests(timeout_s: float) -> None:
    """Wait until the live server has no request in flight; fail after `timeout_s` (many times
    the longest poll a test's agents make)."""
    deadline = time.monotonic() + timeout_s
    while live_requests():
        if time.monotonic() > deadline:
            raise AssertionError(f"live server requests still running after {timeout_s} s: {live_requests()}")
        time.sleep(0.02)


class TcpProxy:
    """A TCP proxy to `upstream` (host, port) on a free loopback port; `cut()` closes every
    connection and refuses new ones (a partition), `heal()` forwards again."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cutting = threading.Event()
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cutting.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open |= {client, server}
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.cutting.set()
        with self.lock:
            for sock in self.open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                except OSError:
                    pass
            self.open.clear()

    def heal(self) -> None:
        self.cutting.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _walk(root: Path, name: str | None = None) -> list[Path]:
    """Files called `name` under `root` (directories when `name` is None), deepest first; a
    directory removed meanwhile (its agent still cleaning up) is skipped, not an error."""
    found = []
    for top, dirs, files in os.walk(root):
        if name is None:
            found += [Path(top) / d for d in dirs]
        elif name in files:
            found.append(Path(top) / name)
    return sorted(found, key=lambda p: -len(p.parts))


def kill_cgroups(dirs: list[Path]) -> None:
    """SIGKILL every process in the cgroup trees `dirs` (thawing v1 freezers), then remove them."""
    for _ in range(50):
        pids = set()
        for d in dirs:
            for procs in _walk(d, "cgroup.procs"):
                try:
                    pids |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    pass
            for state in _walk(d, "freezer.state"):
                try:
                    state.write_text("THAWED")
                except OSError:
                    pass
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    for d in dirs:
        for sub in _walk(d):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            d.rmdir()
        except OSError:
            pass


def kill_groups(pids) -> None:
    """SIGKILL the process groups of rank processes left behind (ranks of a killed agent)."""
    for pid in pids:
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@dataclass
class GpuUse:
    """What a `gpu_use_watch` saw: (node, GPU) used by two jobs' live processes at once, the wall
    time each job's processes were last seen alive, jobs with live processes of two generations
    at once (`generation_violations`) and every generation seen alive per job."""

    violations: list[str] = field(default_factory=list)
    last_seen: dict[int, float] = field(default_factory=dict)
    samples: int = 0
    generation_violations: list[str] = field(default_factory=list)
    generations: dict[int, set[int]] = field(default_factory=dict)


def _live_rank_envs(marker: str) -> list[dict[str, str]]:
    """The environments of live (not zombie) processes whose OUT_DIR starts with `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                raw = fh.read()
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if state == b"Z" or b"TOPOWEB_JOB_ID=" not in raw:
            continue
        env = dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)
        if env.get("OUT_DIR", "").startswith(marker):
            found.append(env)
    return found


@contextmanager
def gpu_use_watch(marker: Path, period_s: float = 0.2) -> Iterator[GpuUse]:
    """While the block runs, a thread reads every process's /proc/PID/environ each `period_s`
    and records each (TOPOWEB_NODE, GPU in CUDA_VISIBLE_DEVICES) used by live processes of two
    jobs (TOPOWEB_JOB_ID) at once, and each job with live processes of two generations
    (TOPOWEB_GENERATION) at once: the processes' truth, not the database's."""
    use = GpuUse()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            holders: dict[tuple[str, str], set[str]] = {}
            alive: dict[int, set[int]] = {}
            now = time.time()
            for env in _live_rank_envs(str(marker)):
                job = env["TOPOWEB_JOB_ID"]
                use.last_seen[int(job)] = now
                alive.setdefault(int(job), set()).add(int(env.get("TOPOWEB_GENERATION", 0)))
                for gpu in env.get("CUDA_VISIBLE_DEVICES", "").split(","):
                    if gpu:
                        holders.setdefault((env.get("TOPOWEB_NODE", "?"), gpu), set()).add(job)
            for where, jobs in holders.items():
                if len(jobs) > 1:
                    use.violations.append(f"{where} used by jobs {sorted(jobs)} at {now:.1f}")
            for job, generations in alive.items():
                use.generations.setdefault(job, set()).update(generations)
                if len(generations) > 1:
                    use.generation_violations.append(
                        f"job {job} runs generations {sorted(generations)} at {now:.1f}"
                    )
            use.samples += 1
            stop.wait(period_s)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield use
    finally:
        stop.set()
        thread.join()


def recorded(out_dir: Path, generation: int) -> dict[int, dict]:
    """Rank -> recorded environment of one generation."""
    found = {}
    for path in out_dir.glob(f"{generation}-*.json"):
        env = json.loads(path.read_text())
        found[int(env["RANK"])] = env
    return found
