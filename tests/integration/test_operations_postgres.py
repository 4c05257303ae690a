"""The operator's reads on Postgres: node-state filters (JSON list comparisons through the agent
join), the graph's signature following node states, and usage sums per user."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.dashboard.selectors import graph_signature
from apps.dashboard.usage import usage_by_user
from apps.placement.topology import read_spec_file
from apps.scheduling.models import Allocation, Job, NodeHealth
from apps.scheduling.nodes import cluster_health, node_rows
from apps.topology.models import Node
from apps.topology.services import cluster_import

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres"), pytest.mark.django_db]


def test_node_state_filters_and_the_graph_signature_on_postgres():
    cluster = cluster_import(data=read_spec_file(str(EXAMPLES / "case-4-4.yaml")))
    staff = get_user_model().objects.create_user("ops", is_staff=True)
    a, b = Node.objects.filter(cluster=cluster).order_by("position")
    before = graph_signature(cluster=cluster, user=staff)
    now = timezone.now()
    NodeHealth.objects.create(node=a, last_seen=now, unhealthy_gpus=[{"gpu": 2, "reason": "XID 48"}])
    assert graph_signature(cluster=cluster, user=staff) != before
    assert [r["node"] for r in node_rows(cluster_id=cluster.pk, state="unhealthy")] == ["node-a"]
    assert [r["node"] for r in node_rows(cluster_id=cluster.pk, state="up")] == ["node-a"]
    assert [r["node"] for r in node_rows(cluster_id=cluster.pk, state="no_agent")] == ["node-b"]
    NodeHealth.objects.create(node=b, state="down", reason="no heartbeat", last_seen=now, state_since=now)
    assert cluster_health(cluster_id=cluster.pk)["counts"] == {
        "up": 1,
        "draining": 0,
        "drained": 0,
        "down": 1,
        "no_agent": 0,
    }


def test_usage_sums_gpu_hours_per_user_on_postgres():
    cluster = cluster_import(data=read_spec_file(str(EXAMPLES / "case-4-4.yaml")))
    alice = get_user_model().objects.create_user("alice")
    end = timezone.now() - timedelta(minutes=5)
    for hours in (1, 2):
        job = Job.objects.create(
            name=f"j{hours}",
            cluster=cluster,
            owner=alice,
            spec={},
            gpus=8,
            status="completed",
            submitted_at=end - timedelta(hours=hours, minutes=1),
            started_at=end - timedelta(hours=hours),
            finished_at=end,
        )
        # Usage counts the GPUs' bookings: 8 GPUs from its start to its end.
        Allocation.objects.bulk_create(
            Allocation(job=job, rank=r, live=False, created_at=job.started_at, released_at=end)
            for r in range(8)
        )
    (row,) = usage_by_user(user=alice, since=end - timedelta(days=1), until=timezone.now())
    assert row["user"] == "alice" and row["jobs"] == 2 and row["gpu_hours"] == pytest.approx(24.0)
    assert row["mean_wait_s"] == pytest.approx(60.0)
