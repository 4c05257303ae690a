"""An agent's sync on Postgres: an idle one reads its node, its agent row and its work in one
round trip (`selectors.sync_node(with_work=True)`), the same as the two separate reads; the NIC
counters it carries are one upsert with their rates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.executors.agents import services as agent_services
from apps.executors.agents.selectors import node_work, sync_node
from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Allocation, NodeHealth, RankRun
from apps.topology.models import Node

from . import test_agents

pytestmark = pytest.mark.integration
cluster, eager_cycles, user, spec = (
    test_agents.cluster,
    test_agents.eager_cycles,
    test_agents.user,
    test_agents.spec,
)


def test_the_node_its_agent_row_and_its_work_come_in_one_round_trip(cluster, user, tmp_path):
    assert connection.vendor == "postgresql"
    job = services.job_submit(user=user, spec=spec(tmp_path, "read-together", 8))
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING, job.pending_reason
    (name,) = set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True))
    node = Node.objects.get(cluster=cluster, name=name)
    idle = Node.objects.filter(cluster=cluster).exclude(pk=node.pk).first()
    agent_services.agent_heartbeat(node=node, beat=agent_services.Heartbeat(version="1.0"))
    # A rank reported started, and one of another generation still counted running: both halves
    # of the work (ranks to run, ranks to stop) come back.
    RankRun.objects.create(job=job, generation=job.generation, rank=0, node=node, state="started")
    RankRun.objects.create(job=job, generation=job.generation - 1 or 99, rank=3, node=node, state="started")

    sync_node(node_id=node.pk, with_work=True)  # the generation's launch fields, read once a process
    for which, agent_row in ((node, True), (idle, False)):
        with CaptureQueriesContext(connection) as queries:
            got, agent, work = sync_node(node_id=which.pk, with_work=True)
        sent = [q["sql"] for q in queries.captured_queries]
        # One message holds the node's read and its work's, the rendezvous address (MASTER_ADDR)
        # of a node with work included.
        assert len(sent) == 1 and '"scheduling_nodeagent"' in sent[0] and "UNION ALL" in sent[0], sent
        alone, agent_alone, none = sync_node(node_id=which.pk)
        assert none is None and (got.pk, got.name, got.cluster_id) == (alone.pk, alone.name, alone.cluster_id)
        assert (agent is not None) == agent_row
        if agent_row:
            assert agent.last_seen == agent_alone.last_seen == NodeHealth.objects.get(node=node).last_seen
        assert work == node_work(node=alone)
    work, stops = sync_node(node_id=node.pk, with_work=True)[2]
    assert [(w["job"], len(w["ranks"])) for w in work] == [(job.pk, 8)]
    assert [r["started"] for r in work[0]["ranks"]] == [True] + [False] * 7
    # MASTER_ADDR: rank 0's node's name until its agent records an address, then that address.
    assert work[0]["master_addr"] == name
    NodeHealth.objects.filter(node=node).update(addr="10.9.8.7")
    assert sync_node(node_id=node.pk, with_work=True)[2][0][0]["master_addr"] == "10.9.8.7"
    assert stops == [[job.pk, job.generation - 1 or 99, 3]]
    # A node that no longer exists: nothing, in the same single statement.
    assert sync_node(node_id=10**9, with_work=True) == (None, None, None)


@pytest.mark.parametrize("prepare", [True, False])
def test_an_agents_nic_counters_are_one_upsert_with_their_rates(cluster, monkeypatch, settings, prepare):
    """The NIC counters of a sync are written by one statement (prepared, whatever the number of
    rows; else one per batch of rows), their rates taken against the node's previous counters; a
    counter that went down has no rate."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.metrics import store
    from apps.metrics.models import NicLatest

    settings.DB_PREPARED_STATEMENTS = prepare
    node = Node.objects.filter(cluster=cluster).first()
    t0 = timezone.now()
    ports = [{"device": f"mlx5_{i}", "port": "1", "tx_bytes": 1000, "rx_bytes": 5000} for i in range(5)]
    monkeypatch.setattr(store, "BATCH", 2)  # three statements of at most two rows
    with CaptureQueriesContext(connection) as queries:
        assert store.agent_nics_store(node_id=node.pk, counters=ports, now=t0) == 5
    writes = ["INSERT"] if prepare else ["INSERT", "INSERT", "INSERT"]
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["SELECT", *writes]
    assert ("unnest" in queries.captured_queries[-1]["sql"]) is prepare
    later = [{**p, "tx_bytes": 1000 + 10_000 * i, "rx_bytes": 4000} for i, p in enumerate(ports)]
    assert store.agent_nics_store(node_id=node.pk, counters=later, now=t0 + timedelta(seconds=10)) == 5
    rows = {r.device: r for r in NicLatest.objects.filter(node=node)}
    assert len(rows) == 5 and NicLatest.objects.count() == 5
    for i in range(5):
        row = rows[f"mlx5_{i}"]
        assert row.at == t0 + timedelta(seconds=10) and row.tx_bytes_total == 1000 + 10_000 * i
        assert row.tx_Bps == 1000 * i and row.rx_Bps is None  # rx went down: reset, no rate


