"""Node states everywhere: the sinfo-like node list, its API and since-when, no agent not up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.executors.agents import services as agents
from apps.scheduling import nodes
from apps.scheduling.choices import NodeState
from apps.scheduling.models import NodeHealth
from apps.scheduling.nodes import cluster_health, node_state_map
from apps.topology.models import Node
from apps.topology.services import cluster_import

from .conftest import generated


@pytest.fixture
def four(db):
    """A leaf-spine cluster "leaf-spine-test" of four nodes, node names in topology order."""
    return cluster_import(data=generated("leaf-spine"))


def _states(cluster):
    """node-001 down, node-002 drained, node-003 up and unhealthy GPU 5, node-004 never had an agent."""
    a, b, c, d = Node.objects.filter(cluster=cluster).order_by("position")
    now = timezone.now()
    NodeHealth.objects.create(
        node=a, state=NodeState.DOWN, reason="no heartbeat for 30 s", last_seen=now, state_since=now
    )
    NodeHealth.objects.create(
        node=b,
        state=NodeState.DRAINED,
        reason="firmware",
        last_seen=now,
        state_since=now - timedelta(hours=3),
    )
    NodeHealth.objects.create(node=c, last_seen=now, unhealthy_gpus=[{"gpu": 5, "reason": "XID 79"}])
    return a.name, b.name, c.name, d.name


def test_no_agent_nodes_do_not_count_as_up(four):
    _states(four)
    health = cluster_health(cluster_id=four.pk)
    assert health["counts"] == {"up": 1, "draining": 0, "drained": 1, "down": 1, "no_agent": 1}
    assert health["agents"] == 3 and health["unhealthy_nodes"] == ["node-003"]
    marks = node_state_map(cluster_id=four.pk)
    assert marks["node-001"]["state"] == "down" and marks["node-004"]["state"] == "no_agent"
    assert marks["node-003"] == {"state": "up", "reason": "", "since": None, "unhealthy": [5]}


def test_node_list_filters_by_state_with_reason_and_since(client, people, four):
    _states(four)
    client.force_login(people["alice"])
    html = client.get("/clusters/leaf-spine-test/nodes/").content.decode()
    for name in ("node-001", "node-002", "node-003", "node-004"):
        assert f">{name}</a>" in html
    drained = client.get("/clusters/leaf-spine-test/nodes/?state=drained").content.decode()
    assert ">node-002</a>" in drained and "firmware" in drained and "3.0 h ago" in drained
    assert ">node-001</a>" not in drained
    unhealthy = client.get("/clusters/leaf-spine-test/nodes/?state=unhealthy").content.decode()
    assert ">node-003</a>" in unhealthy and "XID 79" in unhealthy and ">node-002</a>" not in unhealthy
    none = client.get("/clusters/leaf-spine-test/nodes/?state=no_agent").content.decode()
    assert ">node-004</a>" in none and ">node-003</a>" not in none
    bad = client.get("/clusters/leaf-spine-test/nodes/?state=sleepy")
    assert bad.status_code == 400 and "state: one of up, draining" in bad.content.decode()


def test_node_list_is_paged_in_topology_order(client, people, four, monkeypatch):
    from apps.dashboard.views import nodes as node_views

    monkeypatch.setattr(node_views, "NODES_PER_PAGE", 3)
    client.force_login(people["alice"])
    first = client.get("/clusters/leaf-spine-test/nodes/").content.decode()
    assert [f">node-00{i}</a>" in first for i in (1, 2, 3, 4)] == [True, True, True, False]
    assert "Nodes 1–3 of 4" in first and 'href="?page=2"' in first
    second = client.get("/clusters/leaf-spine-test/nodes/?page=2").content.decode()
    assert ">node-004</a>" in second and ">node-001</a>" not in second and "Nodes 4–4 of 4" in second
    for bad in ("3", "0", "x"):
        response = client.get(f"/clusters/leaf-spine-test/nodes/?page={bad}")
        assert response.status_code == 400 and "page: a number from 1 to 2" in response.content.decode()
    _states(four)
    one = client.get("/clusters/leaf-spine-test/nodes/?state=drained").content.decode()
    assert ">node-002</a>" in one and "Pages of nodes" not in one


def test_node_health_api_filters_by_state_and_says_since(people, four):
    _states(four)
    api = APIClient()
    api.force_authenticate(people["alice"])
    body = api.get("/api/v1/node-health/", {"cluster": "leaf-spine-test", "state": "down"}).json()
    rows = body["results"] if isinstance(body, dict) else body
    assert [(r["name"], r["state"], r["reason"]) for r in rows] == [
        ("node-001", "down", "no heartbeat for 30 s")
    ]
    assert rows[0]["since"] is not None
    body = api.get("/api/v1/node-health/", {"cluster": "leaf-spine-test", "state": "no_agent"}).json()
    rows = body["results"] if isinstance(body, dict) else body
    assert [(r["name"], r["state"], r["since"]) for r in rows] == [("node-004", "no_agent", None)]
    bad = api.get("/api/v1/node-health/", {"state": "sleepy"})
    assert bad.status_code == 400 and "state" in bad.json()


def test_state_since_follows_drain_resume_down_and_return(four):
    node = Node.objects.get(cluster=four, name="node-001")
    t0 = timezone.now() - timedelta(minutes=10)
    agent = agents.agent_heartbeat(node=node, beat=agents.Heartbeat(version="1"), now=t0)
    assert agent.state_since == t0
    drained = nodes.node_drain(node=node, reason="cables")
    assert drained.state == NodeState.DRAINED and drained.state_since > t0
    first = drained.state_since
    assert nodes.node_drain(node=node, reason="cables, again").state_since == first
    t1 = timezone.now()
    nodes.node_down(node=node, reason="no heartbeat", now=t1)
    assert NodeHealth.objects.get(node=node).state_since == t1
    t2 = t1 + timedelta(seconds=5)
    agents.agent_heartbeat(node=node, beat=agents.Heartbeat(version="1"), now=t2)
    back = NodeHealth.objects.get(node=node)
    assert back.state == NodeState.UP and back.state_since == t2


def test_graph_marks_each_state_and_leaves_its_gpus_out_of_free():
    from apps.dashboard.figures import cluster_figure
    from apps.dashboard.layout import cluster_layout
    from apps.placement.topology import load_topology

    topo = load_topology(generated("leaf-spine"))
    since = timezone.now()
    states = {
        "node-001": {"state": "down", "reason": "no heartbeat", "since": since, "unhealthy": []},
        "node-002": {"state": "drained", "reason": "firmware", "since": since, "unhealthy": []},
        "node-003": {"state": "up", "reason": "", "since": None, "unhealthy": [5]},
        "node-004": {"state": "no_agent", "reason": "", "since": None, "unhealthy": []},
    }
    fig = cluster_figure(cluster_layout(topo), [], states)
    names = [t["name"] for t in fig.figure["data"] if t.get("showlegend")]
    # 32 GPUs: 16 on the down and drained nodes, one unhealthy, 15 free (the no-agent node's too).
    assert "free (15)" in names
    assert "not schedulable (down, drained or draining node) (16)" in names and "unhealthy (1)" in names
    for label in ("down (1 node)", "drained (1 node)", "no agent (1 node)", "unhealthy GPU (1 node)"):
        assert label in names
    marks = {t["meta"]["state"]: t for t in fig.figure["data"] if t["meta"]["role"] == "node-state"}
    assert marks["down"]["customdata"] == [0] and "since" in marks["down"]["text"][0]
    assert fig.client["node_state"]["2"] == ["up", "", None, [5]]
    # Nodes without an agent go as a plain list, their marks without hover text of their own.
    assert fig.client["node_no_agent"] == [3] and "3" not in fig.client["node_state"]
    assert marks["no_agent"]["hoverinfo"] == "skip"
    bars = [t for t in fig.figure["data"] if t["meta"]["role"] == "agg-label"][0]
    assert bars["text"] == ["0 free", "15 free"]


def test_cluster_page_counts_only_schedulable_gpus_free_after_a_drain(client, people, four):
    client.force_login(people["ops"])
    before = client.get("/clusters/leaf-spine-test/").content.decode()
    assert "32 GPUs (32 free)" in before
    client.post("/clusters/leaf-spine-test/node-health/drain/", {"node": "node-001", "reason": "cables"})
    after = client.get("/clusters/leaf-spine-test/").content.decode()
    assert "32 GPUs (24 free)" in after and "drained (1 node)" in after


def test_the_demo_drains_one_idle_node_for_maintenance_once(db):
    from apps.placement.topology import read_spec_file
    from apps.scheduling.demo import MAINTENANCE_REASON, demo_maintenance

    from .conftest import EXAMPLES

    cluster = cluster_import(data=read_spec_file(str(EXAMPLES / "su-h100-rail.yaml")))
    name = demo_maintenance()
    agent = NodeHealth.objects.get(node__cluster=cluster, node__name=name)
    assert agent.state == NodeState.DRAINED and agent.reason == MAINTENANCE_REASON
    assert demo_maintenance() is None
