"""The project around the apps: settings from the environment, URLs, Celery, docker-compose,
the Dockerfile, the README and docs/, and the purity of the placement core."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from django.conf import settings
from django.db import DatabaseError
from django.urls import resolve, reverse

import topoweb
from apps.placement.topology import TIERS
from apps.topology.choices import PlacementPolicy, SwitchTier
from topoweb import settings as settings_module

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
APP_SERVICES = ("web", "agents", "worker", "beat")


def settings_under(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Load the settings in a fresh interpreter with only `env` set; print the values tested."""
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "db = s.DATABASES['default']; print(json.dumps({'engine': db['ENGINE'], 'name': str(db['NAME']), "
        "'host': db.get('HOST'), 'eager': s.CELERY_TASK_ALWAYS_EAGER, 'broker': s.CELERY_BROKER_URL, "
        "'debug': s.DEBUG, 'hosts': s.ALLOWED_HOSTS, 'secret': s.SECRET_KEY, "
        "'hashers': s.PASSWORD_HASHERS, 'static': s.STORAGES['staticfiles']['BACKEND'], "
        "'finders': s.WHITENOISE_USE_FINDERS}))"
    )
    full_env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "topoweb.settings", **env}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True
    )


def loaded(env: dict[str, str]) -> dict:
    run = settings_under(env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_embedded_default_needs_no_services():
    s = loaded({})
    assert s["engine"] == "django.db.backends.sqlite3"
    assert s["name"] == str(REPO / "db.sqlite3")
    assert (s["eager"], s["broker"]) == (True, "memory://localhost/")
    assert s["debug"] is False
    assert s["hosts"] == ["localhost", "127.0.0.1"]
    assert s["secret"] == (REPO / ".secret_key").read_text().strip()
    assert s["finders"] is True
    assert "MD5" not in s["hashers"][0]


def test_database_and_broker_urls_switch_to_postgres_and_redis():
    s = loaded(
        {
            "DATABASE_URL": "postgres://topoweb:pw@db.internal:5432/topoweb",
            "CELERY_BROKER_URL": "redis://queue.internal:6379/0",
            "SECRET_KEY": "from-the-environment",
            "ALLOWED_HOSTS": "topoweb.example.org, 127.0.0.1",
        }
    )
    assert (s["engine"], s["host"], s["name"]) == ("topoweb.postgres", "db.internal", "topoweb")
    assert (s["eager"], s["broker"]) == (False, "redis://queue.internal:6379/0")
    assert s["secret"] == "from-the-environment"
    assert s["hosts"] == ["topoweb.example.org", "127.0.0.1"]
    assert s["static"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_production_without_a_secret_key_refuses_to_start():
    run = settings_under({"DATABASE_URL": "postgres://topoweb@db/topoweb"})
    assert run.returncode != 0
    assert "SECRET_KEY must be set in the environment when DATABASE_URL is set" in run.stderr


def test_debug_only_with_topoweb_debug_1_and_md5_only_under_tests():
    assert loaded({"TOPOWEB_DEBUG": "1"})["debug"] is True
    assert loaded({"TOPOWEB_TESTING": "1"})["hashers"] == ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_embedded_secret_key_is_generated_once_and_private(tmp_path):
    path = tmp_path / ".secret_key"
    key = settings_module._embedded_secret_key(path)
    assert len(key) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert settings_module._embedded_secret_key(path) == key


def test_secret_key_file_and_databases_are_git_ignored():
    run = subprocess.run(
        ["git", "check-ignore", ".secret_key", "db.sqlite3", "db.sqlite3-wal", "staticfiles/x"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.stdout.split() == [".secret_key", "db.sqlite3", "db.sqlite3-wal", "staticfiles/x"]


@pytest.mark.django_db
def test_healthz_pings_the_database(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "sqlite"}
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_healthz_reports_a_database_failure_as_503(client, monkeypatch):
    from django.db import connection

    def broken_cursor(*args, **kwargs):
        raise DatabaseError("connection refused")

    monkeypatch.setattr(connection, "cursor", broken_cursor)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "error", "database": "connection refused"}


def test_root_urls_route_admin_login_api_docs_and_dashboard():
    assert resolve("/admin/").app_name == "admin"
    assert resolve("/accounts/login/").url_name == "login"
    assert reverse("schema") == "/api/schema/"
    assert reverse("swagger-ui") == "/api/docs/"
    assert resolve("/healthz").url_name == "healthz"


@pytest.mark.django_db
def test_api_docs_work_offline(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "cdn.jsdelivr.net" not in html
    assert client.get("/api/schema/").status_code == 200


def test_rest_framework_defaults_match_the_api_contract():
    rf = settings.REST_FRAMEWORK
    assert rf["DEFAULT_PERMISSION_CLASSES"] == ["rest_framework.permissions.IsAuthenticated"]
    assert rf["PAGE_SIZE"] == 50
    assert rf["DEFAULT_THROTTLE_RATES"] == {
        "user": "1000/min",
        "launcher": "1000/min",
        "submit": "120/min",
        "submit_operator": "1200/min",
        "agent_sync": "300/min",
    }
    assert "apps.api.throttling.ScopedCallerThrottle" in rf["DEFAULT_THROTTLE_CLASSES"]
    # Views naming no authentication (the topology API) authenticate as the others do.
    from rest_framework.settings import api_settings

    from apps.scheduling.api.authentication import AUTHENTICATION

    assert api_settings.DEFAULT_AUTHENTICATION_CLASSES == AUTHENTICATION
    assert rf["EXCEPTION_HANDLER"] == "apps.api.exceptions.exception_handler"


def test_celery_runs_tasks_eagerly_with_json_and_time_limits_when_no_broker_is_set():
    app = topoweb.celery_app
    assert app.main == "topoweb"
    assert (app.conf.task_serializer, app.conf.accept_content) == ("json", ["json"])
    assert 0 < app.conf.task_soft_time_limit < app.conf.task_time_limit

    @app.task(name="tests.add")
    def add(x, y):
        return x + y

    assert add.delay(2, 3).get(timeout=1) == 5


def test_enum_choices_match_the_placement_core():
    assert SwitchTier.values == list(TIERS)
    solvers = pytest.importorskip("apps.placement.solvers")
    assert PlacementPolicy.values == list(solvers.POLICIES)


# --------------------------------------------------------------------------- docker-compose and Dockerfile


def test_compose_has_the_six_services_and_a_named_postgres_volume():
    assert set(COMPOSE["services"]) == {"postgres", "redis", "web", "agents", "worker", "beat"}
    volume = COMPOSE["services"]["postgres"]["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


@pytest.mark.parametrize("service", APP_SERVICES)
def test_compose_app_environment_is_what_the_settings_read(service):
    env = COMPOSE["services"][service]["environment"]
    assert set(env) <= set(settings_module.ENV_VARS)
    assert {"DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "ALLOWED_HOSTS"} <= set(env)
    pg = COMPOSE["services"]["postgres"]["environment"]
    db = urlparse(env["DATABASE_URL"].replace("${POSTGRES_PASSWORD:-topoweb}", "pw"))
    assert (db.scheme, db.hostname, db.port) == ("postgres", "postgres", 5432)
    assert (db.username, db.path.lstrip("/")) == (pg["POSTGRES_USER"], pg["POSTGRES_DB"])
    for url in (env["CELERY_BROKER_URL"], env["CACHE_URL"]):
        assert urlparse(url).hostname in COMPOSE["services"]


def test_compose_health_checks_probe_each_service():
    services = COMPOSE["services"]
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    assert services["redis"]["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    for name, port in (("web", 8000), ("agents", 8001)):
        probe = " ".join(services[name]["healthcheck"]["test"])
        path = re.search(rf"http://127\.0\.0\.1:{port}(/\w+)", probe).group(1)
        assert resolve(path).url_name == "healthz"
    assert "127.0.0.1" in services["web"]["environment"]["ALLOWED_HOSTS"]
    for name in APP_SERVICES:
        conditions = {dep["condition"] for dep in services[name]["depends_on"].values()}
        assert conditions == {"service_healthy"}


def test_compose_commands_name_the_real_wsgi_module_and_celery_app():
    import importlib

    web = " ".join(COMPOSE["services"]["web"]["command"])
    assert web.index("migrate --noinput") < web.index("granian")
    module, attr = re.search(r"granian .*?([\w.]+):(\w+)$", web).groups()
    assert callable(getattr(importlib.import_module(module), attr))
    for name, role in (("worker", "worker"), ("beat", "beat")):
        command = COMPOSE["services"][name]["command"]
        assert command[:4] == ["celery", "-A", "topoweb", role]
    assert importlib.import_module("topoweb").celery_app.main == "topoweb"


def test_compose_serves_the_agents_sync_with_uvicorn_on_the_asgi_application():
    import importlib

    argv = COMPOSE["services"]["agents"]["command"]
    assert argv[0] == "uvicorn"
    module, attr = argv[1].split(":")
    app = getattr(importlib.import_module(module), attr)
    assert type(app).__name__ == "AgentSyncApplication"
    options = dict(a.removeprefix("--").split("=", 1) for a in argv[2:] if "=" in a)
    assert options["port"] == "8001" and "8001:8001" in COMPOSE["services"]["agents"]["ports"]
    # An agent keeps its connection from one poll to the next.
    assert float(options["timeout-keep-alive"]) > 60
    for package in ("uvicorn==", "httptools==", "uvloop=="):
        assert package in (REPO / "requirements.txt").read_text().split("# Development and tests")[0]


def _granian_options(argv: list[str]) -> dict:
    """granian's options in `argv`, parsed by its own command line (an unknown option or a bad
    value raises)."""
    from granian.cli import cli

    assert argv[0] == "granian"
    return cli.make_context("granian", list(argv[1:])).params


def test_compose_and_the_dockerfile_serve_long_polls_on_threads():
    web = " ".join(COMPOSE["services"]["web"]["command"]).split("&& exec ", 1)[1].split()
    cmd = re.search(r"^CMD (\[.*\])", (REPO / "Dockerfile").read_text().replace("\\\n", ""), re.M | re.S)
    assert web == json.loads(cmd.group(1))
    options = _granian_options(web)
    assert options["interface"] == "wsgi" and options["app"] == "topoweb.wsgi:application"
    # One thread is held by one agent's 60 s poll: every other caller needs another.
    assert options["blocking_threads"] >= 64
    # A worker process that dies (killed, out of memory) is started again.
    assert options["respawn_failed_workers"] is True
    env = COMPOSE["services"]["web"]["environment"]
    assert int(env["TOPOWEB_DB_POOL_MAX"]) >= 4 and env["DATABASE_URL"].startswith("postgres://")


def test_dockerfile_installs_the_runtime_requirements_and_collects_static_files():
    dockerfile = (REPO / "Dockerfile").read_text()
    requirements = (REPO / "requirements.txt").read_text()
    marker = re.search(r"sed '/\^(# [^/]+)/,\$d' requirements.txt", dockerfile).group(1)
    runtime = requirements.split(marker)[0]
    assert marker in requirements
    for package in (
        "Django==",
        "granian==",
        "whitenoise==",
        "psycopg[binary]==",
        "celery[redis]==",
        "numpy==",
    ):
        assert package in runtime
    assert "pytest" not in runtime
    assert "collectstatic --noinput" in dockerfile
    assert dockerfile.startswith("# ") and "FROM python:3.11" in dockerfile


def test_docs_document_every_configuration_variable():
    readme = (REPO / "docs" / "configuration.md").read_text()
    compose_vars = set(re.findall(r"\$\{(\w+)", (REPO / "docker-compose.yml").read_text()))
    for name in set(settings_module.ENV_VARS) | compose_vars:
        assert f"`{name}`" in readme, name


def test_readme_is_short_and_points_at_real_files():
    """The README is read in five minutes: about 200 lines, one headline table between the markers
    a generator rewrites, and every image and file it links exists."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 220
    assert text.count("<!-- headline:start -->") == 1 and text.count("<!-- headline:end -->") == 1
    block = text.split("<!-- headline:start -->")[1].split("<!-- headline:end -->")[0]
    assert block.strip().startswith("| ") and "`bench/" in block
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) == 3
    for target in images:
        assert (REPO / target).is_file(), target
    linked = set(re.findall(r"(?<!!)\[[^\]]*\]\((docs/[^)#]+)", text))
    assert {"docs/guide.md", "docs/performance.md", "docs/configuration.md"} <= linked
    for target in linked:
        assert (REPO / target).is_file(), target


# --------------------------------------------------------------------------- placement core purity


PURITY_PROBE = """
import contextlib, importlib, importlib.util, io, json, pkgutil, runpy, sys
import apps.placement as core
names = []
for info in pkgutil.walk_packages(core.__path__, "apps.placement."):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue
    importlib.import_module(info.name)
    names.append(info.name)
has_cli = importlib.util.find_spec("apps.placement.__main__") is not None
if has_cli:
    sys.argv = ["apps.placement", "--help"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        runpy.run_module("apps.placement", run_name="__main__")
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("django", "rest_framework", "celery"))
print(json.dumps({"modules": names, "cli": has_cli, "bad": bad}))
"""


def test_placement_core_imports_no_django_drf_or_celery():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    run = subprocess.run(
        [sys.executable, "-c", PURITY_PROBE], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert "apps.placement.topology" in result["modules"]
    assert result["bad"] == []


def test_the_agents_service_keeps_a_connection_per_sync_thread():
    """uvicorn's sync threads are few (topoweb.agents_asgi.SYNC_THREADS) and a waiting poll holds no
    thread there: each keeps its connection instead of a checkout from a pool on every sync."""
    from topoweb.agents_asgi import SYNC_THREADS

    agents = COMPOSE["services"]["agents"]
    assert "uvicorn" in agents["command"] and "TOPOWEB_DB_POOL_MAX" not in agents.get("environment", {})
    workers = int(next(a for a in agents["command"] if a.startswith("--workers=")).split("=")[1])
    # Postgres's default max_connections (100) holds both processes' threads and web's pools.
    assert (
        workers * (SYNC_THREADS + 1)
        + 2 * int(COMPOSE["services"]["web"]["environment"]["TOPOWEB_DB_POOL_MAX"])
        < 100
    )


def test_scripts_run_from_tests_are_stopped_past_their_cpu_budget():
    import signal
    import sys

    from tests.scripts import run_script

    done = run_script([sys.executable, "-c", "while True: pass"], cpu_s=1)
    assert done.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
