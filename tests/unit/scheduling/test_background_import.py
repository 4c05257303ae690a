"""Imports in the background: a Celery task writes the cluster whole or not at all, with progress."""

from __future__ import annotations

import json

import pytest

from apps.placement.topology import read_spec_file
from apps.topology.models import Cluster, ClusterImport, Gpu

from .conftest import EXAMPLES

pytestmark = pytest.mark.django_db


def test_a_background_import_answers_202_and_its_progress_shows_the_cluster(
    admin_api, django_capture_on_commit_callbacks
):
    spec = read_spec_file(EXAMPLES / "pod-256.yaml")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post(
            "/api/v1/clusters/import/?background=true", json.dumps(spec), content_type="application/json"
        )
    assert response.status_code == 202, response.content
    url = response.json()["url"]
    assert response["Location"] == url and response.json()["status"] == "queued"
    body = admin_api.get(url).json()
    assert (body["status"], body["stage"], body["progress"], body["cluster"]) == (
        "done",
        "done",
        1.0,
        "pod-256",
    )
    assert Gpu.objects.filter(node__cluster__name="pod-256").count() == 256
    # The spec is not kept once written.
    assert ClusterImport.objects.get().spec is None


def test_a_failing_background_import_writes_nothing_and_names_the_fields(
    admin_api, django_capture_on_commit_callbacks
):
    spec = read_spec_file(EXAMPLES / "case-4-4.yaml")
    spec["gpu_models"] = {"A100-SXM4-80GB": {"peak_tflops": 1e308}}
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post(
            "/api/v1/clusters/import/?background=1", json.dumps(spec), content_type="application/json"
        )
    body = admin_api.get(response.json()["url"]).json()
    assert body["status"] == "failed" and body["cluster"] is None
    assert any("peak_tflops" in field for field in body["errors"]), body["errors"]
    assert not Cluster.objects.exists()


def test_only_importers_see_background_imports(admin_api, alice_api, django_capture_on_commit_callbacks):
    spec = read_spec_file(EXAMPLES / "case-4-4.yaml")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post(
            "/api/v1/clusters/import/?background=1", json.dumps(spec), content_type="application/json"
        )
    assert alice_api.get(response.json()["url"]).status_code == 404
    assert (
        alice_api.post(
            "/api/v1/clusters/import/?background=1", json.dumps(spec), content_type="application/json"
        ).status_code
        == 403
    )


def test_the_import_page_writes_a_large_cluster_in_the_background_and_lists_it(
    client, django_capture_on_commit_callbacks, monkeypatch
):
    from django.contrib.auth import get_user_model

    from apps.dashboard.views import imports

    monkeypatch.setattr(imports, "BACKGROUND_GPUS", 8)
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-root"))
    text = (EXAMPLES / "case-4-4.yaml").read_text()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/import/", {"text": text, "action": "import"})
    assert response.status_code == 302 and response["Location"] == "/import/"
    page = client.get("/import/").content.decode()
    assert 'id="background-imports"' in page and "100%" in page and 'href="/clusters/case-4-4/"' in page
    assert Cluster.objects.filter(name="case-4-4").exists()
