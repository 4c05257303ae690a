"""The agent's loop: sync with the server (heartbeat, reports, long-poll for work), start the
ranks it lacks, stop the ranks the server no longer lists, report starts and exits.

The agent authenticates with its node's own token (`Authorization: Node <key>`): the server
answers only for that node. Reports are keyed by (job, generation, rank, event) and resent until
a sync succeeds, so a retried report is harmless; at most MAX_REPORTS go in one sync. A report
the server refused (listed in the answer's `refused` with the reason) is logged and dropped, not
resent. Output travels as text whatever bytes the rank wrote: invalid UTF-8 and NUL become U+FFFD.
Each rank's stdout and stderr go to one file in `log_dir`, owned by the rank's account and
readable by it alone; its tail travels with the exit report (and, while it runs, every
`log_every_s`), and the whole file follows in chunks (see `logs.py`: capped at `log_max_bytes`
and rotated).

Each rank runs under a shim (`shim.py`, its parent) in its own cgroup (`cgroups.py`) as its
owner's Unix account. A rank has exited when its main process exited and its cgroup is empty;
processes left behind by a main process that exited are stopped like the rank. Every rank is
recorded in the state directory, so an agent that crashed or restarted re-adopts its live ranks
and learns the exits it missed.

Fencing. An agent whose syncs have not been answered for `fence_after_s` (its lease, counted
from when its last answered request left) stops its ranks: the server gives their GPUs to
others only after the node reported them gone or at the node's fence deadline. Every answer
carries `fence_after_s` and `fence_slack_s`, and the agent records them with the contact's wall
time in `lease.json`. An agent restarted with an old lease does not fence at once: it tries the
server first, and fences at max(contact + fence_after_s, min(start + fence_slack_s, contact +
fence_after_s + fence_slack_s)) unless a sync is answered before (which renews the lease). Why the
server never frees a GPU a live rank may use: let c be the contact's time; the server saw that
heartbeat at h >= c and its `last_seen` is > h - down_after_s / 2 (an unchanged heartbeat is
written at most that often). A running agent begins stopping at c + fence_after_s, a restarted
one at c + fence_after_s + fence_slack_s at the latest (both terms of the max are bounded so),
and SIGKILLs what is left a stop grace later; the server's fence deadline is last_seen +
down_after_s / 2 + fence_after_s + fence_slack_s + the longest stop grace + a margin (the watch
period, clock skew), which is later. This holds while an agent runs on the node (a stopped agent
fences nothing: run it under systemd with Restart=always) and while the node's clock does not
jump (the lease survives a restart in wall time).

The cgroup tree is the truth: a rank cgroup holding processes that no record of this server's
names is an orphan, stopped and reported, and no rank starts until none is left. The state
directory records the server it was made for (`identity.json`); until the first answer confirms
it nothing recorded is reported, and records of another server are disowned. One agent runs per
state directory and per node on a host (flock), and the server binds a node to one agent
instance at a time (a second one gets 409).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from . import VERSION
from .accounts import system_account_refusal, uid_min
from .cgroups import MEMORY_LIMIT, PIDS_LIMIT, Cgroups, RankCgroup, gpu_devices
from .env import DEFAULT_LOCALE, DEFAULT_PATH, RankPlan, clean_env, plan_env
from .gpus import gpu_inventory
from .logs import LogFile, safe_text
from .logs import read_tail as log_tail
from .nics import nic_counters

log = logging.getLogger("topoweb.agent")
# One line per poll would drown the agent's own log.
logging.getLogger("httpx").setLevel(logging.WARNING)

TAIL_BYTES = 4096
MAX_REPORTS = 256
# The reports of one sync stay under this many bytes of JSON (the server takes 4 MiB bodies),
# and its log chunks (at most MAX_LOG_CHUNKS, one per rank) under MAX_LOG_BYTES.
MAX_REPORT_BYTES = 2 * 1024 * 1024
MAX_LOG_CHUNKS = 64
MAX_LOG_BYTES = 1024 * 1024
FINAL_CHUNK_BYTES = 256 * 1024
# The long-poll wait, also the heartbeat: the server answers at once when the node's work changes,
# and bounds the wait by its own TOPOWEB_AGENT_POLL_S (60 s by default).
DEFAULT_POLL_S = 60.0
RETRY_S = (0.5, 1.0, 2.0, 5.0)
WATCH_S = 0.1
# How often a running rank's cgroup is read for a limit it ran into.
LIMIT_CHECK_S = 1.0
SHIM = Path(__file__).with_name("shim.py")
# A refused start: no such account, uid 0, a workdir outside the allowed roots.
REFUSED_EXIT = 126
LOST_EXIT = 255
# Processes and threads a rank may have at once (generous for data loaders; a fork bomb stops).
DEFAULT_PIDS_MAX = 16384
# The largest memory limit per rank, in MiB (4 TiB): --memory-max-mb and a job's memory_mb.
MAX_MEMORY_MB = 4_194_304
# How long a rank found only through its cgroup (no record) gets between SIGTERM and SIGKILL.
ORPHAN_GRACE_S = 30.0
# While ranks wait (for orphans to be stopped, for their GPUs), the agent syncs again at the next
# exit or stop to report, or after this long: the server answers such syncs at once.
WAITING_RECHECK_S = 1.0
# At most this many orphans (with at most ORPHAN_PIDS pids each) go in one sync.
MAX_ORPHANS = 64
ORPHAN_PIDS = 32
# A refused sync (another agent holds the node) is logged at most once per this many seconds.
REFUSED_LOG_S = 60.0
# A refused credential (revoked token): said once, then retried ever more slowly, up to this.
CREDENTIAL_RETRY_MAX_S = 300.0
# An agent that finds its state directory locked by another exits with this code (EX_TEMPFAIL).
LOCKED_EXIT = 75
RANK_CGROUP = re.compile(r"^job-([0-9]{1,10})-gen-([0-9]{1,10})-rank-([0-9]{1,10})$")
# Why a rank exited, as its exit report's `cause` says (the server's `ExitCause`): only EXITED,
# a limit and REFUSED are the rank's own doing; the others are the node's or TopoWeb's.
EXITED = "exited"
LOST = "lost"
FENCED = "fenced"
STOPPED = "stopped"
REFUSED = "refused"
CAUSES = (EXITED, LOST, FENCED, STOPPED, PIDS_LIMIT, MEMORY_LIMIT, REFUSED)
Key = tuple[int, int, int]


class RankStatus(enum.Enum):
    """A local rank: running, being stopped (SIGTERM sent), or exited (cgroup empty)."""

    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"


class StartRefused(Exception):
    """A rank this agent will not start, and why."""


class CredentialRefused(Exception):
    """The server refuses the agent's node token (HTTP 401 or 403: revoked, wrong or another
    node's); retrying every few seconds would only fill the log."""


