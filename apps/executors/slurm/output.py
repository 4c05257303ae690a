"""Slurm tasks' output as TopoWeb's rank logs, where the server reaches the job's log directory.

Each Slurm task writes its rank's output to `rank_log_name` in the job's log directory
(`log_dir`: the executor's `output_dir`, else the job's workdir). The sync records each rank of a
job Slurm runs as a rank run (`RankRun`, on its node, started) and stores what the file holds
beyond the stored copy as the agents' shipped chunks (`agents.agent_logs`, the same limit per
rank), with the end of it as the run's tail: `topoweb logs`, `GET /api/jobs/ID/logs/` and the job
page read them as they read an agent's. When the Slurm job ends, the rest of each file is stored
and the runs exit with Slurm's exit code; the GPUs of a run still counted as running are released
only then, as on agent clusters (a cancelled job's GPUs stay booked until Slurm has stopped it).
A log directory the server cannot read (no shared filesystem) leaves the runs without output; a
rank log that is a symbolic link, not a regular file, or not owned by the account the tasks run as
(when that account exists on the server's host) is not read.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from django.db import models
from django.db.models import Exists, F, OuterRef

from apps.agent.logs import CHUNK_BYTES, safe_text, utf8_cut
from apps.placement.jobs import load_job
from apps.scheduling import lifecycle
from apps.scheduling.choices import ExitCause, RankState
from apps.scheduling.models import Job, RankLogChunk, RankRun
from apps.scheduling.selectors import rank_log_max_bytes

from ..agents import services as agents
from ..models import ClusterExecutor, SlurmSubmission
from .rest import SlurmJob
from .script import rank_log_name

READ_BYTES = 256 * 1024  # read from one rank's file per sync at most
FINAL_READ_BYTES = 4 * 1024 * 1024  # and when its job ended
TAIL_BYTES = 4096  # the run's tail, as the agent reports it
LIVE_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")


def log_dir(executor: ClusterExecutor, job: Job) -> Path:
    """Where the job's Slurm tasks write their rank logs (as `sync._submit_one` tells them)."""
    launch = load_job(job.spec).launch
    return Path(executor.output_dir or launch.workdir or "/tmp")


def _open_log(path: Path, account: str) -> BinaryIO | None:
    """The rank's log file opened for reading, or None when it is missing or not the task's: the
    server reads a path its user names, so never through a symbolic link, only a regular file,
    and, when `account` (the Unix account the tasks run as) exists on this host, only a file
    that account owns."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    fh = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    uid = _local_uid(account)
    if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
        fh.close()
        return None
    return fh


def _local_uid(account: str) -> int | None:
    try:
        return pwd.getpwnam(account).pw_uid if account else None
    except KeyError:
        return None


def _piece(fh: BinaryIO, offset: int, limit: int, final: bool) -> bytes:
    """Up to `limit` bytes from `offset`, ending on a whole UTF-8 character unless `final`."""
    fh.seek(offset)
    data = fh.read(limit)
    if final or not data:
        return data
    return data[: utf8_cut(data)]


def ship(executor: ClusterExecutor, job: Job, generation: int, *, final: bool = False) -> int:
    """Store what each rank's file holds beyond the stored copy (`final`: the job ended, read to
    the end), within the server's limit per rank; update the runs' tails. Returns the bytes
    stored."""
    runs = list(RankRun.objects.filter(job=job, generation=generation).select_related("node"))
    if not runs:
        return 0
    directory = log_dir(executor, job)
    account = (
        SlurmSubmission.objects.filter(job=job, generation=generation)
        .values_list("slurm_user", flat=True)
        .first()
        or executor.slurm_user
    )
    ends = dict(
        RankLogChunk.objects.filter(run__in=runs)
        .values("run_id")
        .annotate(end=models.Max(F("offset") + F("size")))
        .values_list("run_id", "end")
    )
    limit = rank_log_max_bytes()
    by_node: dict[int, tuple[object, list[agents.LogChunk]]] = {}
    tails: list[RankRun] = []
    budget = FINAL_READ_BYTES if final else READ_BYTES
    for run in runs:
        fh = _open_log(directory / rank_log_name(job.pk, generation, run.rank), account)
        if fh is None:
            continue
        with fh:
            offset = int(ends.get(run.pk) or 0)
            read = 0
            while read < budget and offset < limit:
                data = _piece(fh, offset, min(CHUNK_BYTES, budget - read, limit - offset), final)
                if not data:
                    break
                by_node.setdefault(run.node_id, (run.node, []))[1].append(
                    agents.LogChunk(job.pk, generation, run.rank, offset, len(data), safe_text(data))
                )
                offset += len(data)
                read += len(data)
            if read:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - TAIL_BYTES))
                tail = safe_text(fh.read(TAIL_BYTES))
                if tail != run.log_tail:
                    run.log_tail = tail
                    tails.append(run)
    stored = 0
    for node, chunks in by_node.values():
        agents.agent_logs(node=node, chunks=chunks)
        stored += sum(c.size for c in chunks)
    if tails:
        RankRun.objects.bulk_update(tails, ["log_tail"])
    return stored


def exit_of(state: str, comps: Iterable[SlurmJob]) -> tuple[int | None, str]:
    """(exit code, `ExitCause`) of each rank of a Slurm job that ended in `state`: Slurm keeps one
    exit code per job (negative: the signal that ended it)."""
    comps = list(comps)
    code = next((c.exit_code for c in comps if c.exit_code), None)
    sig = next((c.signal for c in comps if c.signal), None)
    if state == "COMPLETED":
        return 0, ExitCause.EXITED
    value = code if code is not None else (-sig if sig else None)
    if state == "NODE_FAIL":
        return value, ExitCause.NODE_DOWN
    if state in ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE"):
        return value, ExitCause.STOPPED
    return value, ExitCause.EXITED


def ranks_ended(
    executor: ClusterExecutor,
    job: Job,
    generation: int,
    *,
    exit_code: int | None,
    cause: str,
    now: datetime,
) -> int:
    """The job's Slurm job for `generation` ended: every rank is a run (a job that started and
    ended between two syncs included), the rest of its output is stored and the runs still
    counted as running exit with `exit_code` for `cause`. Returns how many exited."""
    lifecycle.ranks_running(job=job, generation=generation, now=now)
    ship(executor, job, generation, final=True)
    return lifecycle.ranks_ended(
        job_id=job.pk, generation=generation, exit_code=exit_code, exit_cause=cause, now=now
    )


def close_stopped(executor: ClusterExecutor, now: datetime) -> list[int]:
    """Runs still counted as running whose Slurm job no longer runs (TopoWeb stopped it, or its
    generation was left): stored to the end, exited as stopped, their GPUs released. Returns the
    ids of their jobs."""
    live = SlurmSubmission.objects.filter(
        job_id=OuterRef("job_id"), generation=OuterRef("generation"), state__in=LIVE_STATES
    )
    stale = sorted(
        set(
            RankRun.objects.filter(job__cluster_id=executor.cluster_id, state=RankState.STARTED)
            .exclude(Exists(live))
            .values_list("job_id", "generation")
        )
    )
    jobs = {j.pk: j for j in Job.objects.filter(pk__in={j for j, _ in stale})}
    for job_id, generation in stale:
        ranks_ended(executor, jobs[job_id], generation, exit_code=None, cause=ExitCause.STOPPED, now=now)
    for job_id in jobs:
        lifecycle.release_exited(job_id=job_id, now=now)
    return sorted(jobs)
