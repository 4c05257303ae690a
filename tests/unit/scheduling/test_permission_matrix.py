"""The permission matrix: every API endpoint and dashboard page, called by an anonymous client, the
job's owner, another user, the cluster's launcher token, each role (viewer, submitter, operator,
admin; staff so the admin site lets them in), a superuser, the coordinator of the owner's account
("coordinator") and the coordinator of another account ("rival"), neither with a role. Each cell is the status the
documented rules give (docs/guide.md, "Roles and permissions"); every call runs in a savepoint that is
rolled back, so the cells do not change each other's world (and one world serves them all)."""

from __future__ import annotations

import copy

import plotly
import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import transaction
from rest_framework.test import APIClient

from apps.api.roles import role_grant
from apps.placement.topology import read_spec_file
from apps.scheduling import services
from apps.scheduling.models import Account, AccountMembership, Qos, SchedulingCycle
from apps.topology import services as topology_services
from apps.topology.models import Gpu, Link, Node, Switch

from .conftest import EXAMPLES, small_spec, token_client

pytestmark = pytest.mark.django_db

CALLERS = (
    "anonymous",
    "owner",
    "other",
    "launcher",
    "viewer",
    "submitter",
    "operator",
    "admin",
    "superuser",
    "coordinator",
    "rival",
)
# Coordinators hold no role: where a row does not name them they answer as another user does.
COORDINATORS = ("coordinator", "rival")
ROLES = ("viewer", "submitter", "operator", "admin")
# Expected cells that are redirects: to the site's login page, or to the admin site's.
LOGIN, ADMIN_LOGIN = "login", "admin-login"


def cells(default, **special) -> dict:
    """Every caller's expected answer: `default`, except the named callers (coordinators, unless
    named, as "other")."""
    other = special.get("other", default)
    return {caller: special.get(caller, other if caller in COORDINATORS else default) for caller in CALLERS}


def api_read(**special) -> dict:
    """A read any signed-in user may do; launchers may not."""
    return cells(200, **({"anonymous": 401, "launcher": 403} | special))


def operators(code, **special) -> dict:
    """Operators, admins and superusers only."""
    return cells(403, **({"anonymous": 401, "operator": code, "admin": code, "superuser": code} | special))


def admins(code, **special) -> dict:
    """Admins and superusers only."""
    return cells(403, **({"anonymous": 401, "admin": code, "superuser": code} | special))


# The owner's job as each caller sees it: the launcher of its cluster and its account's coordinator
# too, other users (another account's coordinator among them) not at all.
JOB_READ = api_read(launcher=200, other=404, submitter=404, coordinator=200)
LIFECYCLE = operators(200, launcher=200, coordinator=403)
# Operators' actions on one job that its account's coordinator may take too.
MANAGE = operators(200, owner=403, other=404, submitter=404, coordinator=200)
PAGE = cells(200, anonymous=LOGIN, launcher=LOGIN)
ADMIN_PAGE = cells(ADMIN_LOGIN, viewer=200, submitter=200, operator=200, admin=200, superuser=200)

