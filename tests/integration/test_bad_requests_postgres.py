"""Bad requests on Postgres, where model range checks and NUL bytes used to raise 500s: each is a
400 naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from apps.placement.topology import read_spec_file
from apps.topology import services as topology_services

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    user = get_user_model().objects.create_superuser("root")
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def _job(**overrides) -> dict:
    spec = read_spec_file(EXAMPLES / "case-4-4-job.yaml")
    spec.update(overrides)
    return spec


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"priority": 2**31}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"name": "n" * 201}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"user": "u\x00"}, "user"),
    ],
)
def test_job_fields_postgres_cannot_store_are_a_400(api, overrides, field):
    assert connection.vendor == "postgresql"
    response = api.post("/api/v1/jobs/", _job(**overrides), format="json")
    assert response.status_code == 400, response.content[:300]
    assert field in response.json()


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/jobs/?name=a%00",
        "/api/v1/jobs/?cluster=a%00",
        "/api/v1/nodes/?cluster=%00",
        "/api/v1/gpus/?node=%00",
        "/api/v1/clusters/%00/",
        "/api/v1/jobs/?priority_min=99999999999999999999",
        "/api/v1/gpus/?index=99999999999999999999",
    ],
)
def test_nul_and_wide_numbers_in_urls_are_a_400(api, url):
    assert api.get(url).status_code == 400


def test_cluster_settings_with_nul_are_a_400(api):
    [cluster] = api.get("/api/v1/clusters/").json()["results"]
    response = api.patch(f"/api/v1/clusters/{cluster['id']}/", {"description": "x\x00"}, format="json")
    assert response.status_code == 400 and "description" in response.json()
