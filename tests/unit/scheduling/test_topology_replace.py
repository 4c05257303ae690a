"""Replacing a cluster's topology after jobs ran: history survives, live jobs block it by name."""

from __future__ import annotations

import copy
import io

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db.models import RestrictedError
from django.test import Client

from apps.scheduling import selectors, services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Allocation
from apps.topology import services as topology_services
from apps.topology.models import Gpu, Node

from .conftest import EXAMPLES, small_spec

pytestmark = pytest.mark.django_db


def renamed_case44() -> dict:
    """case-4-4 with other node names and NICs: none of the old GPUs survives a replace."""
    spec = yaml.safe_load((EXAMPLES / "case-4-4.yaml").read_text())
    spec = copy.deepcopy(spec)
    for node, name in zip(spec["nodes"], ("node-x", "node-y"), strict=True):
        node["name"] = name
        node["nvlink"]["domain"] = name
        node["nics"][0]["name"] = "mlx5_9"
    return spec


@pytest.fixture
def finished(case44, alice, committed):
    """A 16-GPU job of alice's, placed on case-4-4 and completed."""
    job = committed(services.job_submit, user=alice, spec=small_spec("history", 16))
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    services.job_start(job=job)
    return committed(services.job_complete, job=job)


def test_allocations_copy_their_gpu_place_when_booked(finished):
    rows = list(Allocation.objects.filter(job=finished).order_by("rank"))
    assert len(rows) == 16
    for row in rows:
        assert (row.node_name, row.gpu_index, row.nic_name) == (row.gpu.node.name, row.gpu.index, "mlx5_0")


def test_replace_after_jobs_finished_keeps_their_placement(finished, case44):
    before = selectors.job_ranks(job=finished)
    replaced = topology_services.cluster_import(data=renamed_case44(), replace=True)
    assert replaced.pk == case44.pk
    assert not Node.objects.filter(name__in=["node-a", "node-b"]).exists()
    assert Allocation.objects.filter(job=finished, gpu__isnull=True).count() == 16
    after = selectors.job_ranks(job=finished)
    assert after == before
    assert {r["node"] for r in after} == {"node-a", "node-b"}


def test_rank_maps_of_a_finished_job_read_its_booked_places_after_replace(finished, alice_api):
    topology_services.cluster_import(data=renamed_case44(), replace=True)
    hostfile = alice_api.get(f"/api/v1/jobs/{finished.pk}/rankmap/?format=slurm-hostfile")
    assert hostfile.status_code == 200
    assert set(hostfile.content.decode().split()) == {"node-a", "node-b"}
    placement = alice_api.get(f"/api/v1/jobs/{finished.pk}/placement/").json()
    assert [(r["node"], r["gpu"]) for r in placement["ranks"][:2]] == [
        (r["node"], r["gpu"]) for r in selectors.job_ranks(job=finished)[:2]
    ]


def test_job_page_of_a_finished_job_renders_after_replace(finished, alice):
    topology_services.cluster_import(data=renamed_case44(), replace=True)
    client = Client()
    client.force_login(alice)
    response = client.get(f"/jobs/{finished.pk}/")
    assert response.status_code == 200
    history = response.context["history"]
    assert [(n["node"], n["gpus"], n["ranks"]) for n in history] == [
        ("node-a", list(range(8)), list(range(8))),
        ("node-b", list(range(8)), list(range(8, 16))),
    ]
    html = response.content.decode()
    assert 'id="last-placement"' in html and "<td>node-b</td><td>0-7</td><td>8-15</td>" in html
    assert f"/api/v1/jobs/{finished.pk}/rankmap/?format=openmpi" in html


def test_waiting_jobs_are_planned_on_the_new_topology(case44, alice):
    # No on-commit callbacks run here: the job waits until the cycle below.
    waiting = services.job_submit(user=alice, spec=small_spec("waiting", 8))
    topology_services.cluster_import(data=renamed_case44(), replace=True)
    services.schedule_cluster(cluster=case44)
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.PLACING
    assert {r["node"] for r in selectors.job_ranks(job=waiting)} <= {"node-x", "node-y"}


def test_replace_with_a_live_job_is_refused_naming_it(case44, alice, staff_api, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("holding", 8))
    spec = yaml.safe_load((EXAMPLES / "case-4-4.yaml").read_text())
    response = staff_api.post("/api/v1/clusters/import/?replace=true", spec, format="json")
    assert response.status_code == 400
    [message] = response.json()["name"]
    assert "cannot be replaced while jobs hold its GPUs" in message
    assert f"job {job.pk} 'holding' (placing)" in message
    assert Allocation.objects.filter(job=job, live=True, gpu__isnull=False).count() == 8


def test_the_command_refuses_a_replace_under_live_jobs_and_names_them(case44, alice, committed, tmp_path):
    job = committed(services.job_submit, user=alice, spec=small_spec("busy", 8))
    path = tmp_path / "case-4-4.yaml"
    path.write_text(yaml.safe_dump(renamed_case44()))
    with pytest.raises(CommandError, match=rf"job {job.pk} 'busy' \(placing\)"):
        call_command("import_topology", str(path), "--replace", stdout=io.StringIO())
    assert Node.objects.filter(name="node-a").exists()
    committed(services.job_complete, job=job)
    call_command("import_topology", str(path), "--replace", stdout=io.StringIO())
    assert Node.objects.filter(name="node-x").exists()


def test_a_refused_replace_names_at_most_ten_jobs_and_counts_the_rest(db, alice, committed):
    pod = topology_services.cluster_import(data=yaml.safe_load((EXAMPLES / "pod-256.yaml").read_text()))
    for i in range(12):
        committed(services.job_submit, user=alice, spec=small_spec(f"one-{i}", 1, cluster=pod.name))
    with pytest.raises(topology_services.ClusterBusyError) as caught:
        topology_services.cluster_import(
            data=yaml.safe_load((EXAMPLES / "pod-256.yaml").read_text()), replace=True
        )
    [(field, message)] = caught.value.errors
    assert field == "name" and message.count("job ") == 10 and "and 2 more" in message


def test_deleting_a_gpu_that_a_live_job_holds_is_refused(case44, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("holding", 8))
    gpu = Allocation.objects.get(job=job, rank=0).gpu
    with pytest.raises(RestrictedError):
        gpu.delete()
    committed(services.job_complete, job=job)
    Gpu.objects.filter(pk=gpu.pk).delete()
    row = Allocation.objects.get(job=job, rank=0)
    assert row.gpu_id is None and row.node_name == gpu.node.name and row.gpu_index == gpu.index


def test_job_page_of_a_finished_job_renders_after_a_replace_that_shrank_the_cluster(finished, alice):
    smaller = renamed_case44()
    smaller["nodes"] = smaller["nodes"][:1]
    topology_services.cluster_import(data=smaller, replace=True)
    client = Client()
    client.force_login(alice)
    response = client.get(f"/jobs/{finished.pk}/")
    assert response.status_code == 200
    rankmap = client.get(f"/api/v1/jobs/{finished.pk}/rankmap/?format=openmpi")
    assert rankmap.status_code == 200
    assert "-np 1 --host node-b -x CUDA_VISIBLE_DEVICES=7" in rankmap.content.decode().splitlines()[-1]