MATRIX = [
    # Node agents: only a node's own token syncs (no user, launcher or superuser credential does).
    ("POST", "/api/v1/agents/sync/", {"version": "1"}, cells(401)),
    # Rank logs: users who may see the job; not the launcher token.
    (
        "GET",
        "/api/v1/jobs/{job}/logs/",
        None,
        api_read(launcher=401, other=404, submitter=404, coordinator=200),
    ),
    # Topology API.
    ("GET", "/api/v1/clusters/", None, api_read()),
    ("GET", "/api/v1/clusters/{cluster}/", None, api_read()),
    ("GET", "/api/v1/clusters/{cluster}/export/", None, api_read()),
    ("PATCH", "/api/v1/clusters/{cluster}/", {"policy": "naive"}, operators(200)),
    (
        "PUT",
        "/api/v1/clusters/{cluster}/",
        {"description": "d", "policy": "topo", "preemption_enabled": False, "backfill_enabled": True},
        operators(200),
    ),
    ("DELETE", "/api/v1/clusters/{spare}/", None, admins(204)),
    ("POST", "/api/v1/clusters/", "new-spec", admins(201)),
    ("POST", "/api/v1/clusters/import/", "new-spec", admins(201)),
    ("POST", "/api/v1/clusters/import/?replace=true", "spare-spec", admins(200)),
    ("GET", "/api/v1/switches/", None, api_read()),
    ("GET", "/api/v1/switches/{switch}/", None, api_read()),
    ("GET", "/api/v1/links/", None, api_read()),
    ("GET", "/api/v1/links/{link}/", None, api_read()),
    ("GET", "/api/v1/nodes/", None, api_read()),
    ("GET", "/api/v1/nodes/{node}/", None, api_read()),
    ("GET", "/api/v1/gpus/", None, api_read()),
    # QOS: every signed-in user reads them, operators (and admins) change them.
    ("GET", "/api/v1/qos/", None, api_read()),
    ("GET", "/api/v1/qos/{qos}/", None, api_read()),
    ("POST", "/api/v1/qos/", {"cluster": "spare", "name": "extra", "priority": 5}, operators(201)),
    ("PATCH", "/api/v1/qos/{qos}/", {"priority": 7}, operators(200)),
    ("DELETE", "/api/v1/qos/{qos}/", None, operators(204)),
    ("GET", "/api/v1/gpus/{gpu}/", None, api_read()),
    # Scheduling API.
    ("GET", "/api/v1/jobs/", None, api_read(launcher=200)),
    ("POST", "/api/v1/jobs/", "job-spec", cells(201, anonymous=401, launcher=403)),
    ("GET", "/api/v1/jobs/{job}/", None, JOB_READ),
    ("GET", "/api/v1/jobs/{job}/placement/", None, JOB_READ),
    ("GET", "/api/v1/jobs/{job}/rankmap/", None, JOB_READ),
    ("GET", "/api/v1/jobs/{job}/rankmap/?format=torchrun", None, JOB_READ),
    ("POST", "/api/v1/jobs/{job}/cancel/", None, MANAGE | {"owner": 200}),
    ("POST", "/api/v1/jobs/{waiting}/hold/", None, MANAGE),
    ("POST", "/api/v1/jobs/{held}/release/", None, MANAGE),
    ("POST", "/api/v1/jobs/{job}/requeue/", None, MANAGE),
    ("GET", "/api/v1/jobs/{job}/priority/", None, JOB_READ | {"launcher": 403}),
    ("POST", "/api/v1/jobs/{waiting}/priority/", {"priority": 5}, MANAGE),
    # Another account's jobs: its coordinator is a stranger to them.
    (
        "POST",
        "/api/v1/jobs/{rivals_job}/hold/",
        None,
        operators(200, owner=404, other=404, submitter=404, rival=200),
    ),
    # Which of its account's QOS a member may use: the account's coordinator and admins.
    ("GET", "/api/v1/memberships/", None, api_read()),
    ("GET", "/api/v1/memberships/{membership}/", None, JOB_READ | {"launcher": 403}),
    (
        "PATCH",
        "/api/v1/memberships/{membership}/",
        {"qos": []},
        admins(200, other=404, submitter=404, coordinator=200),
    ),
    # Cluster-wide: drains stay with operators (a coordinator is refused like any user).
    ("POST", "/api/v1/node-health/{node}/drain/", {"reason": "maintenance"}, operators(200, launcher=401)),
    ("POST", "/api/v1/jobs/{job}/start/", None, LIFECYCLE),
    ("POST", "/api/v1/jobs/{job}/complete/", None, LIFECYCLE),
    ("POST", "/api/v1/jobs/{job}/fail/", {"reason": "ECC"}, LIFECYCLE),
    ("POST", "/api/v1/placements/preview/", "job-spec", api_read()),
    ("GET", "/api/v1/migrations/", None, api_read()),
    ("GET", "/api/v1/migrations/{proposal}/", None, api_read(other=404, submitter=404)),
    ("POST", "/api/v1/migrations/{proposal}/apply/", None, operators(200)),
    ("POST", "/api/v1/migrations/{proposal}/reject/", None, operators(200)),
    (
        "GET",
        "/api/v1/cycles/",
        None,
        cells(403, anonymous=401, viewer=200, operator=200, admin=200, superuser=200),
    ),
    (
        "GET",
        "/api/v1/cycles/{cycle}/",
        None,
        cells(403, anonymous=401, viewer=200, operator=200, admin=200, superuser=200),
    ),
    ("GET", "/api/v1/usage/?start=2026-01-01T00:00Z&end=2026-01-02T00:00Z", None, api_read()),
    ("GET", "/api/schema/", None, cells(200)),
    ("GET", "/api/docs/", None, cells(200)),
    # Dashboard pages (session sign-in; a launcher token is no session).
    ("GET", "/", None, PAGE),
    ("GET", "/clusters/?name=case-4-4", None, cells(302, anonymous=LOGIN, launcher=LOGIN)),
    ("GET", "/clusters/case-4-4/", None, PAGE),
    ("GET", "/clusters/case-4-4/version/", None, PAGE),
    ("GET", "/queue/", None, PAGE),
    (
        "GET",
        "/jobs/{job}/",
        None,
        cells(200, anonymous=LOGIN, launcher=LOGIN, other=404, submitter=404, coordinator=200),
    ),
    # The job page's buttons: the same rule as the API (a redirect back to the page when allowed).
    (
        "POST",
        "/jobs/{waiting}/hold/",
        None,
        cells(403, anonymous=LOGIN, launcher=LOGIN, other=404, submitter=404, operator=302)
        | {"admin": 302, "superuser": 302, "coordinator": 302},
    ),
    (
        "POST",
        "/jobs/{job}/cancel/",
        None,
        cells(403, anonymous=LOGIN, launcher=LOGIN, other=404, submitter=404, operator=302)
        | {"owner": 302, "admin": 302, "superuser": 302, "coordinator": 302},
    ),
    (
        "POST",
        "/jobs/{job}/migrations/{proposal}/apply/",
        None,
        cells(403, anonymous=LOGIN, launcher=LOGIN, operator=302, admin=302, superuser=302),
    ),
    (
        "POST",
        "/jobs/{job}/migrations/{proposal}/reject/",
        None,
        cells(403, anonymous=LOGIN, launcher=LOGIN, operator=302, admin=302, superuser=302),
    ),
    ("GET", "/import/", None, cells(403, anonymous=LOGIN, launcher=LOGIN, admin=200, superuser=200)),
    ("GET", f"/vendor/plotly-{plotly.__version__}.min.js", None, cells(200)),
    ("GET", "/healthz", None, cells(200)),
    # From loopback without TOPOWEB_METRICS_TOKEN (the test client's address): anyone.
    ("GET", "/metrics", None, cells(200)),
    ("GET", "/usage.csv?range=24h", None, PAGE),
    # The admin site: the staff flag opens it, the same model permissions decide what is inside.
    ("GET", "/admin/", None, ADMIN_PAGE),
    ("GET", "/admin/topology/cluster/", None, ADMIN_PAGE),
    ("GET", "/admin/topology/cluster/{cluster}/change/", None, ADMIN_PAGE),
    (
        "GET",
        "/admin/topology/cluster/{spare}/delete/",
        None,
        ADMIN_PAGE | {"viewer": 403, "submitter": 403, "operator": 403},
    ),
    (
        "GET",
        "/admin/topology/cluster/add/",
        None,
        ADMIN_PAGE | {"viewer": 403, "submitter": 403, "operator": 403},
    ),
    ("GET", "/admin/scheduling/job/", None, ADMIN_PAGE | {"submitter": 403}),
    ("GET", "/admin/scheduling/schedulingcycle/", None, ADMIN_PAGE | {"submitter": 403}),
]


