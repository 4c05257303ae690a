"""Node agent tokens: the command that makes them, the stored hash, the admin's revoke action."""

from __future__ import annotations

import io
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.scheduling.models import NodeToken
from apps.scheduling.node_models import node_key_hash


def sync_as(key: str, **body):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    return client.post("/api/v1/agents/sync/", {"version": "1", **body}, format="json")


def test_create_node_token_prints_a_key_stored_only_as_its_hash(case44):
    out = io.StringIO()
    call_command("create_node_token", "case-4-4", "node-b", stdout=out)
    key = out.getvalue().strip()
    token = NodeToken.objects.get()
    assert (
        token.node.name == "node-b" and token.key_hash == node_key_hash(key) and key.startswith(token.prefix)
    )
    assert key not in str(NodeToken.objects.values_list(flat=True))
    body = sync_as(key).json()
    assert body["node"] == "node-b"
    assert sync_as(key, node="node-a").status_code == 403


def test_create_node_token_all_writes_one_private_file_per_node(case44, tmp_path):
    out = tmp_path / "tokens"
    call_command("create_node_token", "case-4-4", "--all", "--out", str(out), stdout=io.StringIO())
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [f"node-{c}.token" for c in "ab"]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert sync_as(path.read_text().strip()).json()["node"] == path.name.removesuffix(".token")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "node-a"], "unknown cluster"),
        (["case-4-4", "node-z"], "unknown node"),
        (["case-4-4"], "give NODE"),
        (["case-4-4", "--all"], "--out"),
        (["case-4-4", "node-a", "--all", "--out", "x"], "not both"),
    ],
)
def test_create_node_token_names_what_is_wrong(case44, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("create_node_token", *args, stdout=io.StringIO())


def test_the_admin_revokes_node_tokens(case44):
    out = io.StringIO()
    call_command("create_node_token", "case-4-4", "node-a", stdout=out)
    key = out.getvalue().strip()
    assert sync_as(key).status_code == 200
    admin = get_user_model().objects.create_superuser("root", password="pw")
    client = APIClient()
    client.force_login(admin)
    token = NodeToken.objects.get()
    response = client.post(
        "/admin/scheduling/nodetoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert sync_as(key).status_code == 401
    assert client.get("/admin/scheduling/nodetoken/add/").status_code == 403


def test_the_admin_token_list_names_each_tokens_cluster(case44, pod256):
    for cluster, node in (("case-4-4", "node-a"), ("pod-256", "node-001")):
        call_command("create_node_token", cluster, node, stdout=io.StringIO())
    client = APIClient()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    body = client.get("/admin/scheduling/nodetoken/").content.decode()
    assert "column-cluster" in body
    assert '<td class="field-cluster">case-4-4</td>' in body
    assert '<td class="field-cluster">pod-256</td>' in body
