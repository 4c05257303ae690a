"""Shared test setup: the testing flag, Hypothesis' profiles, and guards for tests that need
Postgres or Redis.

A test that needs a service skips when the service is absent, except under CI=true, where a missing
service is a failure (CI must run everything). With TOPOWEB_SKIPS_FILE set (scripts/test.sh sets
it), each skipped test's reason is appended to that file, one line each.
"""

import os
import sys
from pathlib import Path

# Before Django settings load in subprocesses started by tests (fast hasher, relaxed checks).
os.environ.setdefault("TOPOWEB_TESTING", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests are budgeted by examples (each test's max_examples), never by wall time: no
# per-example deadline and no "too slow" health check, which a loaded machine would trip. Under
# CI, Hypothesis' own "ci" profile (the same, derandomized: each run tries the same examples).
settings.register_profile("topoweb", deadline=None, suppress_health_check=[HealthCheck.too_slow])

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"


def in_ci() -> bool:
    """True when running under CI (the CI variable set to true/1/yes)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "topoweb"))


def pytest_runtest_logreport(report) -> None:
    """Append a skipped test's reason to TOPOWEB_SKIPS_FILE (when set)."""
    path = os.environ.get("TOPOWEB_SKIPS_FILE")
    if not path or not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = " ".join(reason.removeprefix("Skipped: ").split())[:200]
    with open(path, "a", encoding="utf-8") as out:
        out.write(reason + "\n")


def service_missing(reason: str) -> None:
    """Skip the test, or fail it under CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def require_postgres() -> dict:
    """The Postgres connection settings of the test run; skips (fails under CI) without Postgres."""
    import psycopg
    from django.db import connection

    if connection.vendor != "postgresql":
        service_missing("needs Postgres: run with DATABASE_URL=postgres://...")
    s = connection.settings_dict
    try:
        psycopg.connect(
            host=s["HOST"] or None,
            port=s["PORT"] or None,
            user=s["USER"] or None,
            password=s["PASSWORD"] or None,
            dbname="postgres",
            connect_timeout=3,
        ).close()
    except psycopg.OperationalError as exc:
        service_missing(f"Postgres at {s['HOST']}:{s['PORT']} is not reachable: {exc}")
    return s


@pytest.fixture(scope="session")
def require_redis() -> str:
    """The Redis broker URL of the test run; skips (fails under CI) without Redis."""
    import redis
    from django.conf import settings

    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        service_missing("needs Redis: run with CELERY_BROKER_URL=redis://...")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        service_missing(f"Redis at {url} is not reachable: {exc}")
    return url


@pytest.fixture(autouse=True)
def forget_recent_clusters():
    """Each test starts with no cluster row kept by submissions (a row kept from an earlier test's
    database would cost a retry, and queries a test may count)."""
    kept = sys.modules.get("apps.topology.selectors")
    if kept is not None:
        kept.forget_recent_clusters()
    # Nor a sync pulse remembered from an earlier test's database.
    agents = sys.modules.get("apps.executors.agents.services")
    if agents is not None:
        agents.forget_sync_pulse()
    # Nor the GPU indexes of a node with the same id in an earlier test's database.
    selectors = sys.modules.get("apps.executors.agents.selectors")
    if selectors is not None:
        selectors.forget_gpu_indexes()
    # Nor a submitter's account, QOS or owner check read for an earlier test's.
    reads = sys.modules.get("apps.scheduling.recent")
    if reads is not None:
        reads.forget()
