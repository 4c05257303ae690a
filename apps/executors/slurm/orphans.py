"""Which of a Slurm cluster's jobs are TopoWeb's, and which of those TopoWeb no longer runs (no
Django: plain data in, verdicts out; apps/executors/slurm/sync.py reads the data and acts).

A Slurm job is this TopoWeb's when its comment's tag (`slurmscript.comment`) names this cluster
and this server (`ClusterExecutor.server_id`), or names this cluster without a server (a job
submitted before servers were named) and its id is recorded for the very job and generation the
tag names. Another server's jobs and jobs others submit are never TopoWeb's to stop.

Each live one (some component neither finished nor just completing) must be the Slurm job a
TopoWeb job active in that generation recorded. Otherwise it is an orphan, to cancel: the TopoWeb
job is gone, finished, back in the queue or in a later generation, or it already runs that
generation as another Slurm job. One exception: a Slurm job of an active job's current
generation whose id TopoWeb never recorded (it died between Slurm's answer and its save, or the
save is in flight in another process) is recorded, not cancelled.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from .rest import SlurmJob
from .script import parse_comment

CANCEL = "cancel"
RECORD = "record"


@dataclass(frozen=True, slots=True)
class Claim:
    """A live Slurm job of this TopoWeb's: the TopoWeb job and generation its tag names, its
    components' states ("PENDING,RUNNING") and the Slurm user it runs as."""

    slurm_id: int
    job_id: int
    generation: int
    state: str
    user: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one of TopoWeb's live Slurm jobs (`action`: cancel or record) and why."""

    slurm_id: int
    job_id: int | None
    generation: int | None
    state: str
    action: str
    why: str
    user: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def stoppable(comps: Iterable[SlurmJob]) -> bool:
    """Some component may still run: live and not just cleaning up (a completing component is
    on its way out; one Slurm then requeues shows up pending at the next look)."""
    return any(c.live and c.state != "COMPLETING" for c in comps)


def owner(
    comps: Sequence[SlurmJob], *, cluster: str, server: str, known: Mapping[int, tuple[int, int]]
) -> tuple[int, int] | None:
    """(TopoWeb job, generation) of a Slurm job (its components) if it is this TopoWeb's by its
    tag (see the module doc), else None. `known`: Slurm job id -> (job, generation) recorded."""
    tag = next((t for t in (parse_comment(c.comment) for c in comps) if t is not None), None)
    if tag is None or tag.cluster != cluster:
        return None
    pair = (tag.job_id, tag.generation)
    if tag.server == server and server:
        return pair
    if not tag.server and known.get(comps[0].group_id) == pair:
        return pair
    return None


def claims(
    groups: Mapping[int, Sequence[SlurmJob]],
    *,
    cluster: str,
    server: str,
    known: Mapping[int, tuple[int, int]],
    skip: Collection[int] = (),
) -> list[Claim]:
    """This TopoWeb's stoppable Slurm jobs among `groups` (Slurm job id -> its records), but
    those in `skip`, in Slurm job id order."""
    out = []
    for gid in sorted(groups):
        comps = groups[gid]
        if gid in skip or not comps or not stoppable(comps):
            continue
        pair = owner(comps, cluster=cluster, server=server, known=known)
        if pair is None:
            continue
        states = ",".join(sorted({c.state for c in comps}))
        out.append(Claim(gid, pair[0], pair[1], states, comps[0].user))
    return out


def judge(
    claimed: Iterable[Claim],
    *,
    jobs: Mapping[int, tuple[str, int]],
    subs: Mapping[tuple[int, int], int | None],
    active: Collection[str],
) -> list[Verdict]:
    """The verdicts on claimed Slurm jobs (none for a Slurm job TopoWeb runs). `jobs`: TopoWeb
    job id -> (status, current generation); `subs`: (job, generation) -> the Slurm job id
    recorded for it (None: a row without one); `active`: the statuses of a job that runs."""
    out = []
    for c in claimed:
        action, why = CANCEL, ""
        if c.job_id not in jobs:
            why = f"TopoWeb job {c.job_id} no longer exists"
        else:
            status, generation = jobs[c.job_id]
            recorded = subs.get((c.job_id, c.generation))
            if status not in active:
                why = f"TopoWeb job {c.job_id} is {status}"
            elif generation != c.generation:
                why = f"TopoWeb job {c.job_id} runs generation {generation}, not {c.generation}"
            elif recorded is None:
                action = RECORD
                why = f"TopoWeb job {c.job_id} generation {c.generation} never recorded it"
            elif recorded != c.slurm_id:
                why = f"TopoWeb job {c.job_id} generation {c.generation} runs as Slurm job {recorded}"
            else:
                continue
        out.append(Verdict(c.slurm_id, c.job_id, c.generation, c.state, action, why, c.user))
    return out