# A one-leaf, one-spine cluster with no jobs: for deletion, replacement and a link to read.
SPARE = {
    "shape": "leaf-spine",
    "spines": 1,
    "leaves": 1,
    "nodes_per_leaf": 1,
    "gpus_per_node": 8,
    "gpu_model": "H100",
    "peak_tflops": 989,
    "nvlink_bw_GBps": 450,
    "nic_bw_GBps": 50,
    "nics_per_node": 8,
    "uplink_bw_GBps": 400,
}


@pytest.fixture
def world(case44, committed):
    """Two clusters, a running job of "owner" with an open migration proposal, and every caller."""
    users = get_user_model().objects
    people = {"owner": users.create_user("owner"), "other": users.create_user("other")}
    for role in ROLES:
        people[role] = users.create_user(role, is_staff=True)
        role_grant(user=people[role], role=role)
    people["superuser"] = users.create_superuser("root")
    people["coordinator"] = users.create_user("coordinator")
    people["rival"] = users.create_user("rival")
    team, rivals = Account.objects.create(name="team"), Account.objects.create(name="rivals")
    membership = AccountMembership.objects.create(user=people["owner"], account=team, is_default=True)
    AccountMembership.objects.create(user=people["coordinator"], account=team, is_coordinator=True)
    AccountMembership.objects.create(user=people["rival"], account=rivals, is_coordinator=True)
    rival_member = users.create_user("rival-member")
    AccountMembership.objects.create(user=rival_member, account=rivals, is_default=True)
    spare_spec = {"version": 1, "name": "spare", "generate": SPARE}
    spare = topology_services.cluster_import(data=copy.deepcopy(spare_spec))
    job = committed(services.job_submit, user=people["owner"], spec=small_spec("spread", 8, policy="naive"))
    committed(services.job_start, job=job)
    [proposal] = services.migrations_propose(cluster=case44)
    waiting = committed(services.job_submit, user=people["owner"], spec=small_spec("wide", 16))
    held = committed(services.job_submit, user=people["owner"], spec=small_spec("wider", 16))
    services.job_hold(job=held, user=people["superuser"])
    rivals_job = committed(services.job_submit, user=rival_member, spec=small_spec("theirs", 16))
    ids = {
        "cluster": case44.pk,
        "spare": spare.pk,
        "job": job.pk,
        "proposal": proposal.pk,
        "cycle": SchedulingCycle.objects.filter(cluster=case44).values_list("pk", flat=True).first(),
        "switch": Switch.objects.filter(cluster=case44).values_list("pk", flat=True).first(),
        "link": Link.objects.filter(cluster=spare).values_list("pk", flat=True).first(),
        "node": Node.objects.filter(cluster=case44).values_list("pk", flat=True).first(),
        "gpu": Gpu.objects.filter(node__cluster=case44).values_list("pk", flat=True).first(),
        "qos": Qos.objects.create(cluster=spare, name="scratch").pk,
        "waiting": waiting.pk,
        "held": held.pk,
        "rivals_job": rivals_job.pk,
        "membership": membership.pk,
    }
    bodies = {
        "new-spec": read_spec_file(EXAMPLES / "case-4-4.yaml") | {"name": "fresh"},
        "spare-spec": spare_spec,
        "job-spec": small_spec("more", 1),
    }
    _, launcher = services.launcher_token_create(cluster=case44)
    return people, ids, bodies, launcher