class StateDirBusy(Exception):
    """Another agent holds this state directory (its lock file names its pid)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write `path` (0600, root's) so that a crash leaves the old content or the new, never a
    part: a temporary file written and fsynced, renamed over `path`, the directory fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@dataclass(frozen=True, slots=True)
class Account:
    """The Unix account a rank runs as; `groups` None keeps the agent's own identity."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] | None
    home: str


@dataclass(slots=True)
class LocalRank:
    """One rank this agent started or re-adopted."""

    key: Key
    plan: RankPlan
    log_path: Path
    stop_grace_s: float
    record: Path
    cgroup: RankCgroup | None = None
    shim_pid: int | None = None
    # Which process `shim_pid` named when the shim started (`process_start`): a pid alone may
    # name another process after a reboot or once reused.
    shim_start: str = ""
    proc: asyncio.subprocess.Process | None = None
    status: RankStatus = RankStatus.RUNNING
    exit_code: int | None = None
    tail_size: int = 0
    note: str = ""
    # Why it exited or is being stopped (CAUSES); "" until the agent knows one.
    cause: str = ""
    # Its shim is gone without an exit file while the rank's cgroup still holds processes.
    shim_lost: bool = False
    # Its shim is being started (`Agent._start` awaits it): a stop begun meanwhile (a fence) finds
    # no process yet, and must wait for it rather than take the rank for gone.
    starting: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def name(self) -> str:
        job, generation, rank = self.key
        return f"job-{job}-gen-{generation}-rank-{rank}"


def visible_gpus(plan: RankPlan) -> set[int]:
    """The GPUs a rank may use: its job's GPUs on this node (CUDA_VISIBLE_DEVICES, each rank sees
    them all and picks its own by LOCAL_RANK)."""
    return {int(g) for g in plan.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g}


def _ceiling(asked: Any, bound: int) -> int:
    """A job's per-rank limit under the operator's: the smaller of the two, either one when the
    other is none (0 or absent)."""
    asked = int(asked) if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else 0
    return min(asked, bound) if asked and bound else asked or bound


def _report_code(code: int | None) -> int:
    """An exit code as reports carry it: -255..255 (negative: killed by that signal)."""
    return LOST_EXIT if code is None else max(min(code, 255), -255)


