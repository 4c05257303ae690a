"""One user's job must never stop a cluster's scheduling (SQLite, eager cycles).

A poisoned job is either one whose stored spec breaks the ranges (stored before they existed:
runtime 1e18 s, count 10**400, bytes 1.7e308) or one whose evaluation raises. The cycle marks it
failed with the reason and places the others; every stored prediction stays finite; job lists answer.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.placement import planner
from apps.scheduling import services
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.scheduling.models import Job, SchedulingCycle
from tests.unit.hostile_inputs import hostile_job_documents, within_budget

from .conftest import small_spec

pytestmark = pytest.mark.django_db

POISONS = {
    "runtime-1e18": {"estimated_runtime_s": 1e18},
    "count-400-digits": {
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8, "count": 10**400}]
    },
    "bytes-1.7e308": {"comm": [{"group": "dp", "collective": "volume", "bytes": 1.7e308}]},
    "name-with-a-command": {"name": "x;reboot"},
}


def stored_as_before(cluster, owner, job_name: str, **poison) -> Job:
    """A job row written as submissions were before the ranges existed (no validation)."""
    spec = {**small_spec(job_name, 4, priority=10), **poison}
    name = spec["name"]
    return Job.objects.create(
        name=name, cluster=cluster, owner=owner, spec=spec, priority=10, gpus=4, status=JobStatus.QUEUED
    )


def assert_finite_predictions() -> None:
    for row in Job.objects.values("predicted_comm_ms", "predicted_step_ms", "predicted_mfu"):
        assert all(v is None or math.isfinite(v) for v in row.values()), row


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_stored_poisoned_job_fails_alone_and_the_others_are_placed(case44, alice, alice_api, poison):
    bad = stored_as_before(case44, alice, f"bad-{poison}", **POISONS[poison])
    good = [services.job_submit(user=alice, spec=small_spec(f"good-{i}", 4)) for i in range(2)]
    record = services.schedule_cluster(cluster=case44)
    assert record.status == CycleStatus.COMPLETED
    bad.refresh_from_db()
    assert bad.status == JobStatus.FAILED
    assert bad.pending_reason.startswith("failed to schedule: its stored spec is invalid")
    assert record.failed_jobs == {str(bad.pk): bad.pending_reason.removeprefix("failed to schedule: ")}
    assert bad.finished_at is not None
    assert {j.refresh_from_db() or j.status for j in good} == {JobStatus.PLACING}
    assert_finite_predictions()
    assert alice_api.get("/api/v1/jobs/").status_code == 200
    # The next cycle no longer sees it.
    assert str(bad.pk) not in services.schedule_cluster(cluster=case44).failed_jobs


def test_a_job_whose_evaluation_raises_fails_alone(case44, alice, committed, monkeypatch):
    real_place = planner.place

    def exploding(topo, free, load, spec, policy="topo"):
        if spec.name == "explodes":
            raise OverflowError("cannot convert float infinity to integer")
        return real_place(topo, free, load, spec, policy=policy)

    monkeypatch.setattr(planner, "place", exploding)
    bad = committed(services.job_submit, user=alice, spec=small_spec("explodes", 4, priority=5))
    good = [committed(services.job_submit, user=alice, spec=small_spec(f"good-{i}", 4)) for i in range(3)]
    bad.refresh_from_db()
    assert bad.status == JobStatus.FAILED
    assert bad.pending_reason == "failed to schedule: OverflowError: cannot convert float infinity to integer"
    for job in good:
        job.refresh_from_db()
        assert job.status == JobStatus.PLACING
    cycles = SchedulingCycle.objects.filter(cluster=case44)
    assert cycles.filter(status=CycleStatus.FAILED).count() == 0
    assert cycles.filter(failed_jobs__has_key=str(bad.pk)).count() == 1
    assert_finite_predictions()


def test_a_job_failing_mid_walk_leaves_the_free_gpus_to_the_next_jobs(case44, alice, monkeypatch):
    real_place = planner.place
    calls = []

    def exploding(topo, free, load, spec, policy="topo"):
        calls.append(spec.name)
        if spec.name == "middle":
            raise ValueError("boom")
        return real_place(topo, free, load, spec, policy=policy)

    monkeypatch.setattr(planner, "place", exploding)
    for name, prio in (("first", 3), ("middle", 2), ("last", 1)):
        services.job_submit(user=alice, spec=small_spec(name, 8, priority=prio))
    record = services.schedule_cluster(cluster=case44)
    status = dict(Job.objects.values_list("name", "status"))
    assert status == {"first": JobStatus.PLACING, "middle": JobStatus.FAILED, "last": JobStatus.PLACING}
    assert sorted(record.placed_jobs) == sorted(
        Job.objects.exclude(name="middle").values_list("id", flat=True)
    )
    assert calls.count("middle") == 1


# The same values over REST: refused at the door, naming the field.


@pytest.mark.parametrize(
    ("changes", "field", "status"),
    [
        ({"estimated_runtime_s": 1e18}, "estimated_runtime_s", 400),
        ({"comm": [{"group": "dp", "collective": "volume", "bytes": 1.7e308}]}, "comm[0].bytes", 400),
        ({"gpus": 10**9}, "gpus", 400),
        (
            {"comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8, "count": 10**400}]},
            "comm[0].count",
            400,
        ),
        ({"priority": 2**31}, "priority", 400),
        ({"name": "a;reboot"}, "name", 400),
    ],
)
def test_out_of_range_submissions_are_400_naming_the_field(case44, alice_api, changes, field, status):
    response = alice_api.post("/api/v1/jobs/", {**small_spec("x", 4), **changes}, format="json")
    assert response.status_code == status
    assert field in response.json(), response.json()
    assert Job.objects.count() == 0


def test_flops_beyond_the_gpu_peak_is_400_naming_both_fields(case44, alice_api):
    # 1e17 FLOPs in 100 ms on 4 GPUs is 250 PFLOPS per GPU; an A100 peaks at 312 TFLOPS.
    spec = small_spec("too-fast", 4, model={"flops_per_step": 1e17})
    body = alice_api.post("/api/v1/jobs/", spec, format="json").json()
    assert set(body) == {"model.flops_per_step", "step.compute_ms"}
    assert "312 TFLOPS" in body["step.compute_ms"][0]
    preview = alice_api.post("/api/v1/placements/preview/", spec, format="json")
    assert preview.status_code == 400 and "model.flops_per_step" in preview.json()


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        ('{"a": ' * 2000 + "1" + "}" * 2000, "application/json", "nesting"),
        ('{"gpus": ' + "9" * 5000 + "}", "application/json", "digits"),
        ('{"gpus": NaN}', "application/json", "NaN"),
        (
            "a: &a [1,2,3,4,5,6,7,8,9]\n"
            + "".join(f"b{i}: &b{i} [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n" for i in range(1)),
            "application/yaml",
            "",
        ),
        (
            "\n".join(f"l{d}: &l{d} [" + ", ".join([f"*l{d - 1}"] * 9) + "]" for d in range(1, 9)).replace(
                "*l0", "1"
            ),
            "application/yaml",
            "alias",
        ),
        ("name: x\x00", "application/yaml", "NUL"),
    ],
    ids=["deep-json", "5000-digits", "nan", "one-alias-level", "alias-bomb", "nul"],
)
@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/placements/preview/"])
def test_hostile_job_bodies_are_400_not_500(case44, alice_api, body, content_type, fragment, path):
    response = alice_api.generic("POST", path, body.encode(), content_type)
    assert response.status_code == 400, response.content[:300]
    assert fragment in response.json().get("detail", str(response.json()))
    assert len(response.content) < 2000
    assert Job.objects.count() == 0


def test_job_bodies_over_64_kib_are_413_naming_the_limit(case44, alice_api):
    spec = small_spec("big", 4, padding="x" * 70_000)
    response = alice_api.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 413
    assert response.json()["limit_bytes"] == 65536
    assert "65536 bytes" in response.json()["detail"]


def test_deep_json_on_a_settings_endpoint_is_400_not_500(case44, staff_api):
    body = ('{"description": ' * 20_000).encode()  # 340 kB: past the 256 KiB limit
    assert (
        staff_api.generic("PATCH", f"/api/v1/clusters/{case44.pk}/", body, "application/json").status_code
        == 413
    )
    body = ('{"description": ' * 10_000).encode()
    response = staff_api.generic("PATCH", f"/api/v1/clusters/{case44.pk}/", body, "application/json")
    assert response.status_code == 400 and "nesting" in response.json()["detail"]
    case44.refresh_from_db()
    assert case44.description == ""


def test_a_malformed_content_length_is_400(case44, alice_api):
    response = alice_api.generic("POST", "/api/v1/jobs/", b"{}", "application/json", CONTENT_LENGTH="12abc")
    assert response.status_code == 400 and "Content-Length" in response.json()["detail"]


def test_predictions_stored_infinite_before_the_ranges_are_cleared(case44, alice, alice_api):
    import importlib
    import types

    from django.apps import apps as live_apps
    from django.db import connection

    migration = importlib.import_module("apps.scheduling.migrations.0006_finite_predictions")
    job = stored_as_before(case44, alice, "inf")
    Job.objects.filter(pk=job.pk).update(
        predicted_step_ms=math.inf, predicted_comm_ms=-math.inf, predicted_mfu=0.5
    )
    # The migration reads only the editor's connection.
    migration.clear_non_finite(live_apps, types.SimpleNamespace(connection=connection))
    job.refresh_from_db()
    assert (job.predicted_step_ms, job.predicted_comm_ms, job.predicted_mfu) == (None, None, 0.5)
    assert alice_api.get("/api/v1/jobs/").status_code == 200


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    document=hostile_job_documents(), content_type=st.sampled_from(["application/json", "application/yaml"])
)
def test_hostile_job_documents_are_refused_and_store_nothing(case44, alice_api, document, content_type):
    for path in ("/api/v1/jobs/", "/api/v1/placements/preview/"):
        response = within_budget(
            lambda p=path: alice_api.generic("POST", p, document, content_type),
            seconds=5.0,
            peak_bytes=64 * 2**20,
        )
        assert response.status_code in (400, 413), (response.status_code, response.content[:300])
        assert len(response.content) < 20_000
    assert Job.objects.count() == 0