def client_for(caller: str, people: dict, launcher, *, api: bool) -> APIClient:
    """A new client for the cell (its own cookies and credentials)."""
    if caller == "launcher":
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Launcher {launcher}")
    elif caller != "anonymous" and api:
        client = token_client(people[caller])
    else:
        client = APIClient()
        if caller != "anonymous":
            client.force_login(people[caller])
    return client


def answer(response) -> int | str:
    """The response's status, or LOGIN / ADMIN_LOGIN for a redirect to a sign-in page."""
    location = response.get("Location", "")
    if response.status_code == 302 and location.startswith("/admin/login/"):
        return ADMIN_LOGIN
    if response.status_code == 302 and location.startswith("/accounts/login/"):
        return LOGIN
    return response.status_code


def test_permission_matrix(world):
    people, ids, bodies, launcher = world
    mismatches = {}
    for method, template, body, expected in MATRIX:
        url = template.format(**ids)
        api = url.startswith("/api/")
        for caller in CALLERS:
            cache.clear()
            client = client_for(caller, people, launcher, api=api)
            with transaction.atomic():
                data = copy.deepcopy(bodies[body] if isinstance(body, str) else body)
                response = getattr(client, method.lower())(
                    url, data, format="json" if data is not None else None
                )
                got = answer(response)
                transaction.set_rollback(True)
            if got != expected[caller]:
                mismatches.setdefault(f"{method} {template}", {})[caller] = {
                    "got": got,
                    "expected": expected[caller],
                }
    assert mismatches == {}
