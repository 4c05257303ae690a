"""MASTER_PORT: from the configured range, unique among the live generations on rank 0's node,
stored with rank 0 and shown by every rank map and the agents' work alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.executors.agents import selectors as agent_selectors
from apps.executors.agents import services as agents
from apps.scheduling import services
from apps.scheduling.lifecycle import assign_master_ports
from apps.scheduling.models import Allocation
from apps.topology.models import Gpu, Node

from .conftest import small_spec

COMMAND = ["python", "-c", "pass"]
REPO = Path(__file__).resolve().parents[3]


def test_generations_booked_together_on_one_node_get_different_ports_in_range(case44, alice, settings):
    settings.TOPOWEB_MASTER_PORTS = (20000, 20003)
    jobs = [services.job_submit(user=alice, spec=small_spec(f"j{i}", 1, command=COMMAND)) for i in range(3)]
    gpus = list(Gpu.objects.filter(node__cluster=case44, node__name="node-a").order_by("index"))
    # A live generation already holds one port on the node.
    Allocation.objects.filter(job__in=jobs).delete()
    holder = Allocation.objects.create(job=jobs[0], rank=0, gpu=gpus[0], generation=1, master_port=20001)
    rows = [
        Allocation(job_id=job.pk, rank=0, gpu=gpus[i + 1], generation=2, created_at=timezone.now())
        for i, job in enumerate(jobs)
    ]
    assign_master_ports(rows)
    ports = [r.master_port for r in rows]
    assert len(set(ports)) == 3 and 20001 not in ports
    assert all(20000 <= p <= 20003 for p in ports)
    # Once released, the holder's port is free again.
    Allocation.objects.filter(pk=holder.pk).update(live=False, released_at=timezone.now())
    again = [Allocation(job_id=jobs[1].pk, rank=0, gpu=gpus[5], generation=3)]
    assign_master_ports(again)
    assert again[0].master_port in range(20000, 20004)


def test_other_nodes_and_other_ranks_do_not_take_ports(case44, alice, settings):
    settings.TOPOWEB_MASTER_PORTS = (20000, 20000)
    job = services.job_submit(user=alice, spec=small_spec("j", 1, command=COMMAND))
    Allocation.objects.filter(job=job).delete()
    a = Gpu.objects.filter(node__name="node-a", node__cluster=case44).order_by("index")
    b = Gpu.objects.get(node__name="node-b", node__cluster=case44, index=0)
    Allocation.objects.create(job=job, rank=0, gpu=a[0], generation=1, master_port=20000)
    rows = [
        Allocation(job_id=job.pk, rank=0, gpu=b, generation=2),
        Allocation(job_id=job.pk, rank=1, gpu=a[1]),
    ]
    assign_master_ports(rows)
    assert rows[0].master_port == 20000 and rows[1].master_port is None


def test_the_agents_and_every_rank_map_show_the_stored_port(case44, alice, alice_api, committed, settings):
    settings.TOPOWEB_MASTER_PORTS = (21000, 21999)
    # Generations are cached per process by (job, generation); the test database reuses ids.
    agent_selectors._CACHE.clear()
    job = committed(services.job_submit, user=alice, spec=small_spec("j", 16, command=COMMAND))
    job.refresh_from_db()
    port = Allocation.objects.get(job=job, generation=job.generation, rank=0).master_port
    assert 21000 <= port <= 21999
    assert Allocation.objects.filter(job=job).exclude(rank=0).filter(master_port__isnull=False).count() == 0
    node = Node.objects.get(cluster=case44, name="node-a")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {agents.node_token_create(node=node)[1]}")
    (work,) = client.post("/api/v1/agents/sync/", {"version": "1"}, format="json").json()["work"]
    assert work["master_port"] == port
    url = f"/api/v1/jobs/{job.pk}/rankmap/"
    assert alice_api.get(url).json()["master_port"] == port
    for fmt in ("torchrun", "openmpi", "slurm"):
        text = alice_api.get(url, {"format": fmt}).content.decode()
        assert str(port) in text and "29500" not in text, fmt
    assert f"MASTER_PORT={port}" in alice_api.get(url, {"format": "openmpi"}).content.decode()
    # A caller that launches with another port may still ask for it.
    assert alice_api.get(url, {"master_port": 1234}).json()["master_port"] == 1234


@pytest.mark.parametrize("value", ["20000", "30000-20000", "80-90", "a-b", "20000-70000"])
def test_a_bad_port_range_is_refused_at_start(value):
    env = {**os.environ, "TOPOWEB_MASTER_PORTS": value, "TOPOWEB_TESTING": "1"}
    done = subprocess.run(
        [sys.executable, "-c", "import topoweb.settings"], env=env, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode != 0 and "TOPOWEB_MASTER_PORTS must be LOW-HIGH" in done.stderr
