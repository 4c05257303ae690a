"""Topology API: cluster import/export/settings (staff or launcher writes) and read-only lists."""

from __future__ import annotations

import json

import pytest
import yaml
from rest_framework.test import APIClient

from apps.scheduling import services
from apps.topology.models import Cluster

from .conftest import EXAMPLES, small_spec

pytestmark = pytest.mark.django_db


def launcher_client(cluster) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Launcher {services.launcher_token_create(cluster=cluster)[1]}")
    return client


def test_clusters_are_readable_by_any_user(case44, alice_api):
    [row] = alice_api.get("/api/v1/clusters/").json()["results"]
    assert (row["name"], row["gpu_count"], row["node_count"], row["policy"]) == ("case-4-4", 16, 2, "topo")


def test_import_as_json_body_creates_the_cluster(staff_api):
    spec = yaml.safe_load((EXAMPLES / "case-4-4.yaml").read_text())
    response = staff_api.post("/api/v1/clusters/import/", spec, format="json")
    assert response.status_code == 201 and response.json()["gpu_count"] == 16


def test_import_as_yaml_body_of_the_generator_form(staff_api):
    body = (EXAMPLES / "pod-256.yaml").read_text()
    response = staff_api.post("/api/v1/clusters/import/", body, content_type="application/yaml")
    assert response.status_code == 201 and response.json()["gpu_count"] == 256


def test_import_errors_are_400s_naming_the_fields_and_write_nothing(staff_api):
    spec = yaml.safe_load((EXAMPLES / "case-4-4.yaml").read_text())
    spec["nodes"][1]["nics"][0]["leaf"] = "leaf-9"
    spec["links"] = [{"a": "leaf-1", "b": "leaf-1", "bw_GBps": -1, "latency_us": 1}]
    response = staff_api.post("/api/v1/clusters/import/", spec, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert errors["nodes[1].nics[0].leaf"] == ["unknown leaf switch 'leaf-9'"]
    assert "links[0].bw_GBps" in errors
    assert not Cluster.objects.exists()


def test_importing_an_existing_name_needs_replace(case44, staff_api):
    with open(EXAMPLES / "case-4-4.yaml", "rb") as fh:
        clash = staff_api.post("/api/v1/clusters/import/", {"file": fh}, format="multipart")
    assert clash.status_code == 400 and "already exists" in clash.json()["name"][0]
    with open(EXAMPLES / "case-4-4.yaml", "rb") as fh:
        replaced = staff_api.post("/api/v1/clusters/import/?replace=true", {"file": fh}, format="multipart")
    assert replaced.status_code == 200 and replaced.json()["id"] == case44.pk


def test_topology_writes_are_staff_only(case44, alice_api):
    spec = yaml.safe_load((EXAMPLES / "pod-256.yaml").read_text())
    assert alice_api.post("/api/v1/clusters/import/", spec, format="json").status_code == 403
    assert (
        alice_api.patch(
            f"/api/v1/clusters/{case44.pk}/", {"preemption_enabled": True}, format="json"
        ).status_code
        == 403
    )
    assert alice_api.delete(f"/api/v1/clusters/{case44.pk}/").status_code == 403


def test_staff_change_a_clusters_scheduling_settings(case44, staff_api):
    response = staff_api.patch(
        f"/api/v1/clusters/{case44.pk}/",
        {"policy": "tree_best_fit", "preemption_enabled": True},
        format="json",
    )
    assert response.status_code == 200
    case44.refresh_from_db()
    assert (case44.policy, case44.preemption_enabled) == ("tree_best_fit", True)
    bad = staff_api.patch(f"/api/v1/clusters/{case44.pk}/", {"policy": "fastest"}, format="json")
    assert bad.status_code == 400 and "policy" in bad.json()


def test_a_launcher_may_not_import_or_change_even_its_own_cluster(case44):
    spec = yaml.safe_load((EXAMPLES / "case-4-4.yaml").read_text())
    launcher = launcher_client(case44)
    assert launcher.post("/api/v1/clusters/import/", spec, format="json").status_code == 403
    assert (
        launcher.patch(f"/api/v1/clusters/{case44.pk}/", {"policy": "naive"}, format="json").status_code
        == 403
    )
    assert launcher.delete(f"/api/v1/clusters/{case44.pk}/").status_code == 403
    case44.refresh_from_db()
    assert case44.policy == "topo"


def test_export_gives_spec_v1_back(case44, alice_api):
    exported = alice_api.get(f"/api/v1/clusters/{case44.pk}/export/", {"format": "topology-v1"})
    assert exported.status_code == 200
    spec = json.loads(exported.content)
    assert spec["version"] == 1 and spec["name"] == "case-4-4"
    assert [n["name"] for n in spec["nodes"]] == ["node-a", "node-b"]
    as_yaml = alice_api.get(f"/api/v1/clusters/{case44.pk}/export/", {"format": "yaml"})
    assert as_yaml["Content-Type"].startswith("application/yaml")
    assert yaml.safe_load(as_yaml.content) == spec


def test_row_lists_filter_by_cluster(case44, pod256, alice_api):
    assert alice_api.get("/api/v1/nodes/", {"cluster": "case-4-4"}).json()["count"] == 2
    assert alice_api.get("/api/v1/nodes/", {"cluster": str(pod256.pk)}).json()["count"] == 32
    switches = alice_api.get("/api/v1/switches/", {"cluster": "pod-256", "tier": "spine"}).json()
    assert [s["name"] for s in switches["results"]] == ["spine-1", "spine-2"]
    assert alice_api.get("/api/v1/links/", {"cluster": "pod-256"}).json()["count"] == 8
    node = alice_api.get("/api/v1/nodes/", {"cluster": "case-4-4", "name": "node-a"}).json()["results"][0]
    assert node["gpu_count"] == 8 and node["nics"][0]["name"] == "mlx5_0" and node["leaf"] == "leaf-1"


def test_gpu_list_shows_which_job_holds_each_gpu(case44, alice, alice_api, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("four", 4))
    busy = alice_api.get("/api/v1/gpus/", {"cluster": "case-4-4", "free": "false"}).json()
    assert busy["count"] == 4 and {g["job"] for g in busy["results"]} == {job.pk}
    assert sorted(g["rank"] for g in busy["results"]) == [0, 1, 2, 3]
    assert alice_api.get("/api/v1/gpus/", {"cluster": "case-4-4", "free": "true"}).json()["count"] == 12


def test_gpu_list_query_count_is_flat(pod256, alice_api, django_assert_max_num_queries):
    # The token's first request: the token, its user's permissions and coordinated accounts; then
    # the count and the page, however many GPUs.
    with django_assert_max_num_queries(5):
        assert len(alice_api.get("/api/v1/gpus/", {"page_size": 200}).json()["results"]) == 200


def test_deleting_a_cluster_takes_its_jobs_and_allocations_along(case44, alice, staff_api, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("doomed", 8))
    assert staff_api.delete(f"/api/v1/clusters/{case44.pk}/").status_code == 204
    assert not Cluster.objects.exists()
    assert not type(job).objects.exists()


def test_replacing_the_topology_under_allocated_gpus_is_refused(case44, alice, staff_api, committed):
    committed(services.job_submit, user=alice, spec=small_spec("holding", 8))
    spec = yaml.safe_load((EXAMPLES / "case-4-4.yaml").read_text())
    response = staff_api.post("/api/v1/clusters/import/?replace=true", spec, format="json")
    assert response.status_code == 400
    assert "cannot be replaced while jobs hold its GPUs" in response.json()["name"][0]
