"""Jobs API: bodies, errors, visibility, lifecycle permissions, filters, throttling, preview."""

from __future__ import annotations

import pytest
import yaml
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from apps.scheduling import services
from apps.scheduling.models import Allocation, Job

from .conftest import EXAMPLES, small_spec

pytestmark = pytest.mark.django_db


def launcher_client(cluster) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Launcher {services.launcher_token_create(cluster=cluster)[1]}")
    return client


@pytest.mark.parametrize("content_type", ["application/yaml", "text/yaml"])
def test_yaml_body_is_accepted(case44, alice_api, content_type):
    body = (EXAMPLES / "case-4-4-job.yaml").read_text()
    response = alice_api.post("/api/v1/jobs/", body, content_type=content_type)
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["comm"][0]["bytes"] == 1.2e9


def test_invalid_spec_is_a_400_naming_each_field_and_leaves_no_rows(case44, alice_api, job_spec):
    bad = job_spec(
        parallelism={"tp": 1, "pp": 2, "dp": 6}, comm=[{"group": "dp", "collective": "gossip", "bytes": 1}]
    )
    response = alice_api.post("/api/v1/jobs/", bad, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "parallelism": ["tp*pp*dp=12 but gpus=16"],
        "comm[0].collective": [
            "must be one of allreduce, allgather, reducescatter, alltoall, p2p, volume, got 'gossip'"
        ],
    }
    assert not Job.objects.exists()


def test_job_larger_than_the_cluster_is_a_400_on_gpus(case44, alice_api):
    response = alice_api.post("/api/v1/jobs/", small_spec("huge", 64), format="json")
    assert response.status_code == 400
    assert response.json() == {"gpus": ["needs 64 GPUs but cluster 'case-4-4' has 16"]}


def test_malformed_yaml_is_a_400(case44, alice_api):
    response = alice_api.post("/api/v1/jobs/", "name: [unclosed", content_type="application/yaml")
    assert response.status_code == 400
    assert "not valid YAML" in response.json()["detail"]


def test_anonymous_requests_are_refused(case44):
    assert APIClient().get("/api/v1/jobs/").status_code == 401


def test_users_list_only_their_own_jobs_and_staff_list_all(case44, alice, bob, alice_api, bob_api, staff_api):
    services.job_submit(user=alice, spec=small_spec("a1", 1))
    services.job_submit(user=bob, spec=small_spec("b1", 1))
    assert [j["name"] for j in alice_api.get("/api/v1/jobs/").json()["results"]] == ["a1"]
    assert [j["name"] for j in bob_api.get("/api/v1/jobs/").json()["results"]] == ["b1"]
    assert staff_api.get("/api/v1/jobs/").json()["count"] == 2


def test_list_filters_by_status_owner_and_cluster(case44, pod256, alice, bob, staff_api, committed):
    committed(services.job_submit, user=alice, spec=small_spec("placed", 16))
    committed(services.job_submit, user=bob, spec=small_spec("waits", 16))
    committed(services.job_submit, user=bob, spec=small_spec("elsewhere", 8, cluster="pod-256"))

    def names(**params):
        return sorted(j["name"] for j in staff_api.get("/api/v1/jobs/", params).json()["results"])

    assert names(status="queued") == ["waits"]
    assert names(status=["queued", "placing"]) == ["elsewhere", "placed", "waits"]
    assert names(owner="bob") == ["elsewhere", "waits"]
    assert names(cluster="pod-256") == ["elsewhere"]
    assert names(cluster=str(case44.pk), owner=str(alice.pk)) == ["placed"]


def test_status_filters_are_plain_conditions_not_a_distinct_over_every_row(case44, alice, staff_api):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    services.job_submit(user=alice, spec=small_spec("waits", 1))
    for url in ("/api/v1/jobs/?status=queued&status=running", "/api/v1/migrations/?status=proposed"):
        with CaptureQueriesContext(connection) as ctx:
            assert staff_api.get(url).status_code == 200
        assert not any("DISTINCT" in q["sql"] for q in ctx.captured_queries), url


def test_list_is_paginated(case44, alice, alice_api):
    for i in range(7):
        services.job_submit(user=alice, spec=small_spec(f"j{i}", 1))
    page = alice_api.get("/api/v1/jobs/", {"page_size": 3, "page": 2}).json()
    assert page["count"] == 7 and len(page["results"]) == 3 and page["next"] and page["previous"]


def test_list_query_count_does_not_grow_with_jobs(case44, alice, alice_api, django_assert_max_num_queries):
    for i in range(25):
        services.job_submit(user=alice, spec=small_spec(f"j{i}", 1))
    # Token, the user's and their groups' permissions (the role check), count, page.
    with django_assert_max_num_queries(6):
        assert alice_api.get("/api/v1/jobs/").json()["count"] == 25


def test_list_count_joins_no_table_and_counts_what_the_filters_keep(case44, pod256, alice, bob, staff_api):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for i, (user, cluster) in enumerate([(alice, case44), (alice, pod256), (bob, case44)]):
        services.job_submit(user=user, spec=small_spec(f"j{i}", 1, cluster=cluster.name))
    for query, count in ({}, 3), ({"cluster": "pod-256"}, 1), ({"owner": "bob"}, 1), ({"name": "j1"}, 1):
        with CaptureQueriesContext(connection) as ctx:
            page = staff_api.get("/api/v1/jobs/", {**query, "page_size": 1}).json()
        assert page["count"] == count and len(page["results"]) == 1, query
        (counted,) = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"]]
        # The count reads the jobs alone, or with the table a filter names; never the page's names.
        joins = counted.count(" JOIN ")
        assert joins == (1 if query.keys() & {"cluster", "owner"} else 0), counted


