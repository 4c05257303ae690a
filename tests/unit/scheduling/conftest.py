"""Fixtures of the scheduling tests: example clusters, users, API clients, eager Celery."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from apps.api.roles import role_grant
from apps.placement.topology import read_spec_file
from apps.topology import services as topology_services
from topoweb.celery import app as celery_app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(autouse=True)
def eager_celery():
    """Tasks run in-process even if a broker is configured: unit tests never need a worker."""
    before = celery_app.conf.task_always_eager
    # Settings come in under the CELERY_ namespace, and the namespaced key is the one that counts.
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    yield
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = before


@pytest.fixture
def case44(db):
    return topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))


@pytest.fixture
def pod256(db):
    return topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))


@pytest.fixture
def su_h100(db):
    return topology_services.cluster_import(data=read_spec_file(EXAMPLES / "su-h100-rail.yaml"))


@pytest.fixture(scope="session")
def case44_spec() -> dict:
    return read_spec_file(EXAMPLES / "case-4-4-job.yaml")


@pytest.fixture
def job_spec(case44_spec):
    """A fresh copy of the case 4.4 job spec with overrides: job_spec(name="x", priority=3)."""

    def _spec(**overrides) -> dict:
        spec = copy.deepcopy(case44_spec)
        spec.update(overrides)
        return spec

    return _spec


def small_spec(name: str, gpus: int, *, cluster: str = "case-4-4", **extra) -> dict:
    """A data-parallel job of `gpus` ranks with one allreduce."""
    spec = {
        "version": 1,
        "name": name,
        "cluster": cluster,
        "gpus": gpus,
        "parallelism": {"tp": 1, "pp": 1, "dp": gpus},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}] if gpus > 1 else [],
        "estimated_runtime_s": 3600,
    }
    spec.update(extra)
    return spec


@pytest.fixture
def make_user(db):
    def _make(username: str, *, staff: bool = False, role: str = ""):
        """A user; `staff=True` is a staff user in the admin role, `role` names another role."""
        user = get_user_model().objects.create_user(username, password="pw-" + username, is_staff=staff)
        role = role or ("admin" if staff else "")
        if role:
            role_grant(user=user, role=role)
        return user

    return _make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def staff(make_user):
    return make_user("operator", staff=True)


def token_client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def alice_api(alice) -> APIClient:
    return token_client(alice)


@pytest.fixture
def bob_api(bob) -> APIClient:
    return token_client(bob)


@pytest.fixture
def staff_api(staff) -> APIClient:
    return token_client(staff)


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Run a block's on-commit callbacks (the queued scheduling cycles) as a commit would."""

    def _run(fn, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)

    return _run


@pytest.fixture
def admin_api(db) -> APIClient:
    """A superuser's client."""
    return token_client(get_user_model().objects.create_superuser("root", password="pw-root"))


@pytest.fixture
def clock(monkeypatch):
    """The monotonic clock (which the rows and answers a submission keeps expire by), moved by hand."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


@pytest.fixture
def throttle_window(monkeypatch):
    """The throttles' clock held 20 s into a minute-long window, their counters cleared: a test
    counting requests against a per-minute rate is not split by a window's end (under load its
    requests can take seconds)."""
    monkeypatch.setattr(SimpleRateThrottle, "timer", staticmethod(lambda: 1_800_000_020.0))
    cache.clear()
    yield
    cache.clear()