def report_batch(outbox: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The oldest reports that fit one sync: at most MAX_REPORTS and MAX_REPORT_BYTES of JSON
    (always at least one), so no backlog makes a sync the server must refuse."""
    batch: list[dict[str, Any]] = []
    size = 0
    for report in outbox[:MAX_REPORTS]:
        size += len(json.dumps(report)) + 2
        if batch and size > MAX_REPORT_BYTES:
            break
        batch.append(report)
    return batch


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a rank's output as text, across a rotation ('' if its log is
    missing; see `safe_text`)."""
    return safe_text(log_tail(path, limit))


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields from the third (state) on, past the command in parentheses;
    OSError when the process is gone."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[-1].split()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        return _stat_fields(pid)[0] != b"Z"
    except OSError:
        return False


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT_ID = _boot_id()


def process_start(pid: int | None) -> str:
    """When process `pid` started, as "boot id:clock ticks since boot" ('' when it is gone or
    /proc cannot tell): with its pid, this names one process across reboots and pid reuse."""
    if not pid:
        return ""
    try:
        # Field 22, starttime.
        start = _stat_fields(pid)[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return f"{BOOT_ID}:{start}"


def running_shims() -> dict[str, int]:
    """This agent's user's live shims, by the spec file each runs (`python -I .../shim.py SPEC`,
    of this or an earlier install). A shim's child has the same command line until it execs the
    rank: of such a pair, the parent."""
    me = os.geteuid()
    found: dict[str, set[int]] = {}
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != me:
                continue
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            at = next((i for i, arg in enumerate(argv[:-2]) if arg.endswith(f"/{SHIM.name}")), None)
            if at is None:
                continue
            pid = int(entry.name)
            parents[pid] = int(_stat_fields(pid)[1])
        except (OSError, IndexError, ValueError):
            continue
        found.setdefault(os.path.realpath(argv[at + 1]), set()).add(pid)
    return {spec: min(pids, key=lambda p: parents[p] in pids) for spec, pids in found.items()}


def _group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _inside(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root).rstrip("/") or "/"
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return True
    return False


class Agent:
    """A node agent: `await agent.run()` until `stop()` (or SIGTERM via `main`).

    `cgroups` None runs without process tracking (a rank's forked or `setsid` children escape
    it); `single_user` runs every rank as the agent's own user (the embedded demo);
    `allow_root` lets ranks run as uid 0; `stop_ranks_on_exit` stops the ranks when the agent
    stops (otherwise they keep running and the next agent re-adopts them)."""

    def __init__(
        self,
        *,
        server: str,
        node: str,
        token: str,
        log_dir: str | Path,
        poll_s: float = DEFAULT_POLL_S,
        addr: str = "",
        log_every_s: float = 30.0,
        timeout_s: float = 10.0,
        state_dir: str | Path | None = None,
        cgroups: Cgroups | None = None,
        single_user: bool = False,
        allow_root: bool = False,
        stop_ranks_on_exit: bool = False,
        workdir_roots: tuple[str, ...] = (),
        dev_dir: str | Path = "/dev",
        sysfs_root: str | Path | None = None,
        fence_after_s: float | None = None,
        log_max_bytes: int = 0,
        min_uid: int | None = None,
        system_accounts: tuple[str, ...] = (),
        pids_max: int = DEFAULT_PIDS_MAX,
        lock_dir: str | Path | None = None,
        memory_max_mb: int = 0,
    ):
        self.server = server.rstrip("/")
        self.node = node
        self.token = token
        self.log_dir = Path(log_dir)
        self.poll_s = poll_s
        self.addr = addr
        self.log_every_s = log_every_s
        self.timeout_s = timeout_s
        self.state_dir = Path(state_dir) if state_dir is not None else self.log_dir / ".state"
        self.cgroups = cgroups
        self.single_user = single_user
        self.allow_root = allow_root
        self.stop_ranks_on_exit = stop_ranks_on_exit
        self.workdir_roots = tuple(workdir_roots)
        self.dev_dir = Path(dev_dir)
        # sysfs, for the NICs' byte counters sent in every sync (None: none sent).
        self.sysfs_root = None if sysfs_root is None else Path(sysfs_root)
        self.fence_after_s = fence_after_s
        # Ranks run as people's accounts: uid >= UID_MIN of login.defs, unless named a service account.
        self.min_uid = uid_min() if min_uid is None else int(min_uid)
        self.system_accounts = frozenset(system_accounts)
        # Processes and threads per rank (its cgroup's pids.max; 0: no limit), and memory per rank
        # in MiB (0: none): each the ceiling of what a job asks (`pids_max`, `memory_mb`).
        self.pids_max = int(pids_max)
        self.memory_max_mb = int(memory_max_mb)
        # Each rank's log file: shipped to the server in chunks, rotated past log_max_bytes (0: never).
        self.log_max_bytes = log_max_bytes
        self.logs: dict[Key, LogFile] = {}
        self._logs_at = 0.0
        self.ranks: dict[Key, LocalRank] = {}
        # Ranks without a record whose cgroup still held processes, being stopped.
        self.orphans: dict[Key, asyncio.Future] = {}
        # Ranks of the last answer's work not started: they wait for orphans or for their GPUs.
        self.waiting = 0
        self.outbox: dict[tuple[int, int, int, str], dict[str, Any]] = {}
        self.state = "unknown"
        self.syncs = 0
        self.refused = 0
        self.fenced = 0
        self._last_ok = time.monotonic()
        # How much later than the lease the server still lets a restarted agent fence (from its
        # answers; 0 until one said) and, after a restart, the monotonic time before which this
        # agent does not fence while it tries to reach the server (0: none).
        self.fence_slack_s = 0.0
        self._fence_not_before = 0.0
        self._stopping = threading.Event()
        # Set by terminate_ranks: no rank starts any more, one being started is stopped at once.
        self._terminating = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        # This agent process: the server binds the node's syncs to one instance at a time.
        self.instance = secrets.token_hex(16)
        self.host = socket.gethostname()[:255]
        self.started_at = time.time()
        # Who the state directory's records were made for ({"server", "cluster", "node",
        # "instance"}; None: no identity recorded, "unreadable": a corrupt one), and whether the
        # server answered as that one yet: until then nothing recorded is reported.
        self.identity: dict[str, Any] | str | None = None
        self.confirmed = False
        # Orphans of another server (or of an unknown one): stopped, never reported as ranks.
        self.foreign: dict[Key, str] = {}
        self._refused_logged: float | None = None
        # The host's lock for this node (`lock_dir/NODE.lock`, outside the state directory): one
        # agent per node per host, and the instance that held it last (its successor on this
        # host takes over at once, even when the state directory was lost).
        self.lock_dir = Path(lock_dir) if lock_dir is not None else None
        self.host_previous = ""
        self._lock_fds: list[int] = []

    # -- one agent per state directory ---------------------------------------------------------
    def lock_state_dir(self) -> None:
        """Hold exclusive locks for this agent's life: on the state directory, and on this node
        on this host (`lock_dir`, when given). StateDirBusy when another agent holds either: two
        agents on one state directory or one node's cgroup tree would each take the other's
        ranks for their own, or for orphans."""
        if self._lock_fds:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        locks = [(self.state_dir / "agent.lock", f"the state directory {self.state_dir}")]
        if self.lock_dir is not None:
            if "/" in self.node or self.node in ("", ".", ".."):
                raise StateDirBusy(f"node name {self.node!r} cannot name a lock file")
            self.lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            locks.append((self.lock_dir / f"{self.node}.lock", f"node {self.node} on this host"))
        try:
            for path, what in locks:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                self._lock_fds.append(fd)
                before = os.pread(fd, 128, 0).decode(errors="replace").split()
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = before[0] if before else "unknown"
                    raise StateDirBusy(
                        f"another agent (pid {holder}) holds {what} ({path}); one agent per node:"
                        " stop that one first"
                    ) from None
                if len(before) > 1 and path.parent == self.lock_dir:
                    self.host_previous = before[1]
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {self.instance}\n".encode(), 0)
                os.fsync(fd)
        except BaseException:
            for fd in self._lock_fds:
                os.close(fd)
            self._lock_fds.clear()
            raise

    # -- control -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish (thread-safe)."""
        self._stopping.set()
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def terminate_ranks(self) -> int:
        """SIGTERM every rank this agent runs, from any thread (for a host process that exits
        without waiting for the loop), and stop the loop; a rank whose start is under way now gets
        its SIGTERM as soon as its process exists, and none starts after. Returns how many were
        signalled here."""
        self._terminating = True
        self.stop()
        count = 0
        for local in list(self.ranks.values()):
            if local.status is not RankStatus.EXITED:
                self._signal(local, signal.SIGTERM)
                count += 1
        return count

    def isolation(self) -> str:
        """What isolation this agent gives its ranks, in a few words (logged, and sent to the
        server for the dashboard)."""
        who = (
            "single-user (every rank runs as the agent's user)"
            if self.single_user
            else "ranks as their owner"
        )
        track = self.cgroups.describe() if self.cgroups is not None else "no cgroups"
        return f"{who}; {track}"

    def _report(self, key: Key, event: str, **fields: Any) -> None:
        job, generation, rank = key
        self.outbox[(job, generation, rank, event)] = {
            "job": job,
            "generation": generation,
            "rank": rank,
            "event": event,
            **fields,
        }
        if self._wake is not None:
            self._wake.set()

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Re-adopt recorded ranks, then sync until stopped; on the way out send the last
        reports (and stop every rank first when `stop_ranks_on_exit`)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.lock_state_dir()
        log.info("node %s: %s (agent instance %s)", self.node, self.isolation(), self.instance[:8])
        self.identity = self._read_identity()
        self._adopt()
        self._last_ok = time.monotonic()
        self._load_lease()
        headers = {"Authorization": f"Node {self.token}", "User-Agent": f"topoweb-agent/{VERSION}"}
        # The long-poll may take poll_s on the server: the read timeout leaves room for it.
        timeout = httpx.Timeout(self.timeout_s, read=self.poll_s + self.timeout_s)
        fence = asyncio.ensure_future(self._fence_watch())
        try:
            async with httpx.AsyncClient(base_url=self.server, headers=headers, timeout=timeout) as client:
                failures = 0
                refusals = 0
                last_log = time.monotonic()
                while not self._stopping.is_set():
                    if time.monotonic() - last_log >= self.log_every_s:
                        self._ship_logs()
                        last_log = time.monotonic()
                    try:
                        await self._sync(client)
                        if self.waiting:
                            # Ranks wait for their GPUs or for orphans to be stopped: the server
                            # answers such a sync at once (this agent runs less than its work).
                            # Next sync when an exit or a stop is to be reported, else in a while.
                            await self._pause(WAITING_RECHECK_S)
                        if refusals:
                            log.warning("the server accepts this agent's credential again")
                        failures = refusals = 0
                    except CredentialRefused as exc:
                        if not refusals:
                            log.error(
                                "the server refuses this agent's node token (%s): it starts nothing and"
                                " retries ever more slowly (up to every %.0f s), silently until accepted",
                                exc,
                                CREDENTIAL_RETRY_MAX_S,
                            )
                        self.state = "refused"
                        delay = min(RETRY_S[-1] * 2**refusals, CREDENTIAL_RETRY_MAX_S)
                        refusals += 1
                        await self._pause(delay)
                    except (httpx.HTTPError, ValueError) as exc:
                        delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                        failures += 1
                        # Some errors (a dropped connection, a timeout) have no message: name their kind.
                        why = str(exc) or type(exc).__name__
                        # One dropped connection retried at once is no problem (a busy server may
                        # drop one); a second failure in a row is, and warns.
                        level = logging.INFO if failures == 1 else logging.WARNING
                        log.log(
                            level, "sync with %s failed (%s); retrying in %.1f s", self.server, why, delay
                        )
                        await self._pause(delay)
                await self._shutdown(client)
        finally:
            fence.cancel()
            await asyncio.gather(fence, return_exceptions=True)

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except TimeoutError:
            pass

    def _body(
        self, reports: list[dict[str, Any]], wait_s: float, chunks: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        return {
            "node": self.node,
            "version": VERSION,
            "addr": self.addr,
            "gpus": gpu_inventory(),
            # Ranks being stopped apart: the server need not answer at once to have them stopped.
            "running": [list(k) for k, r in self.ranks.items() if r.status is RankStatus.RUNNING],
            "stopping": [list(k) for k, r in self.ranks.items() if r.status is RankStatus.STOPPING],
            "reports": reports,
            "logs": chunks or [],
            "isolation": self.isolation()[:200],
            "wait_s": wait_s,
            "instance": self.instance,
            "previous": self._previous(),
            "host": self.host,
            "started_at": self.started_at,
            "orphans": self._orphan_list(),
            "nics": [] if self.sysfs_root is None else nic_counters(self.sysfs_root),
        }

    async def _sync(self, client: httpx.AsyncClient) -> None:
        self._check_fence()
        if self.confirmed:
            self._scan_tree()
        # Until the server's first answer says this state directory is its own, nothing recorded
        # is reported (the records may be another server's) and that answer comes at once.
        reports = report_batch(list(self.outbox.values())) if self.confirmed else []
        chunks = self._log_chunks() if self.confirmed else []
        body = self._body(reports, 0.0 if reports or chunks or not self.confirmed else self.poll_s, chunks)
        self._wake.clear()
        sent = time.monotonic()
        request = asyncio.ensure_future(client.post("/api/v1/agents/sync/", json=body))
        woken = asyncio.ensure_future(self._wake.wait())
        done, _ = await asyncio.wait({request, woken}, return_when=asyncio.FIRST_COMPLETED)
        if request not in done:
            # Something to report (an exit, a stop): do not sit out the long-poll.
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            return
        woken.cancel()
        response = request.result()
        if response.status_code == 409:
            await self._refused_sync(response)
            return
        if response.status_code in (401, 403):
            raise CredentialRefused(f"HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}: {response.text[:300]}")
        answer = response.json()
        # The lease runs from when the request left: the answer may have waited a long-poll.
        self._last_ok = max(self._last_ok, sent)
        self.syncs += 1
        for item in answer.get("refused") or ():
            log.warning("the server refused a report, dropped: %s", item)
        self.refused += len(answer.get("refused") or ())
        if answer.get("fence_after_s"):
            self.fence_after_s = float(answer["fence_after_s"])
        self.fence_slack_s = float(answer.get("fence_slack_s") or 0.0)
        self._fence_not_before = 0.0
        self._save_lease(time.time() - (time.monotonic() - sent))
        for r in reports:
            key = (r["job"], r["generation"], r["rank"], r["event"])
            if self.outbox.get(key) is r:
                del self.outbox[key]
        self._logs_shipped(chunks, answer)
        self.state = answer.get("state", "unknown")
        self._confirm(answer)
        await self._reconcile(answer.get("work", []), answer.get("stop") or [])

    # -- fencing -------------------------------------------------------------------------------
    def _save_lease(self, contact: float) -> None:
        """Record the last contact (wall clock) and the lease, for an agent restarted while cut
        off: it fences its re-adopted ranks on time, not a whole lease after its start."""
        path = self.state_dir / "lease.json"
        try:
            lease = {
                "contact": contact,
                "fence_after_s": self.fence_after_s,
                "fence_slack_s": self.fence_slack_s,
            }
            write_atomic(path, json.dumps(lease))
        except OSError as exc:
            log.warning("cannot record the lease in %s: %s", path, exc)

    def _load_lease(self) -> None:
        """Count the lease from the recorded contact, and give a restarted agent until
        min(start + slack, contact + lease + slack) to reach the server before it fences (see the
        module's docstring): a crash late in a long-poll and a restart a minute later must not
        stop ranks the server still counts running."""
        try:
            data = json.loads((self.state_dir / "lease.json").read_text())
            contact, fence = float(data["contact"]), data.get("fence_after_s")
            slack = max(float(data.get("fence_slack_s") or 0.0), 0.0)
        except (OSError, ValueError, KeyError, TypeError):
            return
        if fence and not self.fence_after_s:
            self.fence_after_s = float(fence)
        self.fence_slack_s = slack
        now = time.monotonic()
        silent = max(time.time() - contact, 0.0)
        self._last_ok = now - silent
        if self.fence_after_s:
            self._fence_not_before = min(now + slack, self._last_ok + self.fence_after_s + slack)

    async def _fence_watch(self) -> None:
        """Check the lease every quarter second, also while a sync hangs."""
        while True:
            await asyncio.sleep(0.25)
            self._check_fence()

    def _check_fence(self) -> None:
        """Stop every rank once the server has not been reached for `fence_after_s`: a node cut
        off for longer is declared down, and its GPUs must be free when it is."""
        if not self.fence_after_s:
            return
        now = time.monotonic()
        silent = now - self._last_ok
        if silent < self.fence_after_s or now < self._fence_not_before:
            return
        running = [r for r in self.ranks.values() if r.status is RankStatus.RUNNING]
        if not running:
            return
        log.warning(
            "fenced: no contact with %s for %.0f s (fence_after_s %.0f); stopping %d ranks",
            self.server,
            silent,
            self.fence_after_s,
            len(running),
        )
        self.fenced += 1
        for local in running:
            local.note = f"fenced: the node agent had no contact with the server for {silent:.0f} s"
            local.cause = FENCED
            self._begin_stop(local)

    # -- identity and orphans ------------------------------------------------------------------
    def _read_identity(self) -> dict[str, Any] | str | None:
        try:
            data = json.loads((self.state_dir / "identity.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning(
                "the state directory's identity.json is unreadable (%s): its records are not adopted", exc
            )
            return "unreadable"
        if not isinstance(data, dict):
            return "unreadable"
        return {k: str(data.get(k) or "") for k in ("server", "cluster", "node", "instance")}

    def _previous(self) -> str:
        """The agent instance this state directory last synced as (else the one that last held
        this node's host lock): the server lets its successor (this agent, holding the locks, so
        that one is gone) take over at once."""
        if isinstance(self.identity, dict) and self.identity.get("instance"):
            return self.identity["instance"]
        return self.host_previous

    def _confirm(self, answer: dict[str, Any]) -> None:
        """At the first answered sync: the records are this server's when the state directory's
        identity names this server, cluster and node (or names none: a first start, or records of
        an agent before identities). Otherwise every recorded rank is disowned (its processes are
        stopped as orphans, nothing of it reported). Then the identity is recorded, and the
        cgroup tree read. At every later answer: a server that answers as another (its database
        was replaced) has the ranks of the one before disowned the same way."""
        mine = {
            "server": str(answer.get("server_id") or ""),
            "cluster": str(answer.get("cluster") or ""),
            "node": str(answer.get("node") or self.node),
        }
        recorded = self.identity
        if (
            self.confirmed
            and isinstance(recorded, dict)
            and all(recorded.get(k) == v for k, v in mine.items())
        ):
            return
        if recorded is not None and (
            not isinstance(recorded, dict) or any(recorded.get(k) != v for k, v in mine.items())
        ):
            self._disown(recorded if isinstance(recorded, dict) else {"server": "unknown"})
        self.identity = {**mine, "instance": self.instance}
        try:
            write_atomic(self.state_dir / "identity.json", json.dumps(self.identity))
        except OSError as exc:
            log.warning("cannot record the state directory's identity: %s", exc)
        self.confirmed = True
        self._scan_tree()

    def _disown(self, recorded: dict[str, Any]) -> None:
        other = recorded.get("server") or "unknown"
        for key, local in list(self.ranks.items()):
            log.warning(
                "rank %s was recorded for server %s (cluster %r, node %r), not this one: its processes"
                " are stopped as orphans, none of it is reported",
                local.name,
                other,
                recorded.get("cluster", ""),
                recorded.get("node", ""),
            )
            for task in local.tasks:
                task.cancel()
            del self.ranks[key]
            self.logs.pop(key, None)
            for event in ("started", "exited"):
                self.outbox.pop((*key, event), None)
            self.foreign[key] = other
            if local.cgroup is None and _alive(local.shim_pid):
                # No cgroup to stop it by: its process group (the shim ignores SIGTERM, the rank not).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(local.shim_pid, signal.SIGTERM)
            shutil.rmtree(local.record, ignore_errors=True)

    def _scan_tree(self) -> None:
        """The cgroup tree is the truth: a rank cgroup under this agent's that holds processes but
        is no rank of this agent's is an orphan, stopped (and reported while it lasts; the agent
        starts no rank until none is left). An empty one is removed."""
        if self.cgroups is None:
            return
        for name in self.cgroups.names():
            found = RANK_CGROUP.match(name)
            if found is None:
                continue
            key = (int(found[1]), int(found[2]), int(found[3]))
            if key in self.ranks or key in self.orphans:
                continue
            group = self.cgroups.rank(name)
            if group.empty():
                group.remove()
                continue
            log.warning(
                "orphan %s: its cgroup holds processes %s that no rank record of this server's names;"
                " stopping them, and starting no rank until they are gone",
                name,
                sorted(group.pids())[:ORPHAN_PIDS],
            )
            self.orphans[key] = asyncio.ensure_future(self._stop_orphan(key, group))

    def _orphan_list(self) -> list[dict[str, Any]]:
        """The orphans being stopped, for the server (at most MAX_ORPHANS): `server` is the
        server their record named when it was another's."""
        out = []
        for key in list(self.orphans)[:MAX_ORPHANS]:
            job, generation, rank = key
            pids: list[int] = []
            if self.cgroups is not None:
                with contextlib.suppress(OSError, ValueError):
                    pids = sorted(self.cgroups.rank(f"job-{job}-gen-{generation}-rank-{rank}").pids())
            out.append(
                {
                    "job": job,
                    "generation": generation,
                    "rank": rank,
                    "pids": pids[:ORPHAN_PIDS],
                    "server": self.foreign.get(key, "")[:16],
                }
            )
        return out

    async def _refused_sync(self, response: httpx.Response) -> None:
        """The server binds the node to another agent instance (HTTP 409): start nothing, say so
        (at most once a minute) and try again later; the other's lease may end."""
        try:
            detail = str(response.json().get("detail", ""))[:500]
        except (ValueError, AttributeError):
            detail = response.text[:300]
        self.state = "refused"
        now = time.monotonic()
        if self._refused_logged is None or now - self._refused_logged >= REFUSED_LOG_S:
            self._refused_logged = now
            log.error(
                "the server refused this agent (HTTP 409; instance %s on %s): %s",
                self.instance[:8],
                self.host,
                detail,
            )
        await self._pause(RETRY_S[-1])

    # -- reconcile -----------------------------------------------------------------------------
    async def _reconcile(self, work: list[dict[str, Any]], stops: list[list[int]] = ()) -> None:
        """Stop what this agent runs that the work does not list, answer each rank the server asks
        to stop (`stops`: it still counts them running), then start what the work lists and this
        agent lacks. A rank whose GPUs a rank of another job generation still holds here (being
        stopped: its job was cancelled before its start was reported, say) waits until that one
        is gone: the server may free a GPU whose rank it never heard of, and a GPU is never used
        by two jobs' processes."""
        wanted: dict[Key, tuple[RankPlan, dict[str, Any], bool]] = {}
        for entry in work:
            started = {int(r["rank"]): bool(r.get("started")) for r in entry["ranks"]}
            for plan in plan_env(entry, self.node):
                key = (int(entry["job"]), int(entry["generation"]), plan.rank)
                wanted[key] = (plan, entry, started.get(plan.rank, False))
        for key, local in list(self.ranks.items()):
            if key in wanted:
                continue
            if local.status is RankStatus.RUNNING:
                local.cause = local.cause or STOPPED
                self._begin_stop(local)
            elif local.status is RankStatus.EXITED and not any(k[:3] == key for k in self.outbox):
                self._forget(local)
        for item in stops:
            self._stop_listed(tuple(int(k) for k in item))
        held = 0
        busy: list[str] = []
        for key, (plan, entry, started) in wanted.items():
            if key in self.ranks or key in self.orphans:
                # An orphan: its cgroup holds processes this agent has no record of.
                continue
            if started:
                # The server saw it start; this agent has no record of it (its state was lost).
                self._report(
                    key,
                    "exited",
                    exit_code=LOST_EXIT,
                    cause=LOST,
                    log_tail="lost: the node agent lost its state",
                )
                continue
            if self.orphans:
                held += 1
                continue
            if self._terminating:
                continue
            holder = self._gpu_holder(key, plan)
            if holder is not None:
                busy.append(holder.name)
                continue
            await self._start(key, plan, entry)
        self.waiting = held + len(busy)
        if held:
            log.info("%d ranks wait until %d orphans are stopped", held, len(self.orphans))
        if busy:
            log.info("%d ranks wait for their GPUs, held by %s", len(busy), ", ".join(sorted(set(busy))))

    def _gpu_holder(self, key: Key, plan: RankPlan) -> LocalRank | None:
        """A rank of another job generation, not gone yet, that may use one of `plan`'s GPUs."""
        gpus = visible_gpus(plan)
        for local in self.ranks.values():
            if (
                local.key[:2] != key[:2]
                and local.status is not RankStatus.EXITED
                and gpus & visible_gpus(local.plan)
            ):
                return local
        return None

    def _stop_listed(self, key: Key) -> None:
        """The server counts rank `key` running but no longer wants it: stop it; if this agent
        has no record of it, stop what its cgroup still holds, or report it gone (so its GPU is
        released rather than booked for good)."""
        if key in self.ranks or key in self.orphans:
            local = self.ranks.get(key)
            if (
                local is not None
                and local.status is RankStatus.EXITED
                and not any(k[:3] == key for k in self.outbox)
            ):
                # Its exit was sent but the server has not stored it: say it again.
                self._report(
                    key,
                    "exited",
                    exit_code=_report_code(local.exit_code),
                    cause=local.cause or EXITED,
                    log_tail=local.note,
                )
            return
        job, generation, rank = key
        group = None
        if self.cgroups is not None:
            with contextlib.suppress(ValueError):
                group = self.cgroups.rank(f"job-{job}-gen-{generation}-rank-{rank}")
        if group is not None and not group.empty():
            log.warning("rank %s: no record, but its cgroup holds processes; stopping them", key)
            self.orphans[key] = asyncio.ensure_future(self._stop_orphan(key, group))
            return
        self._report(
            key,
            "exited",
            exit_code=LOST_EXIT,
            cause=LOST,
            log_tail="lost: the node agent has no record of this rank and no process of it runs",
        )

    async def _stop_orphan(self, key: Key, group: RankCgroup) -> None:
        """SIGTERM what the cgroup of a rank without a record holds, kill it after the default
        grace, then report the rank gone."""
        deadline = time.monotonic() + ORPHAN_GRACE_S
        termed: set[int] = set()
        while not group.empty():
            if time.monotonic() < deadline:
                termed |= group.signal(signal.SIGTERM, skip=termed)
            else:
                group.kill()
            await asyncio.sleep(0.25)
        group.remove()
        self.orphans.pop(key, None)
        shutil.rmtree(self.state_dir / f"job-{key[0]}-gen-{key[1]}-rank-{key[2]}", ignore_errors=True)
        if self.foreign.pop(key, None) is not None:
            return
        self._report(
            key,
            "exited",
            exit_code=LOST_EXIT,
            cause=LOST,
            log_tail="lost: stopped through its cgroup (no record of it)",
        )

    # -- starting ------------------------------------------------------------------------------
    def _account(self, entry: dict[str, Any]) -> Account:
        if self.single_user:
            pw = pwd.getpwuid(os.getuid())
            account = Account(pw.pw_name, pw.pw_uid, pw.pw_gid, None, pw.pw_dir)
        else:
            name = str(entry.get("account") or "")
            if not name:
                raise StartRefused("the job's owner has no Unix account name")
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                raise StartRefused(
                    f"the job's owner maps to Unix account {name!r}, which does not exist on node {self.node}"
                ) from None
            groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
            account = Account(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)
        if account.uid == 0 and not self.allow_root:
            raise StartRefused(
                f"the job would run as {account.name!r} (uid 0) and this node agent runs no rank as root"
                " (--allow-root)"
            )
        if (
            not self.single_user
            and 0 < account.uid < self.min_uid
            and account.name not in self.system_accounts
        ):
            raise StartRefused(
                system_account_refusal(account.name, account.uid, self.min_uid)
                + f" (node {self.node}; --system-account {account.name} allows this service account)"
            )
        return account

    def _workdir(self, entry: dict[str, Any], account: Account) -> str | None:
        workdir = entry.get("workdir") or None
        if workdir is None:
            return None
        if not workdir.startswith("/") or ".." in workdir.split("/"):
            raise StartRefused(f"workdir {workdir!r}: must be an absolute path without '..'")
        roots = [account.home, *self.workdir_roots]
        if not _inside(workdir, roots):
            raise StartRefused(
                f"workdir {workdir!r} is outside the owner's home {account.home!r}"
                f" and the node's allowed roots {list(self.workdir_roots)}"
            )
        return workdir

    def _open_log(self, path: Path, account: Account) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            if account.groups is not None:
                os.fchown(fd, account.uid, account.gid)
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _save(self, local: LocalRank) -> None:
        data = {
            "key": list(local.key),
            "plan": asdict(local.plan),
            "log_path": str(local.log_path),
            "stop_grace_s": local.stop_grace_s,
            "cgroup": None
            if local.cgroup is None
            else {"version": local.cgroup.version, "dirs": [str(d) for d in local.cgroup.dirs]},
            "shim_pid": local.shim_pid,
            "shim_start": local.shim_start,
        }
        write_atomic(local.record / "rank.json", json.dumps(data))

    def _refuse(self, local: LocalRank, code: int, reason: str) -> None:
        local.status = RankStatus.EXITED
        local.exit_code = code
        local.cause = REFUSED
        local.note = reason
        log.warning("rank %s not started: %s", local.name, reason)
        self._report(local.key, "started")
        self._report(local.key, "exited", exit_code=code, cause=REFUSED, log_tail=reason)

    async def _start(self, key: Key, plan: RankPlan, entry: dict[str, Any]) -> None:
        job, generation, rank = key
        log_path = self.log_dir / f"job-{job}-gen-{generation}-rank-{rank}.log"
        local = LocalRank(key, plan, log_path, float(entry.get("stop_grace_s", 30.0)), Path())
        local.record = self.state_dir / local.name
        self.ranks[key] = local
        try:
            account = self._account(entry)
            workdir = self._workdir(entry, account)
        except StartRefused as exc:
            self._refuse(local, REFUSED_EXIT, str(exc))
            return
        try:
            local.record.mkdir(mode=0o700, exist_ok=True)
            _fsync_dir(self.state_dir)
            (local.record / "exit").unlink(missing_ok=True)
            fd = self._open_log(log_path, account)
        except OSError as exc:
            self._refuse(local, REFUSED_EXIT, f"cannot prepare the rank's log and state: {exc}")
            return
        try:
            if self.cgroups is not None:
                local.cgroup = self.cgroups.create(local.name)
                pids = _ceiling(entry.get("pids_max"), self.pids_max)
                if pids:
                    local.cgroup.limit_pids(pids)
                memory_mb = _ceiling(entry.get("memory_mb"), self.memory_max_mb)
                if memory_mb and not local.cgroup.limit_memory(memory_mb * 1024 * 1024):
                    log.warning(
                        "rank %s: no memory controller, its limit of %d MiB is not enforced",
                        local.name,
                        memory_mb,
                    )
                planned = visible_gpus(plan)
                denied = [dev for index, dev in gpu_devices(self.dev_dir).items() if index not in planned]
                local.cgroup.deny_devices(denied)
            self._save(local)
            spec = {
                "argv": list(entry["command"]),
                "workdir": workdir,
                "uid": account.uid,
                "gid": account.gid,
                "groups": None if account.groups is None else list(account.groups),
                "procs": [] if local.cgroup is None else local.cgroup.procs_files(),
                "exit_file": str(local.record / "exit"),
            }
            spec["env"] = clean_env(plan.env, home=account.home, user=account.name)
            spec_file = local.record / "spec.json"
            write_atomic(spec_file, json.dumps(spec))
            local.starting = True
            local.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                str(SHIM),
                str(spec_file),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=fd,
                stderr=asyncio.subprocess.STDOUT,
                env={"PATH": DEFAULT_PATH, "LANG": DEFAULT_LOCALE},
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            self._refuse(local, 127, f"cannot start {entry['command'][0]!r}: {exc}")
            if local.cgroup is not None:
                local.cgroup.remove()
            return
        finally:
            # Started, refused or cancelled: no await comes before `proc` is kept below.
            local.starting = False
            os.close(fd)
        local.shim_pid = local.proc.pid
        local.shim_start = process_start(local.shim_pid)
        if self._terminating:
            # terminate_ranks ran while this rank was being started: it may not have seen its pid.
            self._signal(local, signal.SIGTERM)
        self._save(local)
        self._report(key, "started", pid=local.shim_pid)
        local.tasks.append(asyncio.ensure_future(self._watch(local)))

    # -- re-adoption ---------------------------------------------------------------------------
    def _adopt(self) -> None:
        """Take back the ranks recorded in the state directory (after a crash or a restart):
        live ones run on, exits that happened meanwhile are reported."""
        shims: dict[str, int] | None = None
        for path in sorted(self.state_dir.glob("job-*-gen-*-rank-*/rank.json")):
            try:
                data = json.loads(path.read_text())
                key = tuple(int(k) for k in data["key"])
                plan = RankPlan(**data["plan"])
                cgroup = None
                if data.get("cgroup"):
                    cgroup = RankCgroup(
                        int(data["cgroup"]["version"]), tuple(Path(d) for d in data["cgroup"]["dirs"])
                    )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring the unreadable rank record %s: %s", path, exc)
                continue
            local = LocalRank(
                key,
                plan,
                Path(data["log_path"]),
                float(data.get("stop_grace_s", 30.0)),
                path.parent,
                cgroup=cgroup,
                shim_pid=data.get("shim_pid"),
                shim_start=str(data.get("shim_start") or ""),
            )
            now_named = process_start(local.shim_pid)
            if local.shim_start and now_named and now_named != local.shim_start:
                # The node rebooted or the pid was reused: that process is not the rank's, and
                # nothing of the rank is left under that pid or its process group.
                log.info("rank %s: its shim's pid %s now names another process", local.name, local.shim_pid)
                local.shim_pid = None
            if local.shim_pid is None:
                # Its agent died between starting the shim and recording it. The shim may not
                # have forked the rank yet, or the rank not joined its cgroup: the shim is found
                # by the spec file it runs, not through the cgroup.
                if shims is None:
                    shims = running_shims()
                local.shim_pid = shims.get(os.path.realpath(path.parent / "spec.json"))
                if local.shim_pid is not None:
                    local.shim_start = process_start(local.shim_pid)
                    log.info("rank %s: re-adopted by its running shim %s", local.name, local.shim_pid)
                    with contextlib.suppress(OSError):
                        self._save(local)
            self.ranks[key] = local
            live = (cgroup is not None and not cgroup.empty()) or _alive(local.shim_pid)
            log.info("re-adopted rank %s (%s)", local.name, "running" if live else "exited meanwhile")
            self._report(key, "started", **({"pid": local.shim_pid} if local.shim_pid else {}))
            local.tasks.append(asyncio.ensure_future(self._watch(local)))

    # -- watching and stopping -----------------------------------------------------------------
    def _exit_file(self, local: LocalRank) -> int | None:
        try:
            return int(json.loads((local.record / "exit").read_text())["exit_code"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _main_exit(self, local: LocalRank) -> int | None:
        """The rank's main process exit code once it exited (from the shim's exit file), else
        None. When the shim is gone without writing one (it was killed), the rank is left
        running while its cgroup holds processes (None), and is LOST_EXIT (cause LOST: its exit
        status is unknowable) once the cgroup is empty, or at once without cgroups."""
        code = self._exit_file(local)
        if code is not None:
            return code
        if local.proc is not None:
            if local.proc.returncode is None:
                return None
        elif _alive(local.shim_pid):
            return None
        code = self._exit_file(local)
        if code is not None:
            return code
        if local.cgroup is not None and not local.cgroup.empty():
            if not local.shim_lost:
                local.shim_lost = True
                log.warning(
                    "rank %s: its shim is gone; the rank runs on, watched through its cgroup", local.name
                )
            return None
        local.cause = local.cause or LOST
        if local.shim_lost or local.shim_pid:
            local.note = local.note or "lost: its shim was killed; exit status unknown"
        return LOST_EXIT

    def _gone(self, local: LocalRank) -> bool:
        """No process of the rank is left: its cgroup is empty (without cgroups: its process
        group is gone)."""
        if local.cgroup is not None:
            return local.cgroup.empty()
        return not _group_alive(local.shim_pid)

    async def _watch(self, local: LocalRank) -> None:
        code = None
        checked = 0.0
        while True:
            if code is None:
                code = self._main_exit(local)
            if code is None and local.status is RankStatus.RUNNING and local.cgroup is not None:
                if time.monotonic() - checked >= LIMIT_CHECK_S:
                    checked = time.monotonic()
                    if local.cgroup.limit_hit() == PIDS_LIMIT:
                        # A fork refused at pids.max: a rank that forks without end (it may retry
                        # the fork for ever) is stopped there rather than left spinning.
                        log.warning("rank %s: reached its pids limit, stopping it", local.name)
                        local.cause = PIDS_LIMIT
                        local.note = "stopped: the rank reached its pids limit (a fork was refused)"
                        self._begin_stop(local)
            if code is not None:
                if self._gone(local):
                    break
                if local.status is RankStatus.RUNNING:
                    log.info("rank %s: main process exited, stopping what it left behind", local.name)
                    self._begin_stop(local)
            await asyncio.sleep(WATCH_S)
        local.status = RankStatus.EXITED
        local.exit_code = code
        if not local.cause and code and local.cgroup is not None:
            local.cause = local.cgroup.limit_hit() or ""
        local.cause = local.cause or EXITED
        tail = read_tail(local.log_path)
        if local.note:
            tail = f"{tail}\n{local.note}" if tail else local.note
        self._report(
            local.key, "exited", exit_code=_report_code(code), cause=local.cause, log_tail=tail[-TAIL_BYTES:]
        )

    def _begin_stop(self, local: LocalRank) -> None:
        local.status = RankStatus.STOPPING
        local.tasks.append(asyncio.ensure_future(self._stop_rank(local)))

    def _signal(
        self, local: LocalRank, sig: int, *, skip: frozenset[int] | set[int] = frozenset()
    ) -> set[int]:
        """Send `sig` to every process of the rank but those in `skip`; returns the pids
        signalled (without cgroups: the process group's, by its leader's pid)."""
        if local.cgroup is not None:
            if sig == signal.SIGKILL:
                local.cgroup.kill()
                return set()
            return local.cgroup.signal(sig, skip=skip)
        if local.shim_pid and local.shim_pid not in skip:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(local.shim_pid, sig)
                return {local.shim_pid}
        return set()

    async def _stop_rank(self, local: LocalRank) -> None:
        """SIGTERM every process of the rank, wait its grace period, then kill what is left
        (cgroup.kill, or freeze and SIGKILL). The rank is stopped once its main process exited
        and its cgroup is empty: an empty cgroup alone may be a rank the shim forked a moment ago
        that has not joined it yet, and each process that joins later gets its SIGTERM too
        (once: a rank's SIGTERM handler, a checkpoint, runs once). A stop begun while the rank's
        shim is being started (a fence then) waits for the shim: until it exists there is no main
        process whose exit could be known."""
        deadline = time.monotonic() + local.stop_grace_s
        termed: set[int] = set()
        while local.starting or not (self._gone(local) and self._main_exit(local) is not None):
            if time.monotonic() < deadline:
                termed |= self._signal(local, signal.SIGTERM, skip=termed)
            else:
                self._signal(local, signal.SIGKILL)
            await asyncio.sleep(0.05)

    def _forget(self, local: LocalRank) -> None:
        """Drop an exited rank whose exit the server has: its record and cgroup go."""
        del self.ranks[local.key]
        if local.cgroup is not None:
            local.cgroup.remove()
        shutil.rmtree(local.record, ignore_errors=True)

    def _log_file(self, key: Key, local: LocalRank) -> LogFile:
        found = self.logs.get(key)
        if found is None or found.path != local.log_path:
            found = self.logs[key] = LogFile.resume(local.log_path, local.record / "log-rotated")
        return found

    def _log_chunks(self) -> list[dict[str, Any]]:
        """The next piece of every rank log with output the server lacks: every `log_every_s`
        for running ranks, at once (and larger) for exited ones and for output rotated to
        `<log>.1` unshipped; within MAX_LOG_BYTES."""
        for key, local in self.ranks.items():
            self._log_file(key, local)
        due = time.monotonic() - self._logs_at >= self.log_every_s
        chunks: list[dict[str, Any]] = []
        size = 0
        for key, logfile in list(self.logs.items()):
            local = self.ranks.get(key)
            final = local is None or local.status is RankStatus.EXITED
            if not logfile.pending():
                if final:
                    del self.logs[key]
                continue
            # Output that rotated away unshipped goes at once, before the file rotates again.
            urgent = final or logfile.backlog()
            if not (due or urgent) or len(chunks) >= MAX_LOG_CHUNKS:
                continue
            piece = logfile.chunk(FINAL_CHUNK_BYTES if urgent else MAX_LOG_BYTES // 8, final=final)
            if piece is None:
                continue
            job, generation, rank = key
            entry = {"job": job, "generation": generation, "rank": rank, **piece}
            size += len(json.dumps(entry)) + 2
            if chunks and size > MAX_LOG_BYTES:
                break
            chunks.append(entry)
        if due:
            self._logs_at = time.monotonic()
        return chunks

    def _logs_shipped(self, chunks: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        """Move each rank log's shipped mark to where the server's copy ends; a refused chunk is
        skipped (the server keeps no more of a log over its limit)."""
        for name, end in (answer.get("logs") or {}).items():
            try:
                key = tuple(int(p) for p in str(name).split(":"))
            except ValueError:
                continue
            if key in self.logs and isinstance(end, int):
                self.logs[key].shipped_to(end)
        for item in answer.get("refused_logs") or ():
            key = (item.get("job"), item.get("generation"), item.get("rank"))
            logfile = self.logs.get(key)
            log.warning("the server refused a log chunk: %s", item)
            if logfile is None:
                continue
            if "limit" in str(item.get("reason", "")):
                logfile.full = True
            sent = next((c for c in chunks if (c["job"], c["generation"], c["rank"]) == key), None)
            if sent is not None:
                logfile.shipped_to(sent["offset"] + sent["size"])

    def _ship_logs(self) -> None:
        for key, logfile in self.logs.items():
            local = self.ranks.get(key)
            if (
                local is not None
                and local.status is not RankStatus.EXITED
                and logfile.rotate(self.log_max_bytes)
            ):
                log.info("rotated %s past %d bytes", logfile.path, self.log_max_bytes)
        for local in self.ranks.values():
            if local.status is RankStatus.EXITED or local.shim_pid is None:
                continue
            try:
                size = local.log_path.stat().st_size
            except OSError:
                continue
            if size != local.tail_size:
                local.tail_size = size
                self._report(local.key, "started", pid=local.shim_pid, log_tail=read_tail(local.log_path))

    async def _shutdown(self, client: httpx.AsyncClient) -> None:
        if self.stop_ranks_on_exit:
            for local in self.ranks.values():
                if local.status is RankStatus.RUNNING:
                    local.cause = local.cause or STOPPED
                    self._begin_stop(local)
            tasks = [t for local in self.ranks.values() for t in local.tasks]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        else:
            live = [r for r in self.ranks.values() if r.status is not RankStatus.EXITED]
            if live:
                log.info("leaving %d ranks running; the next agent on this node re-adopts them", len(live))
            for local in self.ranks.values():
                for task in local.tasks:
                    task.cancel()
        if self.outbox and self.confirmed:
            try:
                await client.post(
                    "/api/v1/agents/sync/", json=self._body(report_batch(list(self.outbox.values())), 0.0)
                )
            except httpx.HTTPError as exc:
                log.warning("could not send the last reports: %s", exc)


def run_in_thread(agent: Agent) -> threading.Thread:
    """Run `agent` on its own event loop in a daemon thread (the embedded demo's agents)."""
    thread = threading.Thread(
        target=lambda: asyncio.run(agent.run()), name=f"agent-{agent.node}", daemon=True
    )
    agent.thread = thread
    thread.start()
    return thread
