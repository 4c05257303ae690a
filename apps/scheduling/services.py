"""Scheduling services: every write of the scheduling app goes through these functions.

What users, operators and launchers ask of a job (submit, cancel, start, complete, fail,
preempt): checked and locked here, each change made by its transition in `lifecycle.py`. The
scheduling cycle is in `cycle.py` and migration proposals in `proposals.py`, re-exported below.
Services are keyword-only and run in a transaction.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.db.models import Subquery
from django.utils import timezone

from apps.placement.topology import SpecError
from apps.topology.models import Cluster
from apps.topology.selectors import forget_recent_clusters

from . import accounts, lifecycle
from . import recent as recent_reads
from . import snapshot as snap
from .choices import ACTIVE_STATUSES, FINISHED_STATUSES, WAITING_STATUSES, JobStatus
from .cycle import queue_cycle, schedule_cluster
from .executor import owner_refusal
from .lifecycle import JobStateError
from .models import Account, Job, LauncherToken, Qos, new_launcher_key
from .node_models import node_key_hash
from .proposals import migration_apply, migration_reject, migrations_propose
from .selectors import cluster_for_spec

__all__ = [
    "IdempotencyConflict",
    "QueuedCapExceeded",
    "JobStateError",
    "job_cancel",
    "job_complete",
    "job_fail",
    "job_hold",
    "job_preempt",
    "job_release",
    "job_requeue",
    "job_set_priority",
    "job_start",
    "job_submit",
    "job_submit_once",
    "launcher_token_create",
    "migration_apply",
    "migration_reject",
    "migrations_propose",
    "schedule_cluster",
]


class IdempotencyConflict(Exception):
    """An Idempotency-Key reused with another body or cluster than its first submission."""

    def __init__(self, job: Job):
        self.job = job
        super().__init__(
            f"this Idempotency-Key was first used for job {job.pk} with another body or cluster;"
            " use a new key for a new submission"
        )


class QueuedCapExceeded(Exception):
    """A submission of `adding` jobs would take the waiting jobs a cap counts (`queued` now) past
    its `value`: nothing of it was queued."""

    def __init__(self, cap: accounts.QueuedCap, queued: int, adding: int):
        self.limit, self.value, self.queued, self.adding = cap.limit, cap.value, queued, adding
        jobs = "a job" if adding == 1 else f"{adding} jobs"
        super().__init__(
            f"{jobs} more would be over the limit of {cap.value} waiting jobs ({cap.limit});"
            f" {queued} are queued now. Wait for some to start or cancel some."
        )


class _StaleCaps(Exception):
    """The caps a submission took from rows this process remembered (`recent`) have changed."""


def _within_queued_caps(
    user: AbstractBaseUser, rows: list[Job], *, kept: bool = False, insert: tuple[str, list] | None = None
) -> None:
    """Raise QueuedCapExceeded when the waiting jobs `rows`, just INSERTed in this transaction,
    took a cap of the user's (or of their account in a QOS) past its value.

    Runs in the submission's transaction after its INSERT: the account's row (when a cap counts
    the account's jobs) then the user's row are locked (FOR NO KEY UPDATE, which other rows'
    foreign keys to them do not wait for), then the waiting jobs are counted, this transaction's
    own among them; a concurrent submission of the same user or account counts after this one
    commits or rolls back, so racing clients cannot pass a cap together, and the INSERT is not
    part of the time the lock is held. `kept`: the rows' account and QOS are rows this process
    remembered (`recent`): their caps are read afresh with the user's lock (no more round trips),
    and _StaleCaps is raised when they changed (the caller tries again with every row read afresh).
    `insert`: the statement of `lifecycle.submit_statement` that INSERTs the one job of `rows`,
    sent first in the same round trip (Postgres), the job then `lifecycle.submitted`."""
    pairs = {(job.account_id, job.qos_id): (job.account, job.qos) for job in rows if job.qos_id is not None}
    caps = accounts.queued_caps(user, pairs.values())
    shared = sorted({cap.account_id for cap in caps if cap.account_id is not None})
    if shared and insert is not None:
        # The INSERT first, by itself: it is not part of the time the accounts' locks are held.
        with connection.cursor() as cursor:
            cursor.execute(*insert)
            lifecycle.submitted(rows[0], cursor.fetchone())
        insert = None
    if shared:
        # In id order: two submissions locking the same accounts cannot deadlock.
        list(
            Account.objects.select_for_update(no_key=True)
            .filter(pk__in=shared)
            .order_by("pk")
            .values_list("pk")
        )
    expected, fresh = _kept_caps(pairs.values()) if kept else ((), {})
    counted = [(cap, adding) for cap in caps if (adding := sum(1 for job in rows if cap.matches(job)))]

    def queries():
        lock = (
            get_user_model()
            .objects.select_for_update(no_key=True)
            .filter(pk=user.pk)
            .annotate(**_fresh_annotations(fresh))
            .values_list("pk", *fresh)[:1]
        )
        # Counted up to the cap (and the jobs added) only: a user far over it (a lowered cap)
        # costs no longer count.
        counts = [
            Job.objects.filter(cap.jobs, status__in=WAITING_STATUSES)
            .order_by()
            .values("pk")[: cap.value + 1 + adding]
            for cap, adding in counted
        ]
        return lock, counts

    # What the statements depend on: the same key, the same SQL and parameters.
    key = (user.pk, tuple(fresh), tuple((str(cap.jobs), cap.value + 1 + adding) for cap, adding in counted))
    if insert is not None:
        (job,) = rows
        inserted, found, counts = _lock_and_count(key, queries, insert=insert)
        lifecycle.submitted(job, inserted)
    else:
        _, found, counts = _lock_and_count(key, queries)
    if kept and found is not None and tuple(found[1:]) != expected:
        raise _StaleCaps
    for (cap, adding), n in zip(counted, counts, strict=True):
        if n > cap.value:
            raise QueuedCapExceeded(cap, n - adding, adding)


_STATEMENTS: dict[tuple, tuple[str, list]] = {}
STATEMENTS_KEPT = 1024


def _lock_and_count(
    key: tuple, queries, *, insert: tuple[str, list] | None = None
) -> tuple[tuple | None, tuple | None, list[int]]:
    """`queries()` gives (lock, counts): the row the query `lock` selects (locking it), and how
    many rows each query of `counts` selects, counted once the lock is held. On Postgres one
    round trip: the statements are sent together and each reads what was committed when it starts
    (READ COMMITTED), so the counts see every submission that held the lock before; their SQL is
    compiled once per `key` (which determines it) and process. Elsewhere one query each.
    `insert` (sql, params), Postgres only: a statement returning one row, sent first. Returns
    (the row `insert` returned, the locked row, the counts)."""
    if connection.vendor != "postgresql":
        if insert is not None:
            raise ValueError("an INSERT goes with the lock and count on Postgres only")
        lock, counts = queries()
        return None, next(iter(lock), None), [qs.count() for qs in counts]
    statement = _STATEMENTS.get(key)
    if statement is None:
        lock, counts = queries()
        sql, params = lock.query.sql_with_params()
        statements, params = [sql], list(params)
        for qs in counts:
            sql, more = qs.query.sql_with_params()
            statements.append(f"SELECT COUNT(*) FROM ({sql}) AS waiting")
            params.extend(more)
        if len(_STATEMENTS) >= STATEMENTS_KEPT:
            _STATEMENTS.clear()
        statement = _STATEMENTS[key] = ("; ".join(statements), params)
    sql, params = statement
    if insert is not None:
        sql, params = f"{insert[0]}; {sql}", [*insert[1], *params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        inserted = None
        if insert is not None:
            inserted = cursor.fetchone()
            cursor.nextset()
        found = cursor.fetchone()
        numbers = []
        while cursor.nextset():
            numbers.append(cursor.fetchone()[0])
    return inserted, found, numbers


def _kept_caps(pairs) -> tuple[tuple, dict[str, tuple[type, int, str]]]:
    """The cap fields of the accounts and QOS `pairs` holds, as remembered, and what reads them
    afresh beside the user's id (in the same order): annotation name -> (model, pk, field), made
    into subqueries by `_fresh_annotations` only when the statement is compiled."""
    expected: list = []
    fresh: dict[str, tuple[type, int, str]] = {}
    for acct, qos in pairs:
        for model, row, fields in (
            (Account, acct, ("max_queued_jobs",)),
            (Qos, qos, ("max_queued_per_user", "max_queued_per_account")),
        ):
            if row is None:
                continue
            for f in fields:
                fresh[f"kept_{model.__name__}_{row.pk}_{f}"] = (model, row.pk, f)
                expected.append(getattr(row, f))
    return tuple(expected), fresh


def _fresh_annotations(fresh: dict[str, tuple[type, int, str]]) -> dict[str, Subquery]:
    """The subqueries of `_kept_caps`'s annotations: one row by its key, so without the model's
    ordering (a QOS orders by its cluster's name, which would join the cluster and sort)."""
    return {
        name: Subquery(model.objects.filter(pk=pk).order_by().values(field))
        for name, (model, pk, field) in fresh.items()
    }


def submission_digest(*, spec: Any, cluster_name: str | None) -> str:
    """SHA-256 (hex) of a submission: its body and the cluster it named, key order ignored."""
    body = json.dumps([spec, cluster_name], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


def job_submit_once(
    *, user: AbstractBaseUser, spec: Any, idempotency_key: str, cluster: Cluster | None = None
) -> tuple[Job, bool]:
    """`job_submit` keyed by the client's Idempotency-Key (unique per user): the first call queues
    the job; a retry with the same key and body returns that job. Returns (job, replayed).

    Raises IdempotencyConflict when the key was used with another body or cluster, SpecError as
    `job_submit`.
    """
    digest = submission_digest(spec=spec, cluster_name=cluster.name if cluster else None)

    def first() -> Job | None:
        job = (
            Job.objects.select_related("account", "qos")
            .filter(owner=user, idempotency_key=idempotency_key)
            .first()
        )
        if job is not None and job.idempotency_digest != digest:
            raise IdempotencyConflict(job)
        return job

    job = first()
    if job is not None:
        return job, True
    try:
        return job_submit(user=user, spec=spec, cluster=cluster, idempotency=(idempotency_key, digest)), False
    except IntegrityError:
        # A concurrent retry with the same key committed first.
        job = first()
        if job is None:
            raise
        return job, True


def job_submit(
    *,
    user: AbstractBaseUser,
    spec: Any,
    cluster: Cluster | None = None,
    idempotency: tuple[str, str] | None = None,
) -> Job:
    """Validate a job spec v1 and queue it on its cluster; a scheduling cycle follows on commit.

    Raises SpecError naming each bad field, including a job larger than the cluster or one no
    placement could ever fit, and QueuedCapExceeded when the user has as many waiting jobs as a
    cap allows (`accounts.queued_caps`). A job that fits the cluster but not now is queued and the cycle
    records why it waits. `idempotency` is (key, digest), stored with the job (see
    `job_submit_once`).
    """
    if cluster is None and not transaction.get_connection().in_atomic_block:
        # Committed by itself (a REST submission): a row of the cluster read a moment ago will do,
        # and so will the submitter's account, QOS and owner check (`recent`). Refused with a row
        # that another process has since changed or deleted (the topology check, or the INSERT's
        # foreign key), or with a kept answer, or when a kept cap changed, the submission is
        # tried once more with everything read afresh.
        target = cluster_for_spec(spec=spec, recent=True)
        recent_reads.start()
        try:
            return _submit(
                user=user, spec=spec, target=target, fresh=True, idempotency=idempotency, kept=True
            )
        except _StaleCaps:
            pass
        except (SpecError, IntegrityError, QueuedCapExceeded):
            if (
                not recent_reads.used()
                and Cluster.objects.filter(pk=target.pk, updated_at=target.updated_at).exists()
            ):
                raise
        forget_recent_clusters()
        recent_reads.forget()
        target = cluster_for_spec(spec=spec)
        return _submit(user=user, spec=spec, target=target, fresh=True, idempotency=idempotency)
    target = cluster or cluster_for_spec(spec=spec)
    # A cluster looked up here is current; one handed in may be an old instance.
    return _submit(user=user, spec=spec, target=target, fresh=cluster is None, idempotency=idempotency)


def _submit(
    *,
    user: AbstractBaseUser,
    spec: Any,
    target: Cluster,
    fresh: bool,
    idempotency: tuple[str, str] | None,
    kept: bool = False,
) -> Job:
    """Queue the job `spec` on `target`; `kept`: the submitter's account, QOS and owner check may
    be answers this process read a moment ago (`recent`)."""
    fields = snap.prepare_submission(cluster=target, data=spec, username=user.get_username(), fresh=fresh)
    if idempotency is not None:
        fields["idempotency_key"], fields["idempotency_digest"] = idempotency
    _check_owner(user, target, recent=kept)
    fields["account"] = accounts.account_of(user, fields["spec"].get("account"), recent=kept)
    fields["qos"] = _qos(target, fields, user, recent=kept)
    limit = accounts.priority_limit(user, fields["account"], fields["priority"])
    if fields["priority"] > limit:
        whose = f"account {fields['account'].name}" if fields["account"] else "your role"
        raise SpecError([("priority", f"{fields['priority']} is over the limit of {limit} for {whose}")])
    job = Job(cluster=target, owner=user, **fields)
    # The cluster, owner, account and QOS are rows in hand; re-checking that they exist costs queries.
    # Nor are its constraints checked here: the database's are (the only one names the owner).
    job.full_clean(
        exclude=["cluster", "owner", "account", "qos"], validate_unique=False, validate_constraints=False
    )
    with transaction.atomic():
        # This block is the INSERT's savepoint already; the caps are checked after it (see there).
        # On Postgres the INSERT goes with the caps' lock and count, one round trip.
        insert = lifecycle.submit_statement(job)
        if insert is None:
            lifecycle.submit(job, savepoint=False)
        _within_queued_caps(user, [job], kept=kept, insert=insert)
        return job


def _check_owner(user: AbstractBaseUser, cluster: Cluster, *, recent: bool = False) -> None:
    """SpecError naming `owner` when the cluster's executor cannot run the user's ranks as their
    Unix account (e.g. a Slurm cluster that runs each job as its owner and has no such account).
    `recent`: an answer this process read a moment ago will do (`recent.py`)."""

    def refusal() -> str:
        why = owner_refusal(cluster.pk, user.pk, user.get_username())
        if why:
            raise SpecError([("owner", why)])
        return why

    if recent:
        recent_reads.read(("owner", cluster.pk, user.pk), refusal)
    else:
        refusal()


def _qos(cluster: Cluster, fields: dict[str, Any], user: AbstractBaseUser, *, recent: bool = False):
    """The QOS of a job about to be queued (named in its spec, else its account's default),
    refusing one it or its owner may not use or whose per-job limits it is over (SpecError).
    `recent`: which QOS they may use may be an answer this process read a moment ago."""
    qos = accounts.qos_for(
        cluster=cluster, account=fields["account"], name=fields["spec"].get("qos"), user=user, recent=recent
    )
    accounts.check_qos_job(
        qos,
        gpus=fields["gpus"],
        runtime_s=fields["estimated_runtime_s"],
        time_limit_min=fields.get("time_limit_min"),
    )
    return qos


def job_submit_many(*, user: AbstractBaseUser, specs: list[Any], cluster: Cluster | None = None) -> list[Job]:
    """Validate every job spec of a bulk submission and queue them all, or none: SpecError names
    each bad field as `[i].field` (i: the spec's place in the list); QueuedCapExceeded when the
    list would take the user's waiting jobs past a cap. A cycle follows on commit on each cluster
    the jobs went to."""
    default = accounts.account_of(user)
    limits: dict[int | None, int] = {}
    errors: list[tuple[str, str]] = []
    rows: list[Job] = []
    clusters: dict[str, Cluster] = {}
    named: dict[str, Any] = {}
    for i, spec in enumerate(specs):
        try:
            if cluster is not None:
                target = cluster
            else:
                cluster_name = spec.get("cluster") if isinstance(spec, dict) else None
                target = clusters.get(str(cluster_name)) or cluster_for_spec(spec=spec)
                clusters[target.name] = target
            fields = snap.prepare_submission(cluster=target, data=spec, username=user.get_username())
            account_name = fields["spec"].get("account")
            if account_name is not None and account_name not in named:
                named[account_name] = accounts.account_of(user, account_name)
            fields["account"] = default if account_name is None else named[account_name]
            fields["qos"] = _qos(target, fields, user)
            _check_owner(user, target)
        except SpecError as exc:
            errors.extend((f"[{i}].{path}" if path else f"[{i}]", message) for path, message in exc.errors)
            continue
        account = fields["account"]
        key = account.pk if account else None
        if key not in limits or fields["priority"] > limits[key]:
            limits[key] = accounts.priority_limit(user, account, fields["priority"])
        if fields["priority"] > limits[key]:
            whose = f"account {account.name}" if account else "your role"
            errors.append(
                (f"[{i}].priority", f"{fields['priority']} is over the limit of {limits[key]} for {whose}")
            )
            continue
        job = Job(cluster=target, owner=user, **fields)
        job.full_clean(exclude=["cluster", "owner", "account", "qos"], validate_unique=False)
        rows.append(job)
    if errors:
        raise SpecError(errors)
    with transaction.atomic():
        jobs = lifecycle.submit_many(rows)
        _within_queued_caps(user, jobs)
        return jobs


def _locked(job: Job) -> Job:
    return Job.objects.select_for_update().get(pk=job.pk)


def job_cancel(*, job: Job, user: AbstractBaseUser | None = None) -> Job:
    """Cancel a queued, placing, running or preempted job and free its GPUs."""
    with transaction.atomic():
        job = _locked(job)
        if job.status in FINISHED_STATUSES:
            raise JobStateError(job, "cancel", ("queued", "preempted", "placing", "running"))
        who = f" by {user.get_username()}" if user is not None else ""
        return lifecycle.finish(job=job, status=JobStatus.CANCELLED, reason=f"cancelled{who}")


def job_hold(*, job: Job, user: AbstractBaseUser) -> Job:
    """Hold a waiting job: it stays in the queue (counted against the caps on waiting jobs) but no
    cycle places it until it is released. Holding a held job changes nothing."""
    with transaction.atomic():
        job = _locked(job)
        if job.status not in WAITING_STATUSES:
            raise JobStateError(job, "hold", ("queued", "preempted"))
        if not job.held:
            job.held = True
            job.pending_reason = f"held by {user.get_username()}: it waits until released"
            job.save(update_fields=["held", "pending_reason"])
        return job


def job_release(*, job: Job, user: AbstractBaseUser) -> Job:
    """Release a held job: the next cycle may place it again (one is requested on commit)."""
    with transaction.atomic():
        job = _locked(job)
        if not job.held:
            raise JobStateError(job, "release", ("held",))
        job.held = False
        job.pending_reason = f"released by {user.get_username()}"
        job.save(update_fields=["held", "pending_reason"])
        queue_cycle(job.cluster_id)
        return job


def job_requeue(*, job: Job, user: AbstractBaseUser) -> Job:
    """Send a placing or running job back to the queue (its ranks are stopped; it keeps its
    submission time). Counts as a requeue in `Job.requeues`, as Slurm's `scontrol requeue` does."""
    with transaction.atomic():
        job = _locked(job)
        if job.status not in ACTIVE_STATUSES:
            raise JobStateError(job, "requeue", ("placing", "running"))
        lifecycle.requeue(job_id=job.pk, why=f"by {user.get_username()}", now=timezone.now())
        job.refresh_from_db()
        return job


def job_set_priority(*, job: Job, user: AbstractBaseUser, priority: int) -> Job:
    """Change an unfinished job's requested priority, within the highest `user` may give a job
    of its account (`accounts.priority_limit`; SpecError on `priority` over it)."""
    with transaction.atomic():
        job = _locked(job)
        if job.status in FINISHED_STATUSES:
            raise JobStateError(job, "change the priority of", ("queued", "preempted", "placing", "running"))
        limit = accounts.priority_limit(user, job.account, priority)
        if priority > limit:
            whose = f"account {job.account.name}" if job.account_id else "your role"
            raise SpecError([("priority", f"{priority} is over the limit of {limit} for {whose}")])
        job.priority = priority
        job.save(update_fields=["priority"])
        if job.status in WAITING_STATUSES:
            queue_cycle(job.cluster_id)
        return job


def job_start(*, job: Job) -> Job:
    """The launcher started a placed job: placing -> running (a repeated start is a no-op)."""
    with transaction.atomic():
        job = _locked(job)
        if job.status == JobStatus.RUNNING:
            return job
        if not lifecycle.start(job=job):
            raise JobStateError(job, "start", ("placing",))
        return job


def job_complete(*, job: Job) -> Job:
    """The job finished: placing/running -> completed, GPUs released, a cycle queued."""
    with transaction.atomic():
        job = _locked(job)
        if job.status not in ACTIVE_STATUSES:
            raise JobStateError(job, "complete", ("placing", "running"))
        return lifecycle.finish(job=job, status=JobStatus.COMPLETED)


def job_fail(*, job: Job, reason: str = "") -> Job:
    """The job failed: placing/running -> failed, GPUs released, a cycle queued."""
    with transaction.atomic():
        job = _locked(job)
        if job.status not in ACTIVE_STATUSES:
            raise JobStateError(job, "fail", ("placing", "running"))
        return lifecycle.finish(
            job=job, status=JobStatus.FAILED, reason=reason or "reported failed by the launcher"
        )


def job_preempt(*, job: Job, reason: str = "") -> Job:
    """Take a placing/running job's GPUs away and send it back to the queue (status preempted,
    which the cycle treats as queued, keeping its original submission time)."""
    with transaction.atomic():
        job = _locked(job)
        if job.status not in ACTIVE_STATUSES:
            raise JobStateError(job, "preempt", ("placing", "running"))
        lifecycle.requeue(
            job_id=job.pk, why=reason or "preempted by an operator", now=timezone.now(), preempted=True
        )
        job.refresh_from_db()
        return job


def launcher_token_create(*, cluster: Cluster) -> tuple[LauncherToken, str]:
    """A new launcher token for `cluster`: the row (only the key's hash is stored) and the key,
    which is shown once (`Authorization: Launcher <key>`)."""
    key = new_launcher_key()
    token = LauncherToken.objects.create(cluster=cluster, key_hash=node_key_hash(key), prefix=key[:10])
    return token, key
