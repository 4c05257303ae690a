"""End-to-end setup: the system Chromium for pytest-playwright, a live server, demo data.

Every test here is marked `e2e`. Screenshots go to test-artifacts/e2e/ (git-ignored).
"""

from __future__ import annotations

import os
from pathlib import Path

# The live server runs Django's sync ORM while Playwright's event loop is alive in this thread.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

import pytest  # noqa: E402

from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
ARTIFACTS = REPO_ROOT / "test-artifacts" / "e2e"
PASSWORD = "e2e-password"


def screenshot_folder() -> Path:
    """docs/screenshots/ (the images the docs show) with TOPOWEB_SCREENSHOTS=1, otherwise
    test-artifacts/e2e/, so that a test run leaves the checkout as it was."""
    folder = REPO_ROOT / "docs" / "screenshots" if os.environ.get("TOPOWEB_SCREENSHOTS") == "1" else ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


def _admin(user):
    """`user` in the admin role."""
    from apps.api.roles import role_grant

    role_grant(user=user, role="admin")
    return user


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Launch the system Chromium (never a downloaded browser) headless and offline."""
    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"no Chromium at {CHROMIUM} (CI=true, so this is a failure)", pytrace=False)
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1500, "height": 1000}}


@pytest.fixture
def shot(page):
    """Save a full-page screenshot of the current page as test-artifacts/e2e/NAME.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def _shot(name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return _shot


def _job(name, gpus, *, tp=1, pp=1, policy=None, bytes_=1e9):
    spec = {
        "version": 1,
        "name": name,
        "gpus": gpus,
        "parallelism": {"tp": tp, "pp": pp, "dp": gpus // (tp * pp), "ep": 1},
        "model": {"flops_per_step": 3e14 * gpus},
        "step": {"compute_ms": 500, "overlap": 0.2},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": bytes_}],
        "estimated_runtime_s": 3600,
    }
    if tp > 1:
        spec["comm"].append({"group": "tp", "collective": "allreduce", "bytes": 6.4e7, "count": 16})
    if policy:
        spec["policy"] = policy
    return spec


@pytest.fixture
def scenario(transactional_db):
    """Users ops (staff), alice and bob; pod-256 with four running jobs and one waiting; case-4-4
    with alice's naive placement of the seed job and its topo migration proposal."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from apps.placement.topology import read_spec_file
    from apps.scheduling import services
    from apps.scheduling.models import Job
    from apps.topology.services import cluster_import

    users = get_user_model()
    people = {
        "ops": _admin(users.objects.create_user("ops", password=PASSWORD, is_staff=True)),
        "alice": users.objects.create_user("alice", password=PASSWORD),
        "bob": users.objects.create_user("bob", password=PASSWORD),
    }
    pod = cluster_import(data=read_spec_file(str(EXAMPLES / "pod-256.yaml")))
    case = cluster_import(data=read_spec_file(str(EXAMPLES / "case-4-4.yaml")))
    with transaction.atomic():
        for owner, spec in (
            ("alice", _job("llm-tp8-pp2", 64, tp=8, pp=2)),
            ("bob", _job("bob-dp32", 32)),
            ("alice", _job("spread-naive", 16, tp=8, policy="naive")),
            ("bob", _job("bob-dp8", 8)),
            ("alice", _job("waits-for-240", 240)),
        ):
            services.job_submit(user=people[owner], spec=spec, cluster=pod)
        seed = read_spec_file(str(EXAMPLES / "case-4-4-job.yaml"))
        seed["policy"] = "naive"
        services.job_submit(user=people["alice"], spec=seed, cluster=case)
    for cluster in (pod, case):
        services.schedule_cluster(cluster=cluster)
    for job in Job.objects.filter(status="placing"):
        services.job_start(job=job)
    services.migrations_propose(cluster=case)
    jobs = {j.name: j for j in Job.objects.all()}
    return {"people": people, "pod": pod, "case": case, "jobs": jobs}


@pytest.fixture
def login(page, live_server):
    """Log `page` in through the login form as one of the scenario's users."""

    def _login(username: str) -> None:
        page.goto(f"{live_server.url}/accounts/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/**")

    return _login


# How long a browser test waits for a state (a selector, a text, a function) before failing. The
# tests wait for states, never for fixed times, so a slow machine only makes them slower: at a load
# average of 15 on 2 cores a 16k-GPU page or a queue refresh can take tens of seconds.
STATE_TIMEOUT_MS = 120_000


@pytest.fixture
def laptop(page, login):
    """Staff ("ops", once the users exist) signed in on a 1366x768 page; call it to get the page."""

    def _open():
        page.set_viewport_size({"width": 1366, "height": 768})
        login("ops")
        return page

    return _open


@pytest.fixture(autouse=True)
def patient_waits(request):
    """Every page and `expect` of an e2e test waits up to STATE_TIMEOUT_MS for its state."""
    if "page" not in request.fixturenames:
        yield
        return
    from playwright.sync_api import expect

    page = request.getfixturevalue("page")
    page.set_default_timeout(STATE_TIMEOUT_MS)
    page.set_default_navigation_timeout(STATE_TIMEOUT_MS)
    expect.set_options(timeout=STATE_TIMEOUT_MS)
    yield
    expect.set_options(timeout=5_000)


@pytest.fixture(autouse=True)
def no_csp_violations(request):
    """Fail an e2e test whose pages broke the Content-Security-Policy (Chromium reports each
    blocked script, style, image or eval as a console error)."""
    if "page" not in request.fixturenames:
        yield
        return
    page = request.getfixturevalue("page")
    blocked: list[str] = []
    page.on(
        "console",
        lambda msg: blocked.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    yield
    assert not blocked, f"Content-Security-Policy violations: {blocked}"
