"""Migrations and cycles API: who sees proposals, who applies them, the cycle audit."""

from __future__ import annotations

import pytest

from apps.scheduling import services
from apps.scheduling.models import MigrationProposal

from .conftest import small_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def proposal(case44, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("spread", 8, policy="naive"))
    committed(services.job_start, job=job)
    [found] = services.migrations_propose(cluster=case44)
    return found


def test_owner_sees_the_proposal_of_their_job_and_others_do_not(proposal, alice_api, bob_api):
    mine = alice_api.get("/api/v1/migrations/").json()
    assert [p["id"] for p in mine["results"]] == [proposal.pk]
    assert mine["results"][0]["predicted_gain"] > 0.05
    assert bob_api.get("/api/v1/migrations/").json()["count"] == 0
    assert bob_api.get(f"/api/v1/migrations/{proposal.pk}/").status_code == 404


def test_only_staff_apply(proposal, alice_api, staff_api, committed):
    assert alice_api.post(f"/api/v1/migrations/{proposal.pk}/apply/").status_code == 403
    applied = committed(staff_api.post, f"/api/v1/migrations/{proposal.pk}/apply/")
    assert applied.status_code == 200 and applied.json()["status"] == "applied"
    assert applied.json()["decided_by"] == "operator"
    again = staff_api.post(f"/api/v1/migrations/{proposal.pk}/apply/")
    assert again.status_code == 409 and again.json()["status"] == "applied"


def test_stale_apply_is_a_409_with_the_reason(proposal, staff_api):
    services.job_complete(job=proposal.job)
    response = staff_api.post(f"/api/v1/migrations/{proposal.pk}/apply/")
    assert response.status_code == 409
    assert response.json()["status"] == "stale" and "the job is completed" in response.json()["reason"]


def test_staff_reject(proposal, staff_api):
    assert staff_api.post(f"/api/v1/migrations/{proposal.pk}/reject/").json()["status"] == "rejected"
    assert MigrationProposal.objects.get(pk=proposal.pk).status == "rejected"


def test_filter_proposals_by_status(proposal, staff_api):
    assert staff_api.get("/api/v1/migrations/", {"status": "proposed"}).json()["count"] == 1
    assert staff_api.get("/api/v1/migrations/", {"status": "applied"}).json()["count"] == 0


def test_cycle_audit_is_staff_only(proposal, alice_api, staff_api):
    assert alice_api.get("/api/v1/cycles/").status_code == 403
    cycles = staff_api.get("/api/v1/cycles/", {"cluster": "case-4-4"}).json()
    assert cycles["count"] >= 1 and cycles["results"][0]["status"] == "completed"
