"""The documented production configuration: `check --deploy` clean, https settings, the
Content-Security-Policy header, secrets kept out of git and the image, and a clear start-up error
when the static files were not collected."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from tests.unit.test_project import COMPOSE, REPO

MANIFEST_STORAGE = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}


def compose_env(**overrides: str) -> dict[str, str]:
    """The app containers' environment from docker-compose.yml, `${VAR:-default}` resolved to its
    default, with a real-looking secret key and `overrides` on top."""
    env = {}
    for name, value in COMPOSE["services"]["web"]["environment"].items():
        value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
        env[name] = value
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    return {**env, **overrides}


def manage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "topoweb.settings", **env}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=full_env, capture_output=True, text=True
    )


def test_check_deploy_is_clean_in_the_production_configuration():
    run = manage(["check", "--deploy", "--fail-level", "WARNING"], compose_env(TOPOWEB_HTTPS="1"))
    assert run.returncode == 0, run.stderr
    assert "System check identified no issues" in run.stdout
    assert "WARNINGS" not in run.stderr + run.stdout


def test_check_deploy_warns_without_num_proxies_in_production():
    assert compose_env()["TOPOWEB_NUM_PROXIES"] == "1"
    run = manage(["check", "--deploy"], compose_env(TOPOWEB_HTTPS="1", TOPOWEB_NUM_PROXIES="0"))
    assert "api.W001" in run.stdout + run.stderr


def test_without_https_check_deploy_names_the_missing_https_settings():
    run = manage(["check", "--deploy"], compose_env(TOPOWEB_HTTPS="0"))
    report = run.stdout + run.stderr
    assert "security.W004" in report and "security.W008" in report
    # Cookies are secure in compose even without TLS.
    assert "security.W012" not in report and "security.W016" not in report


def test_https_settings_and_the_health_check_exemption():
    probe = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_REDIRECT_EXEMPT, "
        "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER]))"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "topoweb.settings",
        **compose_env(TOPOWEB_HTTPS="1"),
    }
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (
        '[true, 31536000, ["^healthz$"], true, true, ["HTTP_X_FORWARDED_PROTO", "https"]]'
    )


def test_env_files_stay_out_of_git_and_the_image():
    run = subprocess.run(["git", "check-ignore", ".env"], cwd=REPO, capture_output=True, text=True)
    assert run.stdout.split() == [".env"]
    assert ".env" in (REPO / ".dockerignore").read_text().split()


@pytest.mark.django_db
def test_every_page_and_api_answer_carries_the_csp(client):
    for path in ("/accounts/login/", "/api/docs/", "/api/v1/jobs/", "/healthz"):
        policy = client.get(path)["Content-Security-Policy"]
        # django-csp writes the directives in no fixed order: read them as a mapping.
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
        assert directives["default-src"] == "'self'", path
        assert directives["script-src"] == "'self'", path
        assert directives["frame-ancestors"] == "'none'", path
        assert directives["object-src"] == "'none'", path


@pytest.mark.django_db
def test_the_swagger_ui_script_is_a_file_not_inline(client):
    html = client.get("/api/docs/").content.decode()
    assert re.search(r"<script>\s*\S", html) is None
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")


def test_pages_have_no_inline_scripts_or_handlers():
    for template in (REPO / "templates").rglob("*.html"):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag or 'type="application/json"' in tag, (template, tag)
        assert re.search(r"\son[a-z]+=", text) is None, template


def test_start_up_refuses_uncollected_static_files_with_a_clear_error(tmp_path):
    from topoweb.startup import check_static_collected

    with override_settings(STORAGES=MANIFEST_STORAGE, STATIC_ROOT=tmp_path):
        with pytest.raises(ImproperlyConfigured, match="static files were not collected.*collectstatic"):
            check_static_collected()
        (tmp_path / "staticfiles.json").write_text(
            '{"version": "1.1", "paths": {"dashboard/base.js": "dashboard/base.1.js"}}'
        )
        check_static_collected()


def test_the_wsgi_application_fails_at_import_without_collected_static_files(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        **compose_env(DATABASE_URL="postgres://nobody@127.0.0.1:1/none", TOPOWEB_STATIC_ROOT=str(tmp_path)),
    }
    run = subprocess.run(
        [sys.executable, "-c", "import topoweb.wsgi"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "ImproperlyConfigured: static files were not collected" in run.stderr


def test_embedded_default_and_tests_need_no_collected_static_files():
    from topoweb.startup import check_static_collected

    check_static_collected()


def agent_intervals(**env: str) -> subprocess.CompletedProcess:
    probe = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.TOPOWEB_AGENT_POLL_S, s.TOPOWEB_AGENT_DOWN_AFTER_S, s.TOPOWEB_AGENT_FENCE_AFTER_S)"
    )
    full_env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "topoweb.settings", **compose_env(**env)}
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=full_env, capture_output=True, text=True
    )


def test_agent_intervals_default_to_a_minute_poll_three_minutes_down_and_a_twelve_minute_lease():
    """The lease outlasts a 10-minute control-plane outage (plus the poll in flight)."""
    run = agent_intervals()
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["60.0", "180.0", "720.0"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TOPOWEB_AGENT_POLL_S": "61"}, "TOPOWEB_AGENT_POLL_S must be between 0 and 60"),
        ({"TOPOWEB_AGENT_POLL_S": "0"}, "TOPOWEB_AGENT_POLL_S must be between 0 and 60"),
        ({"TOPOWEB_AGENT_POLL_S": "soon"}, "must be seconds"),
        ({"TOPOWEB_AGENT_DOWN_AFTER_S": "120"}, "at least three times TOPOWEB_AGENT_POLL_S"),
        ({"TOPOWEB_AGENT_POLL_S": "30", "TOPOWEB_AGENT_DOWN_AFTER_S": "89"}, "at least three times"),
        ({"TOPOWEB_AGENT_FENCE_AFTER_S": "60"}, "longer than TOPOWEB_AGENT_POLL_S"),
        ({"TOPOWEB_AGENT_FENCE_AFTER_S": "86401"}, "at most a day"),
        ({"TOPOWEB_AGENT_FENCE_AFTER_S": "later"}, "must be seconds"),
    ],
)
def test_agent_intervals_that_would_mark_idle_nodes_down_refuse_to_start(env, named):
    run = agent_intervals(**env)
    assert run.returncode != 0
    assert "ImproperlyConfigured" in run.stderr and named in run.stderr


def test_shorter_agent_intervals_with_room_for_the_heartbeat_are_accepted():
    run = agent_intervals(
        TOPOWEB_AGENT_POLL_S="10", TOPOWEB_AGENT_DOWN_AFTER_S="30", TOPOWEB_AGENT_FENCE_AFTER_S="20"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["10.0", "30.0", "20.0"]


@pytest.mark.django_db
def test_the_csp_built_once_is_django_csps_own_and_follows_a_settings_change(client, settings):
    from csp.utils import build_policy

    for path in ("/accounts/login/", "/api/v1/jobs/", "/healthz"):
        assert client.get(path)["Content-Security-Policy"] == build_policy(), path
    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"default-src": ["'none'"]}}
    settings.CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": {"script-src": ["'self'"]}}
    answer = client.get("/healthz")
    assert answer["Content-Security-Policy"] == build_policy() == "default-src 'none'"
    assert answer["Content-Security-Policy-Report-Only"] == build_policy(report_only=True)
    assert "script-src 'self'" in answer["Content-Security-Policy-Report-Only"]


@pytest.mark.parametrize("entry", ["topoweb.wsgi", "topoweb.asgi"])
def test_the_servers_start_with_their_start_up_objects_out_of_the_collectors_sight(entry):
    """A web process freezes what it loaded at start-up and collects the young generation after
    tens of thousands of new objects (topoweb.startup.tune_gc), not Python's default 700."""
    from topoweb.startup import GC_THRESHOLDS

    probe = f"import gc; import {entry}; print(gc.get_freeze_count(), *gc.get_threshold())"
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "topoweb.settings"}  # the embedded site
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    frozen, *thresholds = (int(x) for x in run.stdout.split())
    assert frozen > 10_000  # Django, the apps and their models
    assert tuple(thresholds) == GC_THRESHOLDS != (700, 10, 10)


def test_a_celery_worker_tunes_the_collector_when_ready():
    import gc

    from celery.signals import worker_ready

    from topoweb.startup import GC_THRESHOLDS

    before = gc.get_threshold()
    import topoweb.celery  # noqa: F401 (connects the handler)

    try:
        worker_ready.send(sender=None)
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
