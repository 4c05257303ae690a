"""The Slurm executor against a real Slurm 22.05 (scripts/slurm-local.sh: 16 slurmd on this host,
8 GPUs each, 4 leaves under a spine, slurmrestd on a unix socket)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.executors.connect import LOCAL_CONF, LOCAL_SOCKET, slurm_connect
from apps.executors.models import ForeignAllocation, SlurmSubmission
from apps.executors.slurmrest import SlurmRest
from apps.executors.sync import slurm_sync
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.cycle import schedule_cluster
from apps.scheduling.models import Allocation, Job, NodeAgent
from apps.scheduling.services import job_cancel, job_submit
from apps.topology.models import Cluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-local.sh"
ENV = {**os.environ, "SLURM_CONF": LOCAL_CONF}

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local Slurm, started by the script when it is not running (needs root)."""
    if not shutil.which("slurmctld") and not Path("/usr/sbin/slurmctld").exists():
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm slurmrestd munge)")
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        if os.geteuid() != 0:
            pytest.skip(
                "the local Slurm is not running and starting it needs root (scripts/slurm-local.sh start)"
            )
        subprocess.run(
            ["bash", str(SCRIPT), "start"], check=True, capture_output=True, text=True, timeout=180
        )
    scancel_all()
    yield SlurmRest(LOCAL_SOCKET)
    scancel_all()


def sh(*args: str, check: bool = True) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, env=ENV, check=check, timeout=60).stdout


def scancel_all() -> None:
    ids = sh("squeue", "-h", "-o", "%i", check=False).split()
    if ids:
        sh("scancel", *ids, check=False)
    for _ in range(100):
        if not sh("squeue", "-h", "-o", "%i", check=False).split():
            return
        time.sleep(0.2)


@pytest.fixture
def cluster(slurm_cluster, db):
    cluster, _ = slurm_connect(name="slurm-it", url=LOCAL_SOCKET, client=slurm_cluster)
    yield cluster
    scancel_all()
    for n in range(1, 17):
        sh("scontrol", "update", f"nodename=gpu{n:02d}", "state=resume", check=False)


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("alice", password="x")


def spec(name: str, gpus: int, command: list[str], *, tp: int | None = None) -> dict:
    tp = tp or min(gpus, 8)
    return {
        "version": 1,
        "name": name,
        "cluster": "slurm-it",
        "gpus": gpus,
        "parallelism": {"tp": tp, "pp": 1, "dp": gpus // tp},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}],
        "estimated_runtime_s": 600,
        "command": command,
        "workdir": "/tmp",
    }


def sync_until(cluster, job: Job, statuses, timeout: float = 40.0) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        slurm_sync(executor=cluster.executor)
        job.refresh_from_db()
        if job.status in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job.pk} is {job.status} ({job.pending_reason}), wanted {statuses}")
        time.sleep(0.5)


def place(cluster, user, s: dict) -> Job:
    job = job_submit(user=user, spec=s, cluster=cluster)
    schedule_cluster(cluster=cluster)
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING, job.pending_reason
    return job


def sbatch(*args: str) -> int:
    out = sh("sbatch", "--parsable", "-o", "/dev/null", *args)
    return int(out.strip().split(";")[0])


def wait_running(slurm_id: int) -> None:
    for _ in range(100):
        if sh("squeue", "-h", "-j", str(slurm_id), "-o", "%T", check=False).strip() == "RUNNING":
            return
        time.sleep(0.2)
    raise AssertionError(f"slurm job {slurm_id} did not start")


def test_nodes_gres_and_states_come_from_slurm(cluster):
    sh("scontrol", "update", "nodename=gpu16", "state=drain", "reason=bad fan")
    slurm_sync(executor=cluster.executor)
    agents = {a.node.name: a for a in NodeAgent.objects.filter(node__cluster=cluster).select_related("node")}
    assert len(agents) == 16
    assert agents["gpu16"].state == NodeState.DRAINED
    assert "bad fan" in agents["gpu16"].reason
    assert agents["gpu01"].state == NodeState.UP
    assert len(agents["gpu01"].inventory) == 8
    snapshot = snap.cluster_snapshot(cluster=cluster)
    gid = snapshot.topology.gid("gpu16", 0)
    assert not snapshot.free[gid]
    sh("scontrol", "update", "nodename=gpu16", "state=resume")
    # Resumed, Slurm pings it first (idle+NOT_RESPONDING: not schedulable), then it is idle.
    for _ in range(50):
        slurm_sync(executor=cluster.executor)
        state = NodeAgent.objects.get(node__name="gpu16", node__cluster=cluster).state
        if state == NodeState.UP:
            break
        time.sleep(0.2)
    assert state == NodeState.UP


def test_foreign_job_holds_its_gpus(cluster, user):
    foreign = sbatch("-w", "gpu02", "--gres=gpu:3", "--wrap", "sleep 120")
    wait_running(foreign)
    slurm_sync(executor=cluster.executor)
    rows = list(ForeignAllocation.objects.filter(cluster=cluster).order_by("gpu_index"))
    assert [(r.node.name, r.gpu_index) for r in rows] == [("gpu02", 0), ("gpu02", 1), ("gpu02", 2)]
    assert rows[0].label == f"slurm job {foreign} (root)"
    snapshot = snap.cluster_snapshot(cluster=cluster)
    for i in range(3):
        assert not snapshot.free[snapshot.topology.gid("gpu02", i)]
    assert snapshot.free[snapshot.topology.gid("gpu02", 3)]
    # A TopoWeb job never gets them.
    job = place(cluster, user, spec("small", 8, ["true"], tp=1))
    held = {("gpu02", i) for i in range(3)}
    assert not held & set(Allocation.objects.filter(job=job, live=True).values_list("node_name", "gpu_index"))
    sh("scancel", str(foreign))
    for _ in range(50):
        slurm_sync(executor=cluster.executor)
        if not ForeignAllocation.objects.filter(cluster=cluster).exists():
            break
        time.sleep(0.2)
    assert not ForeignAllocation.objects.filter(cluster=cluster).exists()