def test_owner_cancels_own_job_but_not_twice(case44, alice, alice_api):
    job = services.job_submit(user=alice, spec=small_spec("c", 1))
    first = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert first.status_code == 200 and first.json()["status"] == "cancelled"
    again = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert again.status_code == 409 and again.json()["status"] == "cancelled"


def test_lifecycle_needs_staff_or_the_clusters_launcher(
    case44, pod256, alice, alice_api, staff_api, committed
):
    job = committed(services.job_submit, user=alice, spec=small_spec("l", 8))
    assert alice_api.post(f"/api/v1/jobs/{job.pk}/start/").status_code == 403
    assert launcher_client(pod256).post(f"/api/v1/jobs/{job.pk}/start/").status_code == 404
    assert launcher_client(case44).post(f"/api/v1/jobs/{job.pk}/start/").json()["status"] == "running"
    failed = staff_api.post(f"/api/v1/jobs/{job.pk}/fail/", {"reason": "ECC error"}, format="json")
    assert failed.json()["status"] == "failed" and failed.json()["pending_reason"] == "ECC error"
    assert not Allocation.objects.filter(job=job, live=True).exists()


def test_launcher_cannot_submit_or_cancel(case44, alice, job_spec):
    launcher = launcher_client(case44)
    assert launcher.post("/api/v1/jobs/", job_spec(), format="json").status_code == 403
    job = services.job_submit(user=alice, spec=small_spec("x", 1))
    assert launcher.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert launcher.get(f"/api/v1/jobs/{job.pk}/").status_code == 200


def test_bad_launcher_key_is_a_401(case44):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Launcher not-a-key")
    assert client.get("/api/v1/jobs/").status_code == 401


def test_start_of_a_queued_job_is_a_409(case44, alice, staff_api, job_spec):
    job = services.job_submit(user=alice, spec=job_spec())
    response = staff_api.post(f"/api/v1/jobs/{job.pk}/start/")
    assert response.status_code == 409 and "needs status placing" in response.json()["detail"]


def test_placement_of_a_waiting_job_is_a_404_that_says_why(case44, alice, alice_api, committed):
    committed(services.job_submit, user=alice, spec=small_spec("all", 16))
    waiting = committed(services.job_submit, user=alice, spec=small_spec("more", 4))
    response = alice_api.get(f"/api/v1/jobs/{waiting.pk}/placement/")
    assert response.status_code == 404
    assert "is queued: needs 4 GPUs, 0 free" in response.json()["detail"]


def test_unknown_rankmap_format_is_a_404(case44, alice, alice_api, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("r", 2))
    assert alice_api.get(f"/api/v1/jobs/{job.pk}/rankmap/", {"format": "pbs"}).status_code == 404


def test_submission_is_throttled_by_the_submit_scope(case44, alice_api, monkeypatch, throttle_window):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"submit": "2/min", "user": "1000/min"})
    codes = [
        alice_api.post("/api/v1/jobs/", small_spec(f"t{i}", 1), format="json").status_code for i in range(3)
    ]
    assert codes == [201, 201, 429]
    assert alice_api.get("/api/v1/jobs/").status_code == 200


def test_preview_prices_every_policy_and_books_nothing(case44, alice_api, job_spec):
    response = alice_api.post("/api/v1/placements/preview/", job_spec(), format="json")
    assert response.status_code == 200, response.content
    out = response.json()
    by_policy = {p["policy"]: p for p in out["policies"]}
    assert set(by_policy) == {"topo", "naive", "first_fit", "tree_best_fit", "random"}
    assert by_policy["topo"]["predicted"]["step_ms"] == pytest.approx(102.67, abs=0.01)
    assert by_policy["naive"]["predicted"]["step_ms"] > 200
    assert out["lower_bound"]["step_ms"] <= by_policy["topo"]["predicted"]["step_ms"]
    assert not Job.objects.exists() and not Allocation.objects.exists()


def test_preview_reports_policies_that_do_not_fit(case44, alice, alice_api, job_spec, committed):
    committed(services.job_submit, user=alice, spec=small_spec("busy", 8))
    out = alice_api.post("/api/v1/placements/preview/", job_spec(), format="json").json()
    assert out["free_gpus"] == 8
    assert all(p["fits"] is False and "needs 16 GPUs, 8 free" in p["reason"] for p in out["policies"])


def test_preview_of_a_bad_spec_is_a_400(case44, alice_api, job_spec):
    response = alice_api.post("/api/v1/placements/preview/", job_spec(gpus=0), format="json")
    assert response.status_code == 400 and "gpus" in response.json()


def test_yaml_round_trip_of_the_stored_spec(case44, alice, alice_api):
    job = services.job_submit(user=alice, spec=small_spec("y", 2))
    spec = alice_api.get(f"/api/v1/jobs/{job.pk}/").json()["spec"]
    again = alice_api.post(
        "/api/v1/jobs/", yaml.safe_dump(dict(spec, name="y2")), content_type="application/yaml"
    )
    assert again.status_code == 201
