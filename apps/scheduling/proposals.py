"""Migration proposals: find running jobs that a better placement would speed up, and apply or
reject what an operator decides."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from apps.placement.planner import migration_option
from apps.topology.models import Cluster

from . import executor, lifecycle
from . import snapshot as snap
from .choices import ACTIVE_STATUSES, JobStatus, ProposalStatus
from .cycle import queue_cycle
from .models import Job, MigrationProposal

MIN_GAIN = 0.05  # fraction of step time a move must save to be proposed


class ProposalStateError(Exception):
    """Applying or rejecting a proposal that is no longer open."""

    def __init__(self, proposal: MigrationProposal, action: str):
        self.proposal = proposal
        super().__init__(f"cannot {action} proposal {proposal.pk}: it is {proposal.status}, not proposed")


def migrations_propose(*, cluster: Cluster) -> list[MigrationProposal]:
    """For each running job, price the topo placement on the free GPUs plus its own; record a
    proposal when it predicts a step time more than 5% shorter and the job has no open one.

    Open proposals of jobs that no longer hold GPUs are marked stale. Returns the new proposals.
    A cluster whose executor cannot move a running job (Slurm) gets none.
    """
    if not executor.can_migrate(cluster.pk):
        return []
    with transaction.atomic():
        locked = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        MigrationProposal.objects.filter(job__cluster=locked, status=ProposalStatus.PROPOSED).exclude(
            job__status__in=ACTIVE_STATUSES
        ).update(status=ProposalStatus.STALE, reason="the job no longer holds GPUs")
        snapshot = snap.cluster_snapshot(cluster=locked)
        running = [a for a in snapshot.active if a.running and a.gids]
        if not running:
            return []
        open_for = set(
            MigrationProposal.objects.filter(job__cluster=locked, status=ProposalStatus.PROPOSED).values_list(
                "job_id", flat=True
            )
        )
        jobs = Job.objects.in_bulk([a.job_id for a in running if a.job_id not in open_for])
        created = []
        for active in running:
            job = jobs.get(active.job_id)
            if job is None:
                continue
            option = migration_option(snapshot, active, snap.job_spec(job), policy="topo", min_gain=MIN_GAIN)
            if option is not None:
                created.append(_record(snapshot, job, option, ""))
        return created


def _record(snapshot: snap.ClusterSnapshot, job: Job, option, evidence: str) -> MigrationProposal:
    reason = (
        f"the topo placement on GPUs free now predicts {option.new_step_ms:.1f} ms per step"
        f" instead of {option.old_step_ms:.1f} ms ({option.gain:.0%} faster)"
    )
    proposal = MigrationProposal(
        job=job,
        policy="topo",
        old_mapping=snap.mapping(snapshot.topology, option.old_gids),
        new_mapping=snap.mapping(snapshot.topology, option.new_gids),
        predicted_gain=option.gain,
        predicted_old_step_ms=option.old_step_ms,
        predicted_new_step_ms=option.new_step_ms,
        reason=f"{evidence}; {reason}" if evidence else reason,
    )
    proposal.full_clean()
    proposal.save()
    return proposal


def migrations_propose_measured(
    *, cluster: Cluster, evidence: dict[int, str]
) -> dict[int, MigrationProposal | None]:
    """Proposals for running jobs that measurements show in trouble (`evidence`: job id -> how):
    each job's open proposal, with the evidence added to its reason, or a new one when the topo
    placement on the free GPUs plus its own predicts any gain; None when no better placement
    exists. One snapshot for all of them."""
    out: dict[int, MigrationProposal | None] = {}
    with transaction.atomic():
        locked = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        for existing in MigrationProposal.objects.filter(job_id__in=evidence, status=ProposalStatus.PROPOSED):
            if "measured:" not in existing.reason:
                existing.reason = f"measured: {evidence[existing.job_id]}; {existing.reason}"
                existing.save(update_fields=["reason"])
            out[existing.job_id] = existing
        todo = [job_id for job_id in evidence if job_id not in out]
        if not todo:
            return out
        snapshot = snap.cluster_snapshot(cluster=locked)
        active = {a.job_id: a for a in snapshot.active if a.job_id in todo and a.gids}
        jobs = Job.objects.in_bulk(list(active))
        for job_id in todo:
            a, job = active.get(job_id), jobs.get(job_id)
            option = None
            if a is not None and job is not None:
                option = migration_option(snapshot, a, snap.job_spec(job), policy="topo", min_gain=0.0)
            out[job_id] = (
                None if option is None else _record(snapshot, job, option, f"measured: {evidence[job_id]}")
            )
        return out


def _stale(proposal: MigrationProposal, reason: str) -> MigrationProposal:
    proposal.status = ProposalStatus.STALE
    proposal.reason = f"{proposal.reason}; stale: {reason}" if proposal.reason else f"stale: {reason}"
    proposal.save(update_fields=["status", "reason"])
    return proposal


def migration_apply(
    *, proposal: MigrationProposal, user: AbstractBaseUser | None = None
) -> MigrationProposal:
    """Start a new generation of the job on the proposal's mapping if its target GPUs are still
    free (or the job's own) and the job still sits where the proposal found it; otherwise mark
    the proposal stale. Returns the proposal (status applied or stale).

    When the job's ranks run under agents it becomes `migrating`: its old GPUs stay allocated
    until every old rank exited, then the new generation starts (see `agents`)."""
    with transaction.atomic():
        cluster_id = Job.objects.filter(pk=proposal.job_id).values_list("cluster_id", flat=True).first()
        locked = Cluster.objects.select_for_update(no_key=True).get(pk=cluster_id)
        proposal = MigrationProposal.objects.select_for_update().get(pk=proposal.pk)
        if proposal.status != ProposalStatus.PROPOSED:
            raise ProposalStateError(proposal, "apply")
        job = Job.objects.select_for_update().get(pk=proposal.job_id)
        if job.status not in (JobStatus.PLACING, JobStatus.RUNNING):
            return _stale(proposal, f"the job is {job.status}")
        snapshot = snap.cluster_snapshot(cluster=locked)
        active = next((a for a in snapshot.active if a.job_id == job.pk), None)
        topo = snapshot.topology
        if active is None or snap.mapping(topo, active.gids) != proposal.old_mapping:
            return _stale(proposal, "the job's placement changed since it was proposed")
        try:
            new_gids = snap.gids_of_mapping(topo, proposal.new_mapping)
        except KeyError as exc:
            return _stale(proposal, f"the topology changed: {exc}")
        free = snapshot.free.copy()
        free[list(active.gids)] = True
        taken = [snap.mapping(topo, [g])[0] for g in new_gids if not free[g]]
        if taken:
            names = ", ".join(f"{t['node']} GPU {t['gpu']}" for t in taken[:4])
            return _stale(proposal, f"target GPUs are taken now ({names})")
        now = timezone.now()
        fields = snap.priced_fields(
            snapshot=snapshot,
            spec=snap.job_spec(job),
            gids=new_gids,
            policy=proposal.policy,
            own_flows=active.flows,
        )
        lifecycle.migrate(job=job, snapshot=snapshot, new_gids=new_gids, fields=fields)
        proposal.status = ProposalStatus.APPLIED
        proposal.applied_at = now
        proposal.decided_by = user
        proposal.save(update_fields=["status", "applied_at", "decided_by"])
        # The GPUs it left may let a waiting job start.
        queue_cycle(locked.pk)
        return proposal


def migration_reject(
    *, proposal: MigrationProposal, user: AbstractBaseUser | None = None
) -> MigrationProposal:
    """An operator declines an open proposal."""
    with transaction.atomic():
        proposal = MigrationProposal.objects.select_for_update().get(pk=proposal.pk)
        if proposal.status != ProposalStatus.PROPOSED:
            raise ProposalStateError(proposal, "reject")
        proposal.status = ProposalStatus.REJECTED
        proposal.decided_by = user
        proposal.save(update_fields=["status", "decided_by"])
        return proposal


__all__ = [
    "MIN_GAIN",
    "ProposalStateError",
    "migration_apply",
    "migrations_propose_measured",
    "migration_reject",
    "migrations_propose",
]
