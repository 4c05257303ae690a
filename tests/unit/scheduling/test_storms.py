"""Storms cost their source: a node's sync storm throttles that node only."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from apps.api.throttling import NodeSyncThrottle
from apps.scheduling import agents
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


def test_a_sync_storm_from_one_node_throttles_that_node_only(case44, monkeypatch):
    cache.clear()
    monkeypatch.setattr(NodeSyncThrottle, "THROTTLE_RATES", {"agent_sync": "3/min"})
    noisy, quiet = Node.objects.filter(cluster=case44).order_by("name")[:2]
    noisy_agent, quiet_agent = _agent(noisy), _agent(quiet)
    assert [_sync(noisy_agent, noisy).status_code for _ in range(5)] == [200, 200, 200, 429, 429]
    assert _sync(quiet_agent, quiet).status_code == 200
    # A second token of the noisy node shares its budget: the node pays, not the credential.
    assert _sync(_agent(noisy), noisy).status_code == 429
    cache.clear()
