"""`load_demo` and `serve_embedded`."""

import importlib.machinery
import io
import json
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """GET url, retrying until the server answers or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_serve_embedded_serves_health_and_static_files_with_debug_off(tmp_path):
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONUNBUFFERED": "1",
        "TOPOWEB_TESTING": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
    }
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve_embedded", "--addr", f"127.0.0.1:{port}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok", "database": "sqlite"})
        status, body = get(f"http://127.0.0.1:{port}/static/admin/css/base.css")
        assert status == 200 and b"{" in body
    finally:
        server.terminate()
        output = server.communicate(timeout=10)[0].decode()
    assert "TopoWeb on http://127.0.0.1:" in output
    assert "Watching for file changes" not in output
    assert "No directory at" not in output
