"""Topologies and jobs for the dashboard's figure-builder tests (pure, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.placement.jobs import load_job, load_job_file
from apps.placement.topology import load_topology, load_topology_file
from tests.unit.placement import specs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def generated(shape: str, **overrides) -> dict:
    """The placement tests' small generated spec with 8 GPUs and 8 NICs a node, named
    "<shape>-test"; keyword arguments override its fields."""
    spec = specs.generated(shape, **{"gpus_per_node": 8, "nics_per_node": 8, **overrides})
    return {**spec, "name": f"{shape}-test"}


def job_spec(gpus: int, *, tp=1, pp=1, dp=None, comm=None, name="job", flops=None) -> dict:
    """A job spec v1 dict; by default pure data parallel with one 1 GB allreduce and 150 TFLOPS of
    compute per GPU (within an A100's peak)."""
    flops = 1.5e13 * gpus if flops is None else flops
    return {
        "version": 1,
        "name": name,
        "gpus": gpus,
        "parallelism": {"tp": tp, "pp": pp, "dp": dp or gpus // (tp * pp), "ep": 1},
        "model": {"flops_per_step": flops},
        "step": {"compute_ms": 100, "overlap": 0.0},
        "comm": comm or [{"group": "dp", "collective": "allreduce", "bytes": 1e9}],
    }


def _admin(user):
    """`user` in the admin role."""
    from apps.api.roles import role_grant

    role_grant(user=user, role="admin")
    return user


@pytest.fixture(scope="session")
def case44():
    return load_topology_file(str(EXAMPLES / "case-4-4.yaml"))


@pytest.fixture(scope="session")
def case44_job():
    return load_job_file(str(EXAMPLES / "case-4-4-job.yaml"))


@pytest.fixture(scope="session")
def leafspine():
    """2 leaves x 2 nodes x 8 GPUs under 2 spines (32 GPUs)."""
    return load_topology(generated("leaf-spine"))


@pytest.fixture(scope="session")
def rail():
    """One rail-optimized unit of 4 nodes x 4 GPUs, NIC i of every node on leaf i."""
    return load_topology(
        generated("rail-optimized", leaves=4, nodes_per_leaf=4, gpus_per_node=4, nics_per_node=4)
    )


@pytest.fixture
def dp16():
    return load_job(job_spec(16, name="dp16"))


# --------------------------------------------------------------------------- database scenario


@pytest.fixture
def people(db):
    """Staff user "ops" and two users, "alice" and "bob" (password "pw" for all)."""
    from django.contrib.auth import get_user_model

    users = get_user_model()
    return {
        "ops": _admin(users.objects.create_user("ops", password="pw", is_staff=True)),
        "alice": users.objects.create_user("alice", password="pw"),
        "bob": users.objects.create_user("bob", password="pw"),
    }


@pytest.fixture
def case44_db(db):
    """The case-4.4 cluster imported through the topology service."""
    from apps.placement.topology import read_spec_file
    from apps.topology.services import cluster_import

    return cluster_import(data=read_spec_file(str(EXAMPLES / "case-4-4.yaml")))


def run_job(cluster, user, spec: dict):
    """Submit `spec` as `user`, run a scheduling cycle and start the job if it was placed."""
    from apps.scheduling import services
    from apps.scheduling.models import Job

    job = services.job_submit(user=user, spec=spec, cluster=cluster)
    services.schedule_cluster(cluster=cluster)
    job.refresh_from_db()
    if job.status == "placing":
        services.job_start(job=job)
        job.refresh_from_db()
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def naive_case44(case44_db, people):
    """Alice's case-4.4 job placed by the naive policy (109 ms of DP communication per step),
    with the topo migration proposal the cycle records for it."""
    from apps.placement.topology import read_spec_file
    from apps.scheduling import services

    spec = read_spec_file(str(EXAMPLES / "case-4-4-job.yaml"))
    spec["policy"] = "naive"
    job = run_job(case44_db, people["alice"], spec)
    services.migrations_propose(cluster=case44_db)
    return job
