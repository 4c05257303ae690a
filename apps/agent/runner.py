"""The agent's loop: sync with the server (heartbeat, reports, long-poll for work), start the
ranks it lacks, stop the ranks the server no longer lists, report starts and exits.

The agent authenticates with its node's own token (`Authorization: Node <key>`): the server
answers only for that node. Reports are keyed by (job, generation, rank, event) and resent until
a sync succeeds, so a retried report is harmless; at most MAX_REPORTS go in one sync. A report
the server refused (listed in the answer's `refused` with the reason) is logged and dropped, not
resent. Output travels as text whatever bytes the rank wrote: invalid UTF-8 and NUL become U+FFFD. Each rank's stdout and stderr go to one file in `log_dir`; its tail
travels with the exit report (and, while it runs, every `log_every_s`).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from . import VERSION
from .env import RankPlan, plan_env
from .gpus import gpu_inventory

log = logging.getLogger("topoweb.agent")
# One line per poll would drown the agent's own log.
logging.getLogger("httpx").setLevel(logging.WARNING)

TAIL_BYTES = 4096
MAX_REPORTS = 256
# The reports of one sync stay under this many bytes of JSON (the server takes 4 MiB bodies).
MAX_REPORT_BYTES = 2 * 1024 * 1024
# The long-poll wait, also the heartbeat: the server answers at once when the node's work changes,
# and bounds the wait by its own TOPOWEB_AGENT_POLL_S (60 s by default).
DEFAULT_POLL_S = 60.0
RETRY_S = (0.5, 1.0, 2.0, 5.0)
Key = tuple[int, int, int]


class RankStatus(enum.Enum):
    """A local rank process: running, being stopped (SIGTERM sent), or exited."""

    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"


@dataclass(slots=True)
class LocalRank:
    """One rank process this agent started."""

    key: Key
    plan: RankPlan
    log_path: Path
    stop_grace_s: float
    proc: asyncio.subprocess.Process | None = None
    status: RankStatus = RankStatus.RUNNING
    exit_code: int | None = None
    tail_size: int = 0
    tasks: list[asyncio.Task] = field(default_factory=list)


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


def safe_text(data: bytes) -> str:
    """Bytes as text any JSON parser and database take: invalid UTF-8 and NUL become U+FFFD."""
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a file as text ('' if it is missing; see `safe_text`)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - limit, 0))
            return safe_text(fh.read())
    except OSError:
        return ""


class Agent:
    """A node agent: `await agent.run()` until `stop()` (or SIGTERM via `main`)."""

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
    ):
        self.server = server.rstrip("/")
        self.node = node
        self.token = token
        self.log_dir = Path(log_dir)
        self.poll_s = poll_s
        self.addr = addr
        self.log_every_s = log_every_s
        self.timeout_s = timeout_s
        self.ranks: dict[Key, LocalRank] = {}
        self.outbox: dict[tuple[int, int, int, str], dict[str, Any]] = {}
        self.state = "unknown"
        self.syncs = 0
        self.refused = 0
        self._stopping = threading.Event()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish (thread-safe); running ranks are stopped first."""
        self._stopping.set()
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def terminate_ranks(self) -> int:
        """SIGTERM every rank process group this agent started, from any thread (for a host
        process that exits without waiting for the loop); returns how many were signalled."""
        count = 0
        for local in list(self.ranks.values()):
            if local.proc is not None and local.proc.returncode is None:
                _signal_group(local.proc.pid, signal.SIGTERM)
                count += 1
        return count

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
        """Sync until stopped; on the way out stop every rank and send the last reports."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        headers = {"Authorization": f"Node {self.token}", "User-Agent": f"topoweb-agent/{VERSION}"}
        # The long-poll may take poll_s on the server: the read timeout leaves room for it.
        timeout = httpx.Timeout(self.timeout_s, read=self.poll_s + self.timeout_s)
        async with httpx.AsyncClient(base_url=self.server, headers=headers, timeout=timeout) as client:
            failures = 0
            last_log = time.monotonic()
            while not self._stopping.is_set():
                if time.monotonic() - last_log >= self.log_every_s:
                    self._ship_logs()
                    last_log = time.monotonic()
                try:
                    await self._sync(client)
                    failures = 0
                except (httpx.HTTPError, ValueError) as exc:
                    delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                    failures += 1
                    log.warning("sync with %s failed (%s); retrying in %.1f s", self.server, exc, delay)
                    await self._pause(delay)
            await self._shutdown(client)

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def _sync(self, client: httpx.AsyncClient) -> None:
        reports = report_batch(list(self.outbox.values()))
        running = [list(k) for k, r in self.ranks.items() if r.status is not RankStatus.EXITED]
        body = {
            "node": self.node,
            "version": VERSION,
            "addr": self.addr,
            "gpus": gpu_inventory(),
            "running": running,
            "reports": reports,
            "wait_s": 0.0 if reports else self.poll_s,
        }
        self._wake.clear()
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
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}: {response.text[:300]}")
        answer = response.json()
        self.syncs += 1
        for item in answer.get("refused") or ():
            log.warning("the server refused a report, dropped: %s", item)
        self.refused += len(answer.get("refused") or ())
        for r in reports:
            key = (r["job"], r["generation"], r["rank"], r["event"])
            if self.outbox.get(key) is r:
                del self.outbox[key]
        self.state = answer.get("state", "unknown")
        await self._reconcile(answer.get("work", []))

    # -- reconcile -----------------------------------------------------------------------------
    async def _reconcile(self, work: list[dict[str, Any]]) -> None:
        wanted: set[Key] = set()
        for entry in work:
            started = {int(r["rank"]): bool(r.get("started")) for r in entry["ranks"]}
            for plan in plan_env(entry, self.node):
                key = (int(entry["job"]), int(entry["generation"]), plan.rank)
                wanted.add(key)
                if key in self.ranks:
                    continue
                if started.get(plan.rank):
                    # The server saw it start, this agent does not know it (it restarted).
                    self._report(key, "exited", exit_code=255, log_tail="lost: the node agent restarted")
                    continue
                await self._start(key, plan, entry)
        for key, local in list(self.ranks.items()):
            if key in wanted:
                continue
            if local.status is RankStatus.RUNNING:
                self._begin_stop(local)
            elif local.status is RankStatus.EXITED and not any(k[:3] == key for k in self.outbox):
                del self.ranks[key]

    async def _start(self, key: Key, plan: RankPlan, entry: dict[str, Any]) -> None:
        job, generation, rank = key
        log_path = self.log_dir / f"job-{job}-gen-{generation}-rank-{rank}.log"
        local = LocalRank(key, plan, log_path, float(entry.get("stop_grace_s", 30.0)))
        self.ranks[key] = local
        env = {**os.environ, **plan.env}
        try:
            with log_path.open("ab") as out:
                local.proc = await asyncio.create_subprocess_exec(
                    *entry["command"],
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    cwd=entry.get("workdir") or None,
                    start_new_session=True,
                )
        except OSError as exc:
            local.status = RankStatus.EXITED
            local.exit_code = 127
            self._report(key, "started")
            self._report(
                key, "exited", exit_code=127, log_tail=f"cannot start {entry['command'][0]!r}: {exc}"
            )
            return
        self._report(key, "started", pid=local.proc.pid)
        local.tasks.append(asyncio.ensure_future(self._watch(local)))

    async def _watch(self, local: LocalRank) -> None:
        code = await local.proc.wait()
        local.status = RankStatus.EXITED
        local.exit_code = code
        self._report(
            local.key, "exited", exit_code=max(min(code, 255), -255), log_tail=read_tail(local.log_path)
        )

    def _begin_stop(self, local: LocalRank) -> None:
        local.status = RankStatus.STOPPING
        local.tasks.append(asyncio.ensure_future(self._stop_rank(local)))

    async def _stop_rank(self, local: LocalRank) -> None:
        """SIGTERM the rank's process group, wait its grace period, then SIGKILL."""
        proc = local.proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + local.stop_grace_s
        while proc.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGKILL)

    def _ship_logs(self) -> None:
        for local in self.ranks.values():
            if local.status is RankStatus.EXITED or local.proc is None:
                continue
            try:
                size = local.log_path.stat().st_size
            except OSError:
                continue
            if size != local.tail_size:
                local.tail_size = size
                self._report(local.key, "started", pid=local.proc.pid, log_tail=read_tail(local.log_path))

    async def _shutdown(self, client: httpx.AsyncClient) -> None:
        for local in self.ranks.values():
            if local.status is RankStatus.RUNNING:
                self._begin_stop(local)
        tasks = [t for local in self.ranks.values() for t in local.tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.outbox:
            body = {
                "node": self.node,
                "version": VERSION,
                "addr": self.addr,
                "gpus": gpu_inventory(),
                "running": [],
                "reports": report_batch(list(self.outbox.values())),
                "wait_s": 0.0,
            }
            try:
                await client.post("/api/v1/agents/sync/", json=body)
            except httpx.HTTPError as exc:
                log.warning("could not send the last reports: %s", exc)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_in_thread(agent: Agent) -> threading.Thread:
    """Run `agent` on its own event loop in a daemon thread (the embedded demo's agents)."""
    thread = threading.Thread(
        target=lambda: asyncio.run(agent.run()), name=f"agent-{agent.node}", daemon=True
    )
    agent.thread = thread
    thread.start()
    return thread
