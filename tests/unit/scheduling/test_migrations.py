"""Migration proposals: found for badly placed running jobs, applied atomically or marked stale."""

from __future__ import annotations

import pytest

from apps.scheduling import selectors, services
from apps.scheduling.choices import JobStatus, ProposalStatus
from apps.scheduling.models import MigrationProposal
from apps.scheduling.proposals import ProposalStateError

from .conftest import small_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def naive_job(case44, alice, committed):
    """An 8-rank DP job placed by `naive`: ranks 0-3 on node-a, 4-7 on node-b, across the NIC."""
    job = committed(services.job_submit, user=alice, spec=small_spec("spread", 8, policy="naive"))
    committed(services.job_start, job=job)
    job.refresh_from_db()
    assert {r["node"] for r in selectors.job_ranks(job=job)} == {"node-a", "node-b"}
    return job


def test_a_badly_placed_running_job_gets_a_proposal(case44, naive_job):
    [proposal] = services.migrations_propose(cluster=case44)
    assert proposal.job == naive_job and proposal.status == ProposalStatus.PROPOSED
    assert proposal.predicted_gain > 0.05
    assert proposal.predicted_new_step_ms < proposal.predicted_old_step_ms
    assert len({e["node"] for e in proposal.new_mapping}) == 1
    assert proposal.old_mapping == [
        {"rank": r["rank"], "node": r["node"], "gpu": r["gpu"]} for r in selectors.job_ranks(job=naive_job)
    ]


def test_no_second_open_proposal_for_the_same_job(case44, naive_job):
    services.migrations_propose(cluster=case44)
    assert services.migrations_propose(cluster=case44) == []
    assert MigrationProposal.objects.count() == 1


def test_a_well_placed_job_gets_no_proposal(case44, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("tight", 8))
    committed(services.job_start, job=job)
    assert services.migrations_propose(cluster=case44) == []


def test_applying_moves_the_allocations_and_reprices_the_job(case44, naive_job, staff, committed):
    [proposal] = services.migrations_propose(cluster=case44)
    result = committed(services.migration_apply, proposal=proposal, user=staff)
    assert result.status == ProposalStatus.APPLIED and result.decided_by == staff
    naive_job.refresh_from_db()
    now = [
        {"rank": r["rank"], "node": r["node"], "gpu": r["gpu"]} for r in selectors.job_ranks(job=naive_job)
    ]
    assert now == proposal.new_mapping
    assert naive_job.predicted_step_ms == pytest.approx(proposal.predicted_new_step_ms)
    assert naive_job.status == JobStatus.RUNNING


def test_a_proposal_whose_target_gpus_were_taken_turns_stale(case44, naive_job, bob, staff, committed):
    [proposal] = services.migrations_propose(cluster=case44)
    target_node = proposal.new_mapping[0]["node"]
    # first_fit takes the lowest free GPUs: the other half of both nodes, the proposal's target among them.
    other = committed(services.job_submit, user=bob, spec=small_spec("filler", 8, policy="first_fit"))
    assert any(r["node"] == target_node for r in selectors.job_ranks(job=other))
    result = services.migration_apply(proposal=proposal, user=staff)
    assert result.status == ProposalStatus.STALE
    assert "target GPUs are taken now" in result.reason
    before = [
        {"rank": r["rank"], "node": r["node"], "gpu": r["gpu"]} for r in selectors.job_ranks(job=naive_job)
    ]
    assert before == proposal.old_mapping


def test_a_proposal_for_a_finished_job_turns_stale(case44, naive_job, staff):
    [proposal] = services.migrations_propose(cluster=case44)
    services.job_complete(job=naive_job)
    assert services.migration_apply(proposal=proposal, user=staff).status == ProposalStatus.STALE


def test_a_decided_proposal_cannot_be_applied_again(case44, naive_job, staff):
    [proposal] = services.migrations_propose(cluster=case44)
    services.migration_reject(proposal=proposal, user=staff)
    with pytest.raises(ProposalStateError, match="it is rejected"):
        services.migration_apply(proposal=proposal, user=staff)
