"""Storms cost their source: a node's sync storm throttles that node only."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from apps.api.throttling import NodeSyncThrottle
from apps.executors.agents import services as agents
from apps.topology.models import Node

pytestmark = pytest.mark.django_db


def _agent(node: Node) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {agents.node_token_create(node=node)[1]}")
    return client


def _sync(client: APIClient, node: Node):
    return client.post(
        "/api/v1/agents/sync/", {"node": node.name, "version": "1.0.0", "wait_s": 0}, format="json"
    )


def test_a_sync_storm_from_one_node_throttles_that_node_only(case44, monkeypatch, throttle_window):
    monkeypatch.setattr(NodeSyncThrottle, "THROTTLE_RATES", {"agent_sync": "3/min"})
    noisy, quiet = Node.objects.filter(cluster=case44).order_by("name")[:2]
    noisy_agent, quiet_agent = _agent(noisy), _agent(quiet)
    assert [_sync(noisy_agent, noisy).status_code for _ in range(5)] == [200, 200, 200, 429, 429]
    assert _sync(quiet_agent, quiet).status_code == 200
    # A second token of the noisy node shares its budget: the node pays, not the credential.
    assert _sync(_agent(noisy), noisy).status_code == 429


def test_a_bad_token_storm_from_one_address_leaves_valid_users_and_agents_working(case44, alice, settings):
    from .conftest import token_client

    cache.clear()
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 50
    behind_proxy = {"HTTP_X_FORWARDED_FOR": "203.0.113.9", "REMOTE_ADDR": "10.0.0.1"}
    codes = [
        APIClient(HTTP_AUTHORIZATION=f"Token {i:08d}{'0' * 32}")
        .get("/api/v1/jobs/", **behind_proxy)
        .status_code
        for i in range(60)
    ]
    assert codes[:49] == [401] * 49 and set(codes[50:]) == {429}
    # The attacker's address: valid user tokens and node tokens still work from it.
    assert token_client(alice).get("/api/v1/jobs/", **behind_proxy).status_code == 200
    node = Node.objects.filter(cluster=case44).first()
    agent = _agent(node)
    response = agent.post(
        "/api/v1/agents/sync/",
        {"node": node.name, "version": "1.0.0", "wait_s": 0},
        format="json",
        **behind_proxy,
    )
    assert response.status_code == 200
    cache.clear()


def test_one_bad_key_repeated_is_answered_429_while_other_keys_are_checked(alice, settings):
    from .conftest import token_client

    cache.clear()
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 1000
    bad = APIClient(HTTP_AUTHORIZATION=f"Token {'ab' * 20}")
    assert [bad.get("/api/v1/jobs/").status_code for _ in range(4)] == [401, 401, 429, 429]
    assert APIClient(HTTP_AUTHORIZATION=f"Token {'cd' * 20}").get("/api/v1/jobs/").status_code == 401
    assert token_client(alice).get("/api/v1/jobs/").status_code == 200
    cache.clear()


def test_behind_trusted_proxies_the_storm_counts_against_the_client_not_the_proxy(
    case44, alice, settings, monkeypatch
):
    from rest_framework.settings import api_settings

    cache.clear()
    monkeypatch.setattr(api_settings, "NUM_PROXIES", 1)
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 3
    settings.LOGIN_FAILURE_LIMIT = 100
    attacker = {"HTTP_X_FORWARDED_FOR": "203.0.113.9", "REMOTE_ADDR": "10.0.0.1"}
    neighbour = {"HTTP_X_FORWARDED_FOR": "198.51.100.7", "REMOTE_ADDR": "10.0.0.1"}
    for i in range(5):
        APIClient(HTTP_AUTHORIZATION=f"Token {i:08d}{'0' * 32}").get("/api/v1/jobs/", **attacker)
    # A mistyped key from another client behind the same proxy is an ordinary 401.
    bad = APIClient(HTTP_AUTHORIZATION=f"Token {'9' * 40}")
    assert bad.get("/api/v1/jobs/", **neighbour).status_code == 401
    assert bad.get("/api/v1/jobs/", **attacker).status_code == 429
    cache.clear()
