"""The metrics API: GPU values with filters and `since`, node states, a job's measures, and the
job report (bounded fields, owner only, running jobs only) feeding MFU and comm share."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from apps.metrics.choices import MeasureSource
from apps.metrics.models import JobReport, JobSample
from apps.metrics.services import metrics_collect
from apps.scheduling.choices import JobStatus
from apps.scheduling.demo import load_demo_jobs
from apps.scheduling.models import Job
from apps.topology.models import Node

from .conftest import A100_MIG


@pytest.fixture
def measured(case44, exporter):
    """case-4-4 with its demo job; node-a serves the A100 scrape, node-b has no exporter."""
    base, behaviours = exporter
    behaviours.by_path["/a"] = ("text", A100_MIG.read_text())
    Node.objects.filter(name="node-a").update(dcgm_url=f"{base}/a")
    load_demo_jobs(start_all=True)
    metrics_collect(cluster=case44)
    return Job.objects.get(cluster=case44)


def client_for(username: str, staff: bool = False) -> APIClient:
    user, _ = get_user_model().objects.get_or_create(username=username, defaults={"is_staff": staff})
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_gpu_metrics_list_filters_by_node_and_keeps_mig_apart(measured):
    body = client_for("alice").get("/api/v1/metrics/gpus/", {"node": "node-a"}).json()
    assert body["count"] == 2
    rows = {r["instance"]: r for r in body["results"]}
    assert rows[""]["tensor_active"] == pytest.approx(0.929, abs=5e-4)
    assert rows[""]["gpu_util"] is None
    assert rows["13"]["node"] == "node-a" and rows["13"]["index"] == 0


def test_gpu_metrics_since_returns_samples_and_a_bad_since_names_the_field(measured):
    client = client_for("alice")
    since = (timezone.now() - timedelta(minutes=5)).isoformat()
    assert client.get("/api/v1/metrics/gpus/", {"since": since}).json()["count"] == 2
    naive = (timezone.now() - timedelta(minutes=5)).replace(tzinfo=None).isoformat()  # UTC, no offset
    assert client.get("/api/v1/metrics/gpus/", {"since": naive}).json()["count"] == 2
    assert client.get("/api/v1/metrics/gpus/", {"since": since, "resolution": "minute"}).status_code == 200
    bad = client.get("/api/v1/metrics/gpus/", {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()
    bad = client.get("/api/v1/metrics/gpus/", {"since": since, "resolution": "hourly"})
    assert bad.status_code == 400 and "resolution" in bad.json()


def test_node_states_filter_by_state(measured):
    body = client_for("alice").get("/api/v1/metrics/nodes/", {"state": "error"}).json()
    assert [r["node"] for r in body["results"]] == ["node-b"]
    assert body["results"][0]["last_error"] == "no dcgm_url for this node"


def test_metrics_need_authentication(measured):
    assert APIClient().get("/api/v1/metrics/nodes/").status_code in (401, 403)
    assert APIClient().get(f"/api/v1/metrics/jobs/{measured.pk}/").status_code in (401, 403)


def test_a_report_sets_mfu_and_comm_share_from_the_job_itself(measured, case44):
    alice = client_for("alice")
    url = f"/api/v1/jobs/{measured.pk}/report/"
    response = alice.post(url, {"step_ms": 250.0, "comm_ms": 140.0, "tokens_per_step": 65536}, format="json")
    assert response.status_code == 201, response.json()
    metrics_collect(cluster=case44)
    latest = JobSample.objects.filter(job=measured).latest("at")
    assert latest.mfu_source == MeasureSource.REPORT and latest.comm_source == MeasureSource.REPORT
    assert latest.mfu == pytest.approx(2.6e14 / (0.25 * 16 * 312e12))
    assert latest.comm_share == pytest.approx(140 / 250)
    body = alice.get(f"/api/v1/metrics/jobs/{measured.pk}/").json()
    assert body["latest"]["mfu_source"] == "report" and body["report"]["step_ms"] == 250.0
    assert body["latest"]["predicted_step_ms"] == pytest.approx(209.09, abs=0.01)
    assert body["aggregate"]["samples"] == 2  # the pass before the report and the one after


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"step_ms": -1}, "step_ms"),
        ({"step_ms": "fast"}, "step_ms"),
        ({}, "step_ms"),
        ({"step_ms": 1e30}, "step_ms"),
        ({"step_ms": 100, "comm_ms": 150}, "comm_ms"),
        ({"step_ms": 100, "tokens_per_step": -5}, "tokens_per_step"),
    ],
)
def test_a_bad_report_is_a_400_naming_the_field_and_stores_nothing(measured, body, field):
    response = client_for("alice").post(f"/api/v1/jobs/{measured.pk}/report/", body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert not JobReport.objects.exists()


def test_only_the_owner_reports_and_only_while_running(measured):
    url = f"/api/v1/jobs/{measured.pk}/report/"
    assert client_for("bob").post(url, {"step_ms": 100}, format="json").status_code == 404
    Job.objects.filter(pk=measured.pk).update(status=JobStatus.COMPLETED)
    response = client_for("alice").post(url, {"step_ms": 100}, format="json")
    assert response.status_code == 409 and response.json()["status"] == "completed"


def _role_client(username: str, role: str) -> APIClient:
    from apps.api.roles import role_grant

    user, _ = get_user_model().objects.get_or_create(username=username)
    role_grant(user=user, role=role)
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(pk=user.pk))
    return client


def test_a_viewer_cannot_forge_another_users_report(measured):
    url = f"/api/v1/jobs/{measured.pk}/report/"
    response = _role_client("carol", "viewer").post(
        url, {"step_ms": 1.0, "flops_per_step": 1e18}, format="json"
    )
    assert response.status_code == 403
    assert "only the owner" in response.json()["detail"]
    assert not JobReport.objects.exists()


def test_an_operator_report_in_the_owners_place_is_audited(measured):
    from django.contrib.admin.models import LogEntry

    url = f"/api/v1/jobs/{measured.pk}/report/"
    response = _role_client("olga", "operator").post(url, {"step_ms": 300.0}, format="json")
    assert response.status_code == 201
    [entry] = LogEntry.objects.all()
    assert entry.user.username == "olga" and entry.object_id == str(measured.pk)
    assert "in the owner's place" in entry.change_message and "step_ms=300" in entry.change_message


def test_the_node_running_the_job_may_report_and_other_nodes_may_not(measured):
    from apps.executors.agents.services import node_token_create
    from apps.scheduling.models import Allocation

    url = f"/api/v1/jobs/{measured.pk}/report/"
    mine, other = sorted(
        set(Allocation.objects.filter(job=measured, live=True).values_list("node_name", flat=True))
    )[:2]
    # The job keeps no rank on the other node.
    Allocation.objects.filter(job=measured, node_name=other).update(live=False)
    _, key = node_token_create(node=Node.objects.get(cluster=measured.cluster, name=mine))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    assert client.post(url, {"step_ms": 200.0}, format="json").status_code == 201
    _, other_key = node_token_create(node=Node.objects.get(cluster=measured.cluster, name=other))
    client.credentials(HTTP_AUTHORIZATION=f"Node {other_key}")
    assert client.post(url, {"step_ms": 1.0}, format="json").status_code == 404
    assert list(JobReport.objects.values_list("step_ms", flat=True)) == [200.0]
