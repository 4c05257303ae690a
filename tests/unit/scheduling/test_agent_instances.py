"""One agent process per node: the sync binds a node to one agent instance while its lease runs
(another is refused with 409, recorded and logged), a successor on its state directory or host
takes over at once; the answer names this server; orphans keep a node from placements."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.executors.models import ClusterExecutor
from apps.scheduling.choices import NodeState
from apps.scheduling.models import NodeHealth
from apps.scheduling.snapshot import cluster_snapshot

from .test_agents_api import NodeClients, sync

FIRST = "a" * 32
SECOND = "b" * 32


@pytest.fixture
def nodes(case44) -> NodeClients:
    return NodeClients(case44)


def _row() -> NodeHealth:
    return NodeHealth.objects.get(node__name="node-a")


def test_a_second_instance_is_refused_while_the_first_is_live(nodes, caplog):
    started = time.time() - 100
    first = sync(nodes, instance=FIRST, host="host-1", addr="10.0.0.1", started_at=started)
    assert first.status_code == 200
    with caplog.at_level(logging.WARNING, logger="apps.executors.agents.services"):
        for _ in range(3):
            second = sync(nodes, instance=SECOND, host="host-2", addr="10.0.0.2", started_at=time.time())
            assert second.status_code == 409
    body = second.json()
    assert body["node"] == "node-a" and "node-a" in body["detail"] and "10.0.0.1" in body["detail"]
    assert body["holder"]["addr"] == "10.0.0.1" and body["holder"]["host"] == "host-1"
    assert body["holder"]["started_at"].startswith(datetime.fromtimestamp(started, tz=UTC).isoformat()[:19])
    row = _row()
    # Nothing of the refused agent was recorded but the refusal (logged once a minute).
    assert row.addr == "10.0.0.1" and row.agent_instance == FIRST and row.agent_host == "host-1"
    assert row.agent_refused["addr"] == "10.0.0.2" and row.agent_refused["host"] == "host-2"
    assert len([r for r in caplog.records if "refused a second agent" in r.getMessage()]) == 1
    assert sync(nodes, instance=FIRST, host="host-1", addr="10.0.0.1").status_code == 200


def test_a_silent_instance_loses_the_node_after_its_lease(nodes, settings):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    assert sync(nodes, instance=FIRST, addr="10.0.0.1").status_code == 200
    # 20 s into the 30 s lease: 10 s to spare on a busy machine before the second sync.
    NodeHealth.objects.filter(node__name="node-a").update(last_seen=timezone.now() - timedelta(seconds=20))
    assert sync(nodes, instance=SECOND, addr="10.0.0.2").status_code == 409
    NodeHealth.objects.filter(node__name="node-a").update(last_seen=timezone.now() - timedelta(seconds=31))
    assert sync(nodes, instance=SECOND, addr="10.0.0.2").status_code == 200
    assert _row().agent_instance == SECOND
    # Now the first is the second agent.
    assert sync(nodes, instance=FIRST, addr="10.0.0.1").status_code == 409


def test_the_successor_on_the_same_state_directory_takes_over_at_once(nodes):
    assert sync(nodes, instance=FIRST).status_code == 200
    assert sync(nodes, instance=SECOND, previous="c" * 32).status_code == 409
    assert sync(nodes, instance=SECOND, previous=FIRST).status_code == 200
    assert _row().agent_instance == SECOND


def test_the_answer_names_this_server_the_cluster_and_the_node(nodes, case44):
    answer = sync(nodes, instance=FIRST).json()
    executor = ClusterExecutor.objects.get(cluster=case44)
    assert (answer["server_id"], answer["cluster"], answer["node"]) == (
        executor.server_id,
        case44.name,
        "node-a",
    )
    assert len(answer["server_id"]) == 8
    # Stable: the same on the next (cached-row) sync.
    assert sync(nodes, instance=FIRST).json()["server_id"] == executor.server_id


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"instance": "not-hex"}, "instance"),
        ({"instance": "ab"}, "instance"),
        ({"previous": "x" * 32}, "previous"),
        ({"started_at": -1}, "started_at"),
        ({"host": "a b"}, "host"),
        ({"orphans": [{"job": 1, "generation": 1, "rank": 0, "pids": [1]}] * 65}, "orphans"),
        ({"orphans": [{"job": 1, "generation": 1, "rank": 0, "pids": list(range(1, 34))}]}, "orphans"),
        ({"orphans": [{"job": 1, "generation": 1, "rank": 0, "pids": [1], "server": "x;y"}]}, "orphans"),
    ],
)
def test_bad_instance_and_orphan_fields_are_400_naming_the_field(nodes, body, field):
    response = sync(nodes, **body)
    assert response.status_code == 400
    assert field in response.json()


ORPHAN = {"job": 3, "generation": 1, "rank": 0, "pids": [4242, 4243], "server": ""}


def test_a_node_with_orphans_takes_no_placements_until_they_are_gone(nodes, case44):
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 16
    assert sync(nodes, instance=FIRST, orphans=[ORPHAN]).status_code == 200
    row = _row()
    assert row.orphans == [ORPHAN] and row.orphan_pids == 2
    snap = cluster_snapshot(cluster=case44)
    assert int(snap.free.sum()) == 8 and not snap.free[snap.topology.gid("node-a", 0)]
    assert sync(nodes, instance=FIRST, orphans=[]).status_code == 200
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 16


def test_a_down_node_with_orphans_stays_down_until_they_are_gone(nodes, case44):
    sync(nodes, instance=FIRST)
    NodeHealth.objects.filter(node__name="node-a").update(state=NodeState.DOWN)
    sync(nodes, instance=FIRST, orphans=[ORPHAN])
    assert _row().state == NodeState.DOWN and "still run" in _row().reason
    sync(nodes, instance=FIRST)
    assert _row().state == NodeState.UP


def test_the_node_page_shows_the_orphans_and_the_refused_agent(nodes, case44, client, django_user_model):
    sync(nodes, instance=FIRST, host="host-1", addr="10.0.0.1", orphans=[ORPHAN])
    sync(nodes, instance=SECOND, host="host-2", addr="10.0.0.2", started_at=time.time())
    user = django_user_model.objects.create_user("op", password="pw")
    client.force_login(user)
    page = client.get(f"/clusters/{case44.name}/nodes/node-a/").content.decode()
    assert "cleaning up 2 orphan processes" in page and "job 3 gen 1 rank 0" in page
    assert "a second agent on this credential from 10.0.0.2 (host-2)" in page and "was refused at" in page
    assert "on <code>host-1</code>" in page