@pytest.fixture
def shared_dir():
    """A directory the job's tasks (slurmrestd's user, not root) can write."""
    path = Path(tempfile.mkdtemp(prefix="topoweb-slurm-test-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_job_runs_each_rank_on_its_planned_node_and_gpu(cluster, user, shared_dir):
    out = shared_dir
    cmd = ["sh", "-c", f"env > {out}/rank-$RANK.env"]
    job = place(cluster, user, spec("envs", 12, cmd, tp=4))
    slurm_sync(executor=cluster.executor)
    sub = SlurmSubmission.objects.get(job=job)
    assert sub.slurm_job_id
    job = sync_until(cluster, job, (JobStatus.COMPLETED, JobStatus.FAILED))
    assert job.status == JobStatus.COMPLETED, job.pending_reason
    ranks = {
        a.rank: (a.node_name, a.gpu_index)
        for a in Allocation.objects.filter(job=job, generation=job.generation)
    }
    assert len(ranks) == 12
    masters = set()
    for rank, (node, gpu) in ranks.items():
        env = dict(
            line.split("=", 1) for line in (out / f"rank-{rank}.env").read_text().splitlines() if "=" in line
        )
        assert env["RANK"] == str(rank)
        assert env["SLURMD_NODENAME"] == node
        assert env["CUDA_VISIBLE_DEVICES"] == str(gpu)
        assert env["WORLD_SIZE"] == "12"
        assert gpu in [int(g) for g in env["TOPOWEB_SLURM_GRANTED_GPUS"].split(",")]
        masters.add((env["MASTER_ADDR"], env["MASTER_PORT"]))
    assert len(masters) == 1


def test_failure_exit_code_and_cancel(cluster, user):
    bad = place(cluster, user, spec("bad", 2, ["sh", "-c", "exit 3"], tp=2))
    bad = sync_until(cluster, bad, (JobStatus.FAILED, JobStatus.COMPLETED))
    assert bad.status == JobStatus.FAILED
    assert "exit code 3" in bad.pending_reason
    long = place(cluster, user, spec("long", 2, ["sleep", "300"], tp=2))
    long = sync_until(cluster, long, (JobStatus.RUNNING,))
    slurm_id = SlurmSubmission.objects.get(job=long).slurm_job_id
    assert sh("squeue", "-h", "-j", str(slurm_id), "-o", "%T").strip() == "RUNNING"
    job_cancel(job=long)
    slurm_sync(executor=cluster.executor)
    for _ in range(50):
        if sh("squeue", "-h", "-j", str(slurm_id), "-o", "%T", check=False).strip() not in (
            "RUNNING",
            "COMPLETING",
        ):
            break
        time.sleep(0.2)
    assert sh("squeue", "-h", "-j", str(slurm_id), "-o", "%T", check=False).strip() in ("", "CANCELLED")


def test_node_down_mid_job_fails_it(cluster, user):
    job = place(cluster, user, spec("victim", 8, ["sleep", "300"]))
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    node = Allocation.objects.filter(job=job).first().node_name
    sh("scontrol", "update", f"nodename={node}", "state=down", "reason=pulled cable")
    job = sync_until(
        cluster, job, (JobStatus.FAILED, JobStatus.QUEUED, JobStatus.PLACING, JobStatus.CANCELLED)
    )
    assert job.status == JobStatus.FAILED, job.pending_reason
    assert "node failure" in job.pending_reason or node in job.pending_reason
    assert NodeAgent.objects.get(node__cluster=cluster, node__name=node).state == NodeState.DOWN


def test_sbatch_taking_planned_gpus_first_replans_in_one_sync(cluster, user):
    job = place(cluster, user, spec("racer", 8, ["sleep", "300"]))
    planned = set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True))
    (node,) = planned
    foreign = sbatch("-w", node, "--gres=gpu:8", "--wrap", "sleep 120")
    wait_running(foreign)
    result = slurm_sync(executor=cluster.executor)
    assert job.pk in result.requeued
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    assert "re-placing" in job.requeue_reason
    now = set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True))
    assert node not in now
    assert job.pk in result.submitted
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    slurm_id = SlurmSubmission.objects.get(job=job, generation=job.generation).slurm_job_id
    assert sh("squeue", "-h", "-j", str(slurm_id), "-o", "%N").strip() in now


def test_slurm_connect_imports_the_live_cluster_and_slurm_sync_reports(slurm_cluster, db):
    out = StringIO()
    call_command("slurm_connect", "--cluster", "slurm-cmd", "--defaults", "{nics_per_node: 8}", stdout=out)
    assert "16 nodes" in out.getvalue()
    cluster = Cluster.objects.get(name="slurm-cmd")
    assert cluster.executor.kind == "slurm"
    topology = snap.cluster_snapshot(cluster=cluster).topology
    assert topology.n_gpus == 128
    assert len(topology.leaf_names) == 4
    out = StringIO()
    call_command("slurm_sync", "--cluster", "slurm-cmd", stdout=out)
    assert json.loads(out.getvalue().splitlines()[0])["nodes"] == 16
    with pytest.raises(CommandError, match="not run by Slurm"):
        call_command("slurm_sync", "--cluster", "nope")
