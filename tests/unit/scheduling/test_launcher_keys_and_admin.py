"""Launcher keys are kept as hashes (shown once, the admin shows the prefix), existing keys are
hashed in place by migration 0022 and keep working, and the admin's job form changes nothing the
scheduler alone sets."""

from __future__ import annotations

import hashlib

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from apps.scheduling import services
from apps.scheduling.admin import JobAdmin
from apps.scheduling.api.authentication import LauncherAuthentication
from apps.scheduling.models import Job, LauncherToken

from .conftest import small_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def root_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-root"))
    return client


def test_a_launcher_key_is_shown_once_and_stored_as_its_hash(case44, root_client):
    token, key = services.launcher_token_create(cluster=case44)
    assert token.key_hash == hashlib.sha256(key.encode()).hexdigest() and token.prefix == key[:10]
    launcher = APIClient(HTTP_AUTHORIZATION=f"Launcher {key}")
    assert launcher.get("/api/v1/jobs/").status_code == 200
    LauncherAuthentication.cache.clear()
    # The stored hash is no credential.
    assert APIClient(HTTP_AUTHORIZATION=f"Launcher {token.key_hash}").get("/api/v1/jobs/").status_code in (
        401,
        429,
    )
    for page in ("/admin/scheduling/launchertoken/", f"/admin/scheduling/launchertoken/{token.pk}/change/"):
        text = root_client.get(page).content.decode()
        assert token.prefix in text and key not in text and token.key_hash not in text
    assert root_client.get("/admin/scheduling/launchertoken/add/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_migration_0022_hashes_existing_keys_in_place(case44):
    executor = MigrationExecutor(connection)
    executor.migrate([("scheduling", "0018_nodehealth")])
    old = executor.loader.project_state([("scheduling", "0018_nodehealth")]).apps
    old_key = "0123456789abcdef0123456789abcdef01234567"
    old.get_model("scheduling", "LauncherToken").objects.create(cluster_id=case44.pk, key=old_key)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    token = LauncherToken.objects.get()
    assert token.key_hash == hashlib.sha256(old_key.encode()).hexdigest() and token.prefix == old_key[:10]
    LauncherAuthentication.cache.clear()
    assert APIClient(HTTP_AUTHORIZATION=f"Launcher {old_key}").get("/api/v1/jobs/").status_code == 200


def test_every_job_field_is_read_only_in_the_admin(case44, alice, root_client, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("held", 2))
    job.refresh_from_db()
    fields = {f.name for f in Job._meta.concrete_fields} - {"id", "spec"}
    assert fields <= set(JobAdmin.readonly_fields)
    page = root_client.get(f"/admin/scheduling/job/{job.pk}/change/").content.decode()
    for name in ("account", "borrowed", "generation", "status", "placed_at", "priority"):
        assert f'name="{name}"' not in page, name
    before = Job.objects.filter(pk=job.pk).values().get()
    root_client.post(
        f"/admin/scheduling/job/{job.pk}/change/",
        {
            "status": "queued",
            "generation": 7,
            "borrowed": "on",
            "priority": 99,
            "account": "",
            "_save": "Save",
        },
    )
    assert Job.objects.filter(pk=job.pk).values().get() == before
