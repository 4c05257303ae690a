"""`load_demo` (`serve_embedded`: tests/unit/dashboard/test_serve_embedded.py)."""

import importlib.machinery
import io
import sys
import types
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.topology.management.commands import load_demo
from apps.topology.models import Cluster, Gpu

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def demo_jobs(monkeypatch):
    """A stand-in for apps.scheduling.demo that records its calls."""
    calls = []
    module = types.ModuleType("demo_jobs_for_test")
    module.__spec__ = importlib.machinery.ModuleSpec("demo_jobs_for_test", None)
    module.load_demo_jobs = lambda: calls.append("called")
    monkeypatch.setitem(sys.modules, "demo_jobs_for_test", module)
    monkeypatch.setattr(load_demo, "DEMO_JOBS_MODULE", "demo_jobs_for_test")
    return calls


@pytest.mark.django_db
def test_load_demo_imports_the_demo_clusters_and_the_admin_login_once(demo_jobs):
    out = io.StringIO()
    call_command("load_demo", stdout=out)
    call_command("load_demo", stdout=out)
    assert sorted(Cluster.objects.values_list("name", flat=True)) == [
        "case-4-4",
        "pcie-lab",
        "pod-256",
        "su-h100",
    ]
    assert Gpu.objects.count() == 16 + 256 + 256 + 16
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("admin")
    assert "Demo admin login: user 'admin', password 'admin'" in out.getvalue()
    assert "Cluster pod-256 is already loaded" in out.getvalue()
    assert demo_jobs == ["called", "called"]


@pytest.mark.django_db
def test_load_demo_skips_the_demo_jobs_when_the_module_is_absent(monkeypatch):
    monkeypatch.setattr(load_demo, "DEMO_JOBS_MODULE", "apps.topology.no_such_module")
    out = io.StringIO()
    call_command("load_demo", stdout=out)
    assert "Loaded the demo jobs" not in out.getvalue()
    assert Cluster.objects.count() == 4


@pytest.mark.django_db
def test_load_demo_creates_no_known_password_outside_the_embedded_default(settings, demo_jobs):
    settings.EMBEDDED = False
    out = io.StringIO()
    call_command("load_demo", stdout=out)
    assert not get_user_model().objects.filter(username="admin").exists()
    assert "use createsuperuser" in out.getvalue()
