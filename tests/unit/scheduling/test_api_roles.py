"""Roles (viewer, submitter, operator, admin) as Django model permissions that the API and the
admin site both check; launcher tokens limited to their cluster's job lifecycle; throttles per
token and per user; failed sign-ins and token attempts throttled."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.test import RequestFactory
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from apps.api.roles import ROLES
from apps.scheduling import services
from apps.scheduling.models import Job
from apps.topology.models import Cluster

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db


def launcher_client(cluster, **extra) -> APIClient:
    client = APIClient(**extra)
    client.credentials(HTTP_AUTHORIZATION=f"Launcher {services.launcher_token_create(cluster=cluster)[1]}")
    return client


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()
    yield
    cache.clear()


def test_migrate_creates_the_four_role_groups():
    assert set(Group.objects.values_list("name", flat=True)) >= set(ROLES)
    viewer = {p.codename for p in Group.objects.get(name="viewer").permissions.all()}
    assert "view_job" in viewer and not any(c.startswith(("add_", "change_", "delete_")) for c in viewer)
    admin_perms = {p.codename for p in Group.objects.get(name="admin").permissions.all()}
    assert {"add_cluster", "delete_cluster", "change_job", "add_launchertoken"} <= admin_perms


@pytest.mark.parametrize(
    ("role", "patch", "delete", "lifecycle"),
    [
        ("", 403, 403, 403),
        ("viewer", 403, 403, 403),
        ("submitter", 403, 403, 403),
        ("operator", 200, 403, 200),
        ("admin", 200, 204, 200),
    ],
)
def test_staff_flag_alone_changes_nothing_and_roles_match_the_admin_site(
    case44, make_user, committed, role, patch, delete, lifecycle
):
    user = make_user("person", role=role)
    user.is_staff = True
    user.save()
    api = token_client(user)
    owner = make_user("owner")
    job = committed(services.job_submit, user=owner, spec=small_spec("j", 2))
    assert api.post(f"/api/v1/jobs/{job.pk}/start/").status_code == lifecycle
    url = f"/api/v1/clusters/{case44.pk}/"
    assert api.patch(url, {"policy": "naive"}, format="json").status_code == patch
    # The admin site answers the same question with the same permissions.
    request = RequestFactory().get("/admin/")
    request.user = user
    model_admin = admin.site._registry[Cluster]
    assert model_admin.has_change_permission(request, case44) == (patch == 200)
    assert model_admin.has_delete_permission(request, case44) == (delete == 204)
    assert api.delete(url).status_code == delete


def test_viewer_sees_every_job_but_cancels_none(case44, make_user):
    owner = make_user("owner")
    job = services.job_submit(user=owner, spec=small_spec("j", 1))
    viewer = token_client(make_user("watcher", role="viewer"))
    assert viewer.get("/api/v1/jobs/").json()["count"] == 1
    assert viewer.get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    assert viewer.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert viewer.get("/api/v1/cycles/").status_code == 200


def test_submission_can_be_limited_to_the_submitter_role(case44, make_user, settings):
    settings.ANY_USER_SUBMITS = False
    plain = token_client(make_user("plain"))
    submitter = token_client(make_user("sub", role="submitter"))
    assert plain.post("/api/v1/jobs/", small_spec("a", 1), format="json").status_code == 403
    assert submitter.post("/api/v1/jobs/", small_spec("b", 1), format="json").status_code == 201


def test_launcher_token_runs_its_clusters_lifecycle_and_nothing_more(case44, pod256, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("l", 2))
    own, other = launcher_client(case44), launcher_client(pod256)
    assert other.post(f"/api/v1/jobs/{job.pk}/start/").status_code == 404
    assert own.get(f"/api/v1/jobs/{job.pk}/rankmap/").status_code == 200
    assert own.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert own.post("/api/v1/jobs/", small_spec("x", 1), format="json").status_code == 403
    assert own.post("/api/v1/placements/preview/", small_spec("x", 1), format="json").status_code in (
        401,
        403,
    )
    for url in ("/api/v1/cycles/", "/api/v1/migrations/", "/api/v1/nodes/", f"/api/v1/clusters/{case44.pk}/"):
        assert own.get(url).status_code in (401, 403), url
    assert own.post(f"/api/v1/jobs/{job.pk}/start/").json()["status"] == "running"
    assert own.post(f"/api/v1/jobs/{job.pk}/complete/").json()["status"] == "completed"


def test_launchers_are_throttled_per_token_whatever_x_forwarded_for_says(
    case44, monkeypatch, throttle_window
):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"launcher": "3/min", "user": "1000/min"})
    first, second = launcher_client(case44), launcher_client(case44)
    codes = [
        first.get("/api/v1/jobs/", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}", REMOTE_ADDR=f"10.1.0.{i}").status_code
        for i in range(4)
    ]
    assert codes == [200, 200, 200, 429]
    assert second.get("/api/v1/jobs/").status_code == 200


def test_failed_sign_ins_slow_the_username_and_address_pair_only(alice, client, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    for _ in range(3):
        response = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
        assert response.status_code == 200 and not response.wsgi_request.user.is_authenticated
    # From the attacker's address the right password must wait out the delay...
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert not response.wsgi_request.user.is_authenticated
    assert "_auth_user_id" not in client.session
    # ...the owner signing in from elsewhere is not slowed at all.
    response = client.post(
        "/accounts/login/", {"username": "alice", "password": "pw-alice"}, REMOTE_ADDR="10.2.3.4"
    )
    assert response.status_code == 302
    cache.clear()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302


def test_the_admin_login_is_throttled_too(make_user, client, settings):
    make_user("ops", staff=True)
    settings.LOGIN_FAILURE_LIMIT = 2
    for _ in range(2):
        client.post("/admin/login/", {"username": "ops", "password": "wrong"})
    client.post("/admin/login/", {"username": "ops", "password": "pw-ops"})
    assert "_auth_user_id" not in client.session


def test_failed_api_tokens_are_throttled_per_address_and_valid_ones_never(alice, settings):
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 3
    good = token_client(alice)
    for scheme in ("Token", "Token", "Launcher"):
        bad = APIClient(HTTP_AUTHORIZATION=f"{scheme} {'0' * 40}")
        assert bad.get("/api/v1/jobs/").status_code in (401, 429)
    assert APIClient(HTTP_AUTHORIZATION=f"Token {'1' * 40}").get("/api/v1/jobs/").status_code == 429
    assert good.get("/api/v1/jobs/", REMOTE_ADDR="127.0.0.1").status_code == 200


@pytest.mark.parametrize(
    ("keyword", "url", "unknown"),
    [
        ("Launcher", "/api/v1/jobs/", "Invalid launcher token."),
        ("Node", "/api/v1/agents/sync/", "Invalid or revoked node token."),
    ],
)
def test_launcher_and_node_keys_say_what_is_wrong_and_a_repeated_bad_key_gets_429(
    keyword, url, unknown, settings
):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 1000

    def answer(header: str) -> tuple[int, str]:
        response = APIClient(HTTP_AUTHORIZATION=header).post(url, {}, format="json")
        return response.status_code, response.json()["detail"]

    expected = f"Invalid {keyword} header: expected 'Authorization: {keyword} <key>'."
    assert answer(f"{keyword} two parts") == (401, expected)
    assert answer(f"{keyword} \xff\xfe") == (401, f"Invalid {keyword} header: the key is not text.")
    bad = f"{keyword} {'ab' * 20}"
    assert [answer(bad)[0] for _ in range(4)] == [401, 401, 429, 429]
    assert answer(f"{keyword} {'cd' * 20}") == (401, unknown)


def test_nothing_half_written_when_a_submission_is_refused(case44, make_user, settings):
    settings.ANY_USER_SUBMITS = False
    token_client(make_user("plain")).post("/api/v1/jobs/", small_spec("a", 1), format="json")
    assert not Job.objects.exists()


def test_a_user_token_is_one_indexed_query_then_one_for_the_roles(alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token

    from apps.api.authentication import TokenAuthentication

    key = Token.objects.get_or_create(user=alice)[0].key
    with CaptureQueriesContext(connection) as queries:
        user, token = TokenAuthentication().authenticate_credentials(key)
        user.has_perm("scheduling.view_job")  # read with the token, no query of its own
    assert user == alice and token.key == key
    assert len(queries) == 3
    sql = queries[0]["sql"]
    assert "ORDER BY" not in sql
    assert "auth_permission" in queries[1]["sql"]
    # The accounts the user coordinates (which jobs they see), remembered with the token too.
    assert "scheduling_accountmembership" in queries[2]["sql"]


def test_a_valid_user_token_is_read_once_within_its_time_and_each_request_gets_its_own_user(alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token

    from apps.api.authentication import TokenAuthentication

    key = Token.objects.get_or_create(user=alice)[0].key
    with CaptureQueriesContext(connection) as queries:
        first, _ = TokenAuthentication().authenticate_credentials(key)
        first.is_staff = True  # what one request does to its user stays its own
        second, token = TokenAuthentication().authenticate_credentials(key)
        assert not second.has_perm("scheduling.change_job")
    assert len(queries) == 3  # the token with its user and account, the permissions, the coordinated accounts
    assert second == alice and token.key == key and second is not first and not second.is_staff


def test_a_role_granted_or_revoked_reaches_a_remembered_token_at_once(alice):
    from django.contrib.auth.models import Group
    from rest_framework.authtoken.models import Token

    from apps.api.authentication import TokenAuthentication
    from apps.api.roles import role_grant

    key = Token.objects.get_or_create(user=alice)[0].key
    assert not TokenAuthentication().authenticate_credentials(key)[0].has_perm("scheduling.change_job")
    role_grant(user=alice, role="operator")
    assert TokenAuthentication().authenticate_credentials(key)[0].has_perm("scheduling.change_job")
    Group.objects.get(name="operator").permissions.clear()
    assert not TokenAuthentication().authenticate_credentials(key)[0].has_perm("scheduling.change_job")


def test_a_deleted_token_or_a_deactivated_user_is_refused_at_once(alice, make_user):
    from rest_framework.authtoken.models import Token
    from rest_framework.exceptions import AuthenticationFailed

    from apps.api.authentication import TokenAuthentication

    key = Token.objects.get_or_create(user=alice)[0].key
    TokenAuthentication().authenticate_credentials(key)
    Token.objects.get(key=key).delete()
    with pytest.raises(AuthenticationFailed):
        TokenAuthentication().authenticate_credentials(key)
    bob = make_user("bob")
    key = Token.objects.create(user=bob).key
    TokenAuthentication().authenticate_credentials(key)
    bob.is_active = False
    bob.save()
    with pytest.raises(AuthenticationFailed):
        TokenAuthentication().authenticate_credentials(key)


def test_a_change_made_elsewhere_reaches_a_remembered_token_within_its_time(alice, monkeypatch):
    # Another process deactivating the user sends no signal here: the remembered token works until
    # USER_TOKEN_CACHE_S has passed, then the user is read again and refused.
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token
    from rest_framework.exceptions import AuthenticationFailed

    from apps.api import authentication

    clock = [1000.0]
    monkeypatch.setattr(authentication.time, "monotonic", lambda: clock[0])
    key = Token.objects.get_or_create(user=alice)[0].key
    authentication.TokenAuthentication().authenticate_credentials(key)
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)  # no signal
    clock[0] += authentication.USER_TOKEN_CACHE_S - 0.5
    authentication.TokenAuthentication().authenticate_credentials(key)
    clock[0] += 1.0
    with pytest.raises(AuthenticationFailed):
        authentication.TokenAuthentication().authenticate_credentials(key)
