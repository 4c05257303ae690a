"""Launch env values are the owner's: the API and the admin show others the names only."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.scheduling import services
from apps.scheduling.selectors import MASKED

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db

SECRET = "hunter2-wandb-key"


def _job(alice, committed):
    spec = small_spec(
        "secretive", 4, command=["python", "train.py"], env={"WANDB_API_KEY": SECRET, "MODE": "x"}
    )
    return committed(services.job_submit, user=alice, spec=spec)


def test_the_owner_sees_env_values_and_a_viewer_only_their_names(case44, alice, make_user, committed):
    job = _job(alice, committed)
    mine = token_client(alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert mine["spec"]["env"] == {"WANDB_API_KEY": SECRET, "MODE": "x"}
    viewer = make_user("vera", role="viewer")
    theirs = token_client(viewer).get(f"/api/v1/jobs/{job.pk}/")
    assert theirs.json()["spec"]["env"] == {"WANDB_API_KEY": MASKED, "MODE": MASKED}
    assert SECRET not in theirs.content.decode()
    operator = make_user("olga", role="operator")
    assert SECRET not in token_client(operator).get(f"/api/v1/jobs/{job.pk}/").content.decode()


def test_the_admin_job_page_masks_env_values(case44, alice, client, committed):
    job = _job(alice, committed)
    root = get_user_model().objects.create_superuser("root", password="pw-root")
    client.force_login(root)
    page = client.get(f"/admin/scheduling/job/{job.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "WANDB_API_KEY" in text and SECRET not in text