@pytest.mark.parametrize("prepare", [True, False])
def test_nic_counters_of_any_value_are_stored_as_read(cluster, settings, prepare):
    """An exporter's counters are floats and may read NaN or infinite, an agent's are integers up
    to 64 bits or absent: one column of the upsert holds them all, each stored as read."""
    import math

    from django.utils import timezone

    from apps.metrics import store
    from apps.metrics.models import NicLatest

    settings.DB_PREPARED_STATEMENTS = prepare
    node = Node.objects.filter(cluster=cluster).first()
    now = timezone.now()
    rows = [
        (node.pk, "mlx5_0", "1", now, float("nan"), 2.5e18, None, 1.5),
        (node.pk, "mlx5_1", "1", now, float("inf"), None, None, None),
        (node.pk, "ib0", "0", now, 7, 2**63 - 1, 0.25, None),
    ]
    store._write_nic_rows(rows)
    stored = {
        r.device: (r.tx_bytes_total, r.rx_bytes_total, r.tx_Bps, r.rx_Bps)
        for r in NicLatest.objects.filter(node=node)
    }
    nan = stored.pop("mlx5_0")
    assert math.isnan(nan[0]) and nan[1:] == (2.5e18, None, 1.5)
    assert stored == {"mlx5_1": (math.inf, None, None, None), "ib0": (7.0, float(2**63 - 1), 0.25, None)}


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("prepare", [True, False])
def test_an_idle_syncs_statements_are_prepared_once_per_connection(
    cluster, user, tmp_path, settings, prepare
):
    """The node's read, its work and the heartbeat's UPDATE are planned once per connection, not
    on every sync; with TOPOWEB_DB_PREPARED off (a pooler that keeps no prepared statements) they
    go as Django sends its own, with the same answers."""
    settings.DB_PREPARED_STATEMENTS = prepare
    connection.close()  # a connection of its own: nothing prepared on it yet
    job = services.job_submit(user=user, spec=spec(tmp_path, f"prepared-{prepare}", 8))
    job.refresh_from_db()
    (name,) = set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True))
    node = Node.objects.get(cluster=cluster, name=name)
    beat = agent_services.Heartbeat(version="1.0", addr="10.1.2.3")
    agent_services.agent_heartbeat(node=node, beat=beat)
    answers = []
    for _ in range(3):
        NodeHealth.objects.filter(node=node).update(last_seen=timezone.now() - timedelta(hours=1))
        got, agent, work = sync_node(node_id=node.pk, with_work=True)
        answers.append((got.name, agent.addr, work))
        agent_services.agent_heartbeat(node=node, beat=beat, agent=agent)  # stale: written
    assert answers[0] == answers[1] == answers[2]
    work, stops = answers[0][2]
    assert [(w["job"], len(w["ranks"]), w["master_addr"]) for w in work] == [(job.pk, 8, "10.1.2.3")]
    assert NodeHealth.objects.get(node=node).last_seen > timezone.now() - timedelta(minutes=1)
    statements = _prepared_statements()
    if not prepare:
        assert statements == []
        return
    # Each once, however many syncs: the node and agent row, the work, the heartbeat.
    assert sorted(s.split()[0] for s in statements) == ["SELECT", "SELECT", "UPDATE"], statements
    assert any('"scheduling_nodeagent" a ON a.node_id' in s for s in statements)
    assert any("UNION ALL" in s for s in statements)
