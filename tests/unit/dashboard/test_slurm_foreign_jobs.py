"""Jobs that run in Slurm without TopoWeb show on the cluster graph, and their GPUs are not free."""

from __future__ import annotations

from django.urls import reverse

from apps.executors.models import ForeignAllocation
from apps.scheduling.snapshot import cluster_snapshot
from apps.topology.models import Node

from .test_views import payload


def test_foreign_slurm_job_is_drawn_with_its_gpus_and_not_free(client, people, case44_db):
    node = Node.objects.filter(cluster=case44_db).order_by("position").first()
    for i in (1, 2):
        ForeignAllocation.objects.create(
            cluster=case44_db, node=node, gpu_index=i, slurm_job_id=4711, user="bob"
        )
    client.force_login(people["alice"])
    response = client.get(reverse("dashboard:cluster", args=[case44_db.name]))
    assert response.status_code == 200
    jobs = payload(response)["client"]["jobs"]
    assert [j["label"] for j in jobs] == ["slurm job 4711 (bob)"]
    snap = cluster_snapshot(cluster=case44_db)
    assert not snap.free[snap.topology.gid(node.name, 1)]
    assert not snap.free[snap.topology.gid(node.name, 2)]
    assert snap.free[snap.topology.gid(node.name, 0)]


def test_cluster_page_says_when_slurm_runs_the_cluster(client, people, case44_db):
    from apps.executors.models import ClusterExecutor

    client.force_login(people["alice"])
    url = reverse("dashboard:cluster", args=[case44_db.name])
    assert b'id="slurm-executor"' not in client.get(url).content
    ClusterExecutor.objects.create(
        cluster=case44_db, kind="slurm", slurmrestd_url="unix:/run/slurmrestd.sock", last_error="refused"
    )
    page = client.get(url).content.decode()
    assert 'id="slurm-executor"' in page and "unix:/run/slurmrestd.sock" in page and "refused" in page
