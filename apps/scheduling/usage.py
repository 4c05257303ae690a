"""GPU use as booked: the one source of GPU-seconds for the usage page and API, the queue page's
Accounts table, account limits and fair share.

A job holds a GPU from its allocation's `created_at` to its `released_at` (still held while
null). Each generation of a requeued, preempted or migrated job has its own allocation rows, so
a job that ran twice is charged for both runs and not for the time it waited in between, and a
running job is charged up to now. Counting `started_at`..`finished_at` × `gpus` would charge a
requeued job for the wait between its generations and lose its first runs. A migration's new
rank is booked from when it was placed, so while the old rank stops both are charged (the GPU
is held for the job either way).

Rows are read grouped by (job, generation, booked, released): a generation's GPUs share their
times, so a 64-GPU job is one group, not 64 rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q

from .models import Allocation

# What GPU-seconds may be grouped by. A QOS model does not exist yet: when it does, add
# "qos": "job__qos__name" here and the API, page and CSV take it.
GROUP_FIELDS = {
    "user": "job__owner__username",
    "account": "job__account__name",
    "qos": "job__qos__name",
    "cluster": "job__cluster__name",
}
NONE = "(none)"


@dataclass(frozen=True, slots=True)
class Held:
    """`gpus` GPUs held by generation `generation` of job `job_id` from `begin` to `end` (None:
    still held); `key` is the group's value (user, account or cluster name; account id for
    fair share)."""

    job_id: int
    generation: int
    key: object
    gpus: int
    begin: datetime
    end: datetime | None

    def seconds(self, since: datetime | None, until: datetime) -> float:
        """GPU-seconds held inside [since, until)."""
        begin = self.begin if since is None or self.begin > since else since
        end = until if self.end is None or self.end > until else self.end
        return self.gpus * (end - begin).total_seconds() if end > begin else 0.0


def held(*, jobs: Q | None = None, since: datetime | None, until: datetime | None, key: str) -> list[Held]:
    """Allocation groups of jobs matching `jobs` (a filter on Allocation, e.g. Q(job__cluster=c))
    that overlap [since, until) (None: unbounded), keyed by the field `key` (one query)."""
    rows = Allocation.objects.all()
    if jobs is not None:
        rows = rows.filter(jobs)
    if since is not None:
        rows = rows.filter(Q(released_at__isnull=True) | Q(released_at__gt=since))
    if until is not None:
        rows = rows.filter(created_at__lt=until)
    rows = (
        rows.values("job_id", "generation", "created_at", "released_at", key)
        .annotate(gpus=Count("id"))
        .order_by()
    )
    return [
        Held(r["job_id"], r["generation"], r[key], r["gpus"], r["created_at"], r["released_at"]) for r in rows
    ]


def gpu_seconds(groups: Iterable[Held], *, since: datetime | None, until: datetime) -> dict[object, float]:
    """GPU-seconds inside [since, until) per key."""
    out: dict[object, float] = {}
    for h in groups:
        s = h.seconds(since, until)
        if s > 0:
            out[h.key] = out.get(h.key, 0.0) + s
    return out


def gpu_seconds_by(
    *, by: str, since: datetime, until: datetime, jobs: Q | None = None
) -> tuple[dict[str, float], dict[str, set[int]]]:
    """GPU-seconds inside [since, until) per user, account or cluster name (`by`, a key of
    GROUP_FIELDS; "(none)" for jobs without an account), and per name the jobs that held GPUs."""
    groups = held(jobs=jobs, since=since, until=until, key=GROUP_FIELDS[by])
    seconds: dict[str, float] = {}
    ran: dict[str, set[int]] = {}
    for h in groups:
        s = h.seconds(since, until)
        if s <= 0:
            continue
        name = NONE if h.key is None else h.key
        seconds[name] = seconds.get(name, 0.0) + s
        ran.setdefault(name, set()).add(h.job_id)
    return seconds, ran
