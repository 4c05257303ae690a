"""The Slurm executor against a real Slurm 22.05 (scripts/slurm-local.sh: 16 slurmd on this host,
8 GPUs each, 4 leaves under a spine, auth/jwt beside munge, slurmrestd with rest_auth/jwt on a unix
socket, task/cgroup with ConstrainDevices where the devices cgroup allows). TopoWeb reads as the
`slurm` user and submits with tokens it mints from the cluster's key."""

from __future__ import annotations

import base64
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
from django.db import transaction

from apps.executors.models import ForeignAllocation, SlurmSubmission
from apps.executors.slurm import sync as sync_module
from apps.executors.slurm.connect import LOCAL_CONF, LOCAL_JWT_KEY, LOCAL_SOCKET, slurm_connect
from apps.executors.slurm.rest import SlurmRest, group
from apps.executors.slurm.script import RankSlot, submission
from apps.executors.slurm.sync import slurm_sync
from apps.scheduling import lifecycle
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import ACTIVE_STATUSES, JobStatus, NodeState
from apps.scheduling.cycle import schedule_cluster
from apps.scheduling.models import Allocation, Job, NodeHealth
from apps.scheduling.reconcile import findings
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
    yield SlurmRest(LOCAL_SOCKET, user="slurm", jwt_key=Path(LOCAL_JWT_KEY).read_bytes())
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
    key = base64.b64encode(Path(LOCAL_JWT_KEY).read_bytes()).decode()
    cluster, _ = slurm_connect(
        name="slurm-it", url=LOCAL_SOCKET, client=slurm_cluster, slurm_user="slurm", jwt_key=key
    )
    yield cluster
    scancel_all()
    for n in range(1, 17):
        sh("scontrol", "update", f"nodename=gpu{n:02d}", "state=resume", check=False)


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("alice", password="x")


# The tasks' working directory, where Slurm writes each batch's output (topoweb-JOB-GEN-%j.out): a
# fresh one per run. TopoWeb's job ids and a new local Slurm's start over in every run, and a file of
# that name left in /tmp by an earlier run under another uid cannot be opened (JobLaunchFailure).
WORKDIR = Path(tempfile.mkdtemp(prefix="topoweb-slurm-work-", dir="/tmp"))
WORKDIR.chmod(0o1777)


@pytest.fixture(scope="module", autouse=True)
def _workdir_removed():
    yield
    shutil.rmtree(WORKDIR, ignore_errors=True)


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
        "workdir": str(WORKDIR),
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
    agents = {a.node.name: a for a in NodeHealth.objects.filter(node__cluster=cluster).select_related("node")}
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
        state = NodeHealth.objects.get(node__name="gpu16", node__cluster=cluster).state
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
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == int(env["LOCAL_WORLD_SIZE"])
        assert env["WORLD_SIZE"] == "12"
        assert gpu in [int(g) for g in env["TOPOWEB_SLURM_GRANTED_GPUS"].split(",")]
        masters.add((env["MASTER_ADDR"], env["MASTER_PORT"]))
    # Every task and the rank map agree on MASTER_ADDR: rank 0's node's address as Slurm
    # reports it (NodeAddr; 127.0.0.1 on the local Slurm, whose node names do not resolve).
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(user)
    rankmap = api.get(f"/api/v1/jobs/{job.pk}/rankmap/").json()
    addr = NodeHealth.objects.get(node__cluster=cluster, node__name=ranks[0][0]).addr
    assert addr and masters == {(rankmap["master_addr"], str(rankmap["master_port"]))}
    assert rankmap["master_addr"] == addr


def test_each_ranks_output_reaches_topoweb_logs_and_the_job_page(cluster, user, shared_dir):
    """Every task writes its rank's output to its own file; the sync stores it as the agents'
    shipped logs while the job runs and to the end when it ends: `topoweb logs JOB --rank N`
    (the API it pages) and the job page show each rank's own lines."""
    from rest_framework.test import APIClient

    from apps.cli.commands import rank_log
    from apps.scheduling.choices import RankState
    from apps.scheduling.models import RankRun

    shared_dir.joinpath("go").unlink(missing_ok=True)
    cmd = [
        "sh",
        "-c",
        f"echo early $RANK of $WORLD_SIZE; echo warn $RANK >&2; "
        f"while [ ! -e {shared_dir}/go ]; do sleep 0.2; done; seq 1 2000 | sed s/^/line-$RANK-/; echo late $RANK",
    ]
    s = {**spec("talk", 12, cmd, tp=4), "workdir": str(shared_dir)}
    job = place(cluster, user, s)
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    api = APIClient()
    api.force_authenticate(user)
    # While it runs: every rank is a running rank run with its early output.
    deadline = time.monotonic() + 60
    while True:
        slurm_sync(executor=cluster.executor)
        runs = {r.rank: r for r in RankRun.objects.filter(job=job, generation=job.generation)}
        if len(runs) == 12 and all("early" in r.log_tail for r in runs.values()):
            break
        assert time.monotonic() < deadline, {r: x.log_tail for r, x in runs.items()}
        time.sleep(0.5)
    assert all(r.state == RankState.STARTED for r in runs.values())
    page = api.get(f"/api/v1/jobs/{job.pk}/logs/7/").json()
    assert page["text"] == "early 7 of 12\nwarn 7\n" and page["state"] == "started", page
    (shared_dir / "go").touch()
    job = sync_until(cluster, job, (JobStatus.COMPLETED, JobStatus.FAILED))
    assert job.status == JobStatus.COMPLETED, job.pending_reason

    class Api:  # the CLI's client, over the test API client
        def json(self, method, path, params=None):
            return api.get(f"/api/v1/{path}", params).json()

    for rank in range(12):
        out = StringIO()
        rank_log(Api(), job.pk, rank, None, out=out)
        lines = out.getvalue().splitlines()
        assert lines[:2] == [f"early {rank} of 12", f"warn {rank}"], lines[:3]
        assert lines[2:-1] == [f"line-{rank}-{i}" for i in range(1, 2001)]
        assert lines[-1] == f"late {rank}"
    runs = api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert [(r["rank"], r["state"], r["exit_code"]) for r in runs] == [(r, "exited", 0) for r in range(12)]
    assert all(r["log_tail"].endswith(f"late {r['rank']}\n") for r in runs)
    node = Allocation.objects.get(job=job, rank=5).node_name
    assert {r["node"] for r in runs if r["rank"] == 5} == {node}
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    html = browser.get(f"/jobs/{job.pk}/?log_rank=5").content.decode()
    assert "rank 5 on" in html and "late 5" in html and "late 4" not in html


def test_a_cancelled_jobs_ranks_stop_and_its_gpus_free_once_slurm_stopped_it(cluster, user, shared_dir):
    from apps.scheduling.choices import RankState
    from apps.scheduling.models import RankRun

    job = place(
        cluster,
        user,
        {**spec("stopme", 4, ["sh", "-c", "echo up; exec sleep 300"], tp=4), "workdir": str(shared_dir)},
    )
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    job_cancel(job=job)
    deadline = time.monotonic() + 60
    while Allocation.objects.filter(job=job, live=True).exists():
        assert time.monotonic() < deadline
        slurm_sync(executor=cluster.executor)
        time.sleep(0.5)
    runs = list(RankRun.objects.filter(job=job))
    assert len(runs) == 4 and {(r.state, r.exit_cause) for r in runs} == {(RankState.EXITED, "stopped")}
    assert all("up" in r.log_tail for r in runs)


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
    assert NodeHealth.objects.get(node__cluster=cluster, node__name=node).state == NodeState.DOWN


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


# -- TopoWeb's Slurm jobs never outlive its jobs ----------------------------------------------------

# Slurm states after which a job record will not run again (any other is live).
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
ENDED |= {"OUT_OF_MEMORY", "REVOKED"}


def live_unheld(client: SlurmRest) -> dict[int, str]:
    """Live Slurm jobs (some component not ended) that are not the recorded Slurm job of an
    active TopoWeb job's current generation: Slurm job id -> its components' states."""
    held = {
        sid
        for sid, status, gen, current in SlurmSubmission.objects.values_list(
            "slurm_job_id", "job__status", "generation", "job__generation"
        )
        if status in ACTIVE_STATUSES and gen == current
    }
    return {
        gid: ",".join(c.state for c in comps)
        for gid, comps in group(client.jobs()).items()
        if gid not in held and any(c.state not in ENDED for c in comps)
    }


def settled(client: SlurmRest, timeout: float = 20.0) -> dict[int, str]:
    """`live_unheld` once it is empty (Slurm finishes cleaning up what was cancelled; no sync
    runs meanwhile) or after `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := live_unheld(client)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def resume(node: str) -> None:
    sh("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    for _ in range(100):
        if sh("sinfo", "-h", "-n", node, "-o", "%t", check=False).strip() == "idle":
            return
        time.sleep(0.2)


def test_slurm_never_requeues_a_topoweb_job_and_every_component_is_tagged(cluster, user):
    job = place(cluster, user, spec("pair", 16, ["sleep", "300"], tp=8))
    slurm_sync(executor=cluster.executor)
    sid = SlurmSubmission.objects.get(job=job).slurm_job_id
    text = sh("scontrol", "show", "job", str(sid))
    tag = f"Comment=topoweb:slurm-it:{job.pk}:{job.generation}:{cluster.executor.server_id}"
    assert text.count("HetJobOffset=") == 2
    assert text.count("Requeue=0") == 2, text
    assert text.count(tag) == 2, text


@pytest.fixture
def slurm_requeues(monkeypatch):
    """Slurm requeues the jobs TopoWeb submits, as on a Slurm whose `JobRequeue=1` default (or a
    job_submit plugin) wins over TopoWeb's `no_requeue`: the worst case for TopoWeb."""
    real = sync_module.submission

    def requeueing(**kwargs):
        body = real(**kwargs)
        for comp in body.get("jobs") or [body["job"]]:
            comp.pop("no_requeue", None)
            comp["requeue"] = True
        return body

    monkeypatch.setattr(sync_module, "submission", requeueing)


@pytest.mark.parametrize("requeue", [True, False], ids=["requeue", "no-requeue"])
def test_node_down_under_a_multi_node_job_leaves_nothing_in_slurm(
    cluster, user, slurm_cluster, slurm_requeues, requeue
):
    job = place(cluster, user, {**spec("wide", 32, ["sleep", "300"], tp=8), "requeue": requeue})
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    gen = job.generation
    sid = SlurmSubmission.objects.get(job=job, generation=gen).slurm_job_id
    nodes = list(
        dict.fromkeys(
            Allocation.objects.filter(job=job, generation=gen)
            .order_by("rank")
            .values_list("node_name", flat=True)
        )
    )
    assert len(nodes) == 4
    victim = nodes[2]
    sh("scontrol", "update", f"nodename={victim}", "state=down", "reason=test")
    try:
        # Slurm requeues the components (the leader and two others pending again after a run).
        for _ in range(50):
            if any(c.restarts or c.state == "PENDING" for c in slurm_cluster.job(sid)):
                break
            time.sleep(0.2)
        first = slurm_sync(executor=cluster.executor)
        slurm_sync(executor=cluster.executor)
        job.refresh_from_db()
        if requeue:
            # Back in the queue and placed again at once, away from the down node.
            assert job.pk in first.requeued
            assert job.generation > gen and job.status in ACTIVE_STATUSES
            assert "Slurm requeued it" in job.requeue_reason
            assert victim not in set(
                Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True)
            )
        else:
            assert job.status == JobStatus.FAILED, job.pending_reason
            assert "Slurm requeued it" in job.pending_reason
        # Within those two syncs every component of the old Slurm job was cancelled: what is
        # left finishes cleaning up by itself.
        assert settled(slurm_cluster) == {}
        states = {c.state for c in slurm_cluster.job(sid)}
        assert states <= ENDED, states
    finally:
        resume(victim)


class Crash(Exception):
    """TopoWeb dies right after Slurm accepted a job, before it saved the job's id."""


class CrashAfterSubmit:
    def __init__(self, client: SlurmRest):
        self.client = client
        self.ids: list[int] = []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def submit(self, body, *, user=None):
        self.ids.append(self.client.submit(body, user=user))
        raise Crash


@pytest.mark.parametrize("then", ["cancelled", "still-placing"])
def test_a_job_slurm_accepted_but_topoweb_never_saved(cluster, user, slurm_cluster, then):
    job = place(cluster, user, spec("crash", 8, ["sleep", "300"]))
    crashing = CrashAfterSubmit(slurm_cluster)
    with pytest.raises(Crash):
        slurm_sync(executor=cluster.executor, client=crashing)
    (sid,) = crashing.ids
    assert not SlurmSubmission.objects.filter(job=job).exists()
    assert sid in live_unheld(slurm_cluster)
    if then == "cancelled":
        # Cancelled in TopoWeb before anyone saw its Slurm job: the next sync cancels it there.
        job_cancel(job=job)
        result = slurm_sync(executor=cluster.executor)
        assert sid in result.orphans_cancelled
        assert settled(slurm_cluster) == {}
    else:
        # Still placed in that generation: its Slurm job is recorded, not submitted a second time.
        result = slurm_sync(executor=cluster.executor)
        assert sid in result.recorded and job.pk not in result.submitted
        assert SlurmSubmission.objects.get(job=job, generation=job.generation).slurm_job_id == sid
        job = sync_until(cluster, job, (JobStatus.RUNNING,))
        assert live_unheld(slurm_cluster) == {}
        tag = f"topoweb:slurm-it:{job.pk}:{job.generation}:{cluster.executor.server_id}"
        tagged = {j.group_id for j in slurm_cluster.jobs() if j.comment == tag and j.state not in ENDED}
        assert tagged == {sid}


def test_a_job_topoweb_ended_whose_slurm_job_lives_on_is_cancelled(cluster, user, slurm_cluster):
    """What bug 1 left: TopoWeb failed the job and closed its submission while Slurm kept it."""
    job = place(cluster, user, spec("closed", 8, ["sleep", "300"]))
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    sub = SlurmSubmission.objects.get(job=job)
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        lifecycle.finish(
            job=locked, status=JobStatus.FAILED, reason="failed by the test", now=locked.started_at
        )
    SlurmSubmission.objects.filter(pk=sub.pk).update(state="FAILED")
    assert sub.slurm_job_id in live_unheld(slurm_cluster)
    # `manage.py reconcile --check` names it (through the executor port) ...
    found = [f for f in findings(cluster=cluster) if f.kind == "slurm-orphan"]
    assert len(found) == 1 and f"Slurm job {sub.slurm_job_id} " in found[0].text
    result = slurm_sync(executor=cluster.executor)
    assert result.orphans_cancelled == [sub.slurm_job_id]
    assert settled(slurm_cluster) == {}
    # ... and no longer once the sync cancelled it.
    assert not [f for f in findings(cluster=cluster) if f.kind.startswith("slurm-")]


def test_other_servers_jobs_and_foreign_jobs_are_left_alone(cluster, user, slurm_cluster):
    # A TopoWeb job TopoWeb cancelled: a live Slurm job tagged with it would be an orphan if ours.
    job = place(cluster, user, spec("gone", 8, ["sleep", "300"]))
    job_cancel(job=job)
    all_nodes = [f"gpu{n:02d}" for n in range(1, 17)]

    def tagged(node: str, server: str) -> int:
        body = submission(
            cluster="slurm-it",
            job_id=job.pk,
            generation=job.generation,
            name="elsewhere",
            slots=[RankSlot(0, node, 0)],
            command=["sleep", "120"],
            env={},
            workdir="/tmp",
            master_addr=node,
            master_port=29500,
            all_nodes=all_nodes,
            output="/dev/null",
            server=server,
        )
        return slurm_cluster.submit(body)

    other = tagged("gpu05", "another")  # another TopoWeb server's, same cluster name and job id
    legacy = tagged("gpu06", "")  # a tag from before servers were named, its id never recorded here
    foreign = sbatch("-w", "gpu07", "--gres=gpu:1", "--wrap", "sleep 120")
    for sid in (other, legacy, foreign):
        wait_running(sid)
    for _ in range(2):
        result = slurm_sync(executor=cluster.executor)
        assert result.orphans_cancelled == [] and result.recorded == []
    assert {other, legacy, foreign} <= set(live_unheld(slurm_cluster))
    # All three hold GPUs TopoWeb does not place on.
    held = set(ForeignAllocation.objects.filter(cluster=cluster).values_list("slurm_job_id", flat=True))
    assert {other, legacy, foreign} <= held


# The launch-contract program each task runs: what `torch.cuda.set_device(LOCAL_RANK)` does, on the
# local Slurm's GPU device files. CUDA numbers the devices a process can open in device order and
# CUDA_VISIBLE_DEVICES picks among them; a device file without a driver opens with ENXIO when the
# devices cgroup lets the process at it and EPERM when ConstrainDevices denies it.
CONTRACT = r"""
import errno, json, os, sys
out, devdir, constrained = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
env = os.environ
def reachable(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return True
    except OSError as exc:
        if exc.errno == errno.EPERM:
            return False
        if exc.errno == errno.ENXIO:
            return True
        raise
devices = sorted((os.minor(os.stat(os.path.join(devdir, n)).st_rdev), n) for n in os.listdir(devdir))
cuda = [minor for minor, n in devices if reachable(os.path.join(devdir, n))]
visible = env["CUDA_VISIBLE_DEVICES"].split(",")
local = int(env["LOCAL_RANK"])
problems = []
if not 0 <= local < len(visible):
    problems.append(f"LOCAL_RANK {local} outside CUDA_VISIBLE_DEVICES {visible}")
    gpu = None
else:
    ordinal = int(visible[local])
    gpu = cuda[ordinal] if 0 <= ordinal < len(cuda) else None
    if gpu is None:
        problems.append(f"device {ordinal} of {len(cuda)} visible")
granted = sorted(int(g) for g in env["TOPOWEB_SLURM_GRANTED_GPUS"].split(","))
if constrained and cuda != granted:
    problems.append(f"opens GPUs {cuda}, granted {granted}")
with open(f"/proc/self/status") as f:
    uid = int(next(l for l in f if l.startswith("Uid:")).split()[1])
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "TOPOWEB_NODE", "TOPOWEB_JOB_ID", "USER")
record = {"uid": uid, "gpu": gpu, "node": env["SLURMD_NODENAME"], "problems": problems,
          "env": {k: env.get(k) for k in keys}}
with open(os.path.join(out, f"rank-{env['TOPOWEB_JOB_ID']}-{env['RANK']}.json"), "w") as f:
    json.dump(record, f)
sys.exit(1 if problems else 0)
"""


@pytest.fixture
def unix_users(shared_dir):
    """Two Unix accounts made for the test (removed after)."""
    names = [f"tws{os.getpid() % 100000}a", f"tws{os.getpid() % 100000}b"]
    for name in names:
        subprocess.run(["useradd", "-M", "-d", str(shared_dir), "-s", "/bin/sh", name], check=True)
    yield names
    for name in names:
        subprocess.run(["userdel", "-f", name], check=False, capture_output=True)


def test_every_task_runs_as_its_owner_and_passes_the_launch_contract(cluster, shared_dir, unix_users):
    """Two TopoWeb users, each mapped to their own Unix account, submit through TopoWeb (tokens
    minted per owner, rest_auth/jwt): every task runs under its owner's uid and, on jobs of 2, 8
    and 20 GPUs, picks its planned GPU with CUDA_VISIBLE_DEVICES[LOCAL_RANK], under
    ConstrainDevices when the local Slurm runs task/cgroup."""
    from apps.scheduling.models import UnixAccount

    conf = Path(LOCAL_CONF).read_text()
    constrained = "TaskPlugin=task/cgroup" in conf
    if os.environ.get("CI") and Path("/sys/fs/cgroup/devices/devices.allow").exists():
        assert constrained, "the local Slurm should run task/cgroup with ConstrainDevices here"
    cluster.executor.submit_as_owner = True
    cluster.executor.save()
    users = []
    for login, account in zip(("ann", "ben"), unix_users, strict=True):
        u = get_user_model().objects.create_user(login, password="x")
        UnixAccount.objects.create(user=u, name=account)
        users.append(u)
    program = shared_dir / "contract.py"
    program.write_text(CONTRACT)
    program.chmod(0o644)
    devdir = str(Path(LOCAL_CONF).parents[1] / "dev")
    cmd = ["/usr/bin/python3", str(program), str(shared_dir), devdir, "1" if constrained else "0"]
    jobs = [
        place(cluster, users[0], spec("c2", 2, cmd, tp=2)),
        place(cluster, users[1], spec("c8", 8, cmd, tp=8)),
        place(cluster, users[0], spec("c20", 20, cmd, tp=4)),
    ]
    deadline = time.monotonic() + 120
    while True:
        slurm_sync(executor=cluster.executor)
        for j in jobs:
            j.refresh_from_db()
        if all(j.status not in ACTIVE_STATUSES for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    uids = {u.pk: int(sh("id", "-u", a).strip()) for u, a in zip(users, unix_users, strict=True)}
    checked = 0
    for job in jobs:
        planned = {
            a.rank: (a.node_name, a.gpu_index)
            for a in Allocation.objects.filter(job=job, generation=job.generation)
        }
        assert len(planned) == job.gpus
        sub = SlurmSubmission.objects.get(job=job)
        assert sub.slurm_user == UnixAccount.objects.get(user_id=job.owner_id).name
        for rank, (node, gpu) in sorted(planned.items()):
            path = shared_dir / f"rank-{job.pk}-{rank}.json"
            assert path.exists(), (
                f"job {job.pk} ({job.status}: {job.pending_reason}) rank {rank} left no record"
            )
            rec = json.loads(path.read_text())
            assert rec["problems"] == [], (job.pk, rank, rec)
            assert rec["uid"] == uids[job.owner_id], (job.pk, rank, rec["uid"])
            assert (rec["node"], rec["gpu"]) == (node, gpu), (job.pk, rank, rec)
            # Rank 0's node's address as Slurm reports it (NodeAddr), as the rank map shows it.
            master = NodeHealth.objects.get(node__cluster=cluster, node__name=planned[0][0]).addr
            assert rec["env"]["MASTER_ADDR"] == master and rec["env"]["WORLD_SIZE"] == str(job.gpus)
            assert rec["env"]["USER"] == UnixAccount.objects.get(user_id=job.owner_id).name
            checked += 1
        assert job.status == JobStatus.COMPLETED, job.pending_reason
    assert checked == 30


def test_a_user_without_a_unix_account_is_refused_at_submit(cluster, user):
    from apps.placement.topology import SpecError

    cluster.executor.submit_as_owner = True
    cluster.executor.save()
    ghost = get_user_model().objects.create_user("tw-no-such-account", password="x")
    with pytest.raises(SpecError, match="no Unix account 'tw-no-such-account'"):
        job_submit(user=ghost, spec=spec("ghost", 2, ["true"], tp=2), cluster=cluster)
    assert not Job.objects.filter(owner=ghost).exists()


# -- granted elsewhere: recorded, never stopped ------------------------------------------------------


class ForeignFirst(SlurmRest):
    """slurmrestd, but before TopoWeb's first submission a foreign sbatch takes `gpus` GPUs of
    `node` (after the sync listed the jobs, so TopoWeb does not see it coming): Slurm grants the
    TopoWeb jobs other indexes than planned."""

    def __init__(self, base: SlurmRest, node: str, gpus: int):
        super().__init__(base.url, user=base.user, jwt_key=base.jwt_key)
        self.node, self.gpus, self.foreign = node, gpus, None

    def submit(self, body, *, user=None):
        if self.foreign is None:
            self.foreign = sbatch("-w", self.node, f"--gres=gpu:{self.gpus}", "--wrap", "sleep 120")
            wait_running(self.foreign)
        return super().submit(body, user=user)


def test_a_job_granted_other_gpus_runs_on_and_its_rank_map_is_what_ran(
    cluster, user, shared_dir, slurm_cluster
):
    """Two jobs planned on one node; a foreign job takes the first one's planned GPUs between
    TopoWeb's listing and its submission. Slurm grants the first job the second's planned GPUs
    and the second other ones: both are recorded where Slurm runs them, no task is stopped, and
    each rank's allocation is the GPU it opened."""
    program = shared_dir / "contract.py"
    program.write_text(CONTRACT)
    program.chmod(0o644)
    constrained = "TaskPlugin=task/cgroup" in Path(LOCAL_CONF).read_text()
    devdir = str(Path(LOCAL_CONF).parents[1] / "dev")
    contract = f"/usr/bin/python3 {program} {shared_dir} {devdir} {int(constrained)}"
    cmd = ["sh", "-c", f"{contract} && sleep 8 && touch {shared_dir}/done-$TOPOWEB_JOB_ID-$RANK"]
    first = place(cluster, user, spec("first", 2, cmd, tp=2))
    second = place(cluster, user, spec("second", 2, cmd, tp=2))
    plans = {
        j.pk: {a.rank: (a.node_name, a.gpu_index) for a in Allocation.objects.filter(job=j, live=True)}
        for j in (first, second)
    }
    node = plans[first.pk][0][0]
    assert {n for p in plans.values() for n, _ in p.values()} == {node}, plans
    client = ForeignFirst(slurm_cluster, node, 2)
    result = slurm_sync(executor=cluster.executor, client=client)
    assert sorted(result.submitted) == [first.pk, second.pk]
    # Both started in Slurm before TopoWeb looks again (a job still pending then, planned on GPUs
    # granted to the other, would be re-placed: not started, so that is allowed, but not this case).
    for sub in SlurmSubmission.objects.filter(job__in=[first, second]):
        wait_running(sub.slurm_job_id)
    killed = []
    deadline = time.monotonic() + 90
    while True:
        result = slurm_sync(executor=cluster.executor, client=client)
        killed += result.requeued + result.cancelled + result.orphans_cancelled
        for j in (first, second):
            j.refresh_from_db()
        if all(j.status not in ACTIVE_STATUSES for j in (first, second)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert killed == []
    moved = 0
    for job in (first, second):
        assert job.status == JobStatus.COMPLETED, job.pending_reason
        assert job.generation == 1
        final = {a.rank: (a.node_name, a.gpu_index) for a in Allocation.objects.filter(job=job, generation=1)}
        moved += final != plans[job.pk]
        for rank, where in final.items():
            rec = json.loads((shared_dir / f"rank-{job.pk}-{rank}.json").read_text())
            assert rec["problems"] == [], rec
            assert (rec["node"], rec["gpu"]) == where, (job.pk, rank, rec, plans[job.pk])
            assert (shared_dir / f"done-{job.pk}-{rank}").exists()
    assert moved == 2, "Slurm should have granted both jobs other GPUs than planned"
    sh("scancel", str(client.foreign))


# -- operator actions and time limits as on agent clusters ------------------------------------------


def test_a_drain_made_in_topoweb_is_slurms_and_survives_the_next_sync(cluster):
    from apps.scheduling.executor import Refused
    from apps.scheduling.nodes import node_drain, node_resume
    from apps.topology.models import Node

    node = Node.objects.get(cluster=cluster, name="gpu15")
    with pytest.raises(Refused, match="scontrol update nodename=gpu15 state=drain"):
        node_drain(node=node, reason="fan check")
    assert "drain" not in sh("sinfo", "-h", "-n", "gpu15", "-o", "%T")
    cluster.executor.scontrol_nodes = True
    cluster.executor.save()
    node_drain(node=node, reason="fan check")
    assert sh("sinfo", "-h", "-n", "gpu15", "-o", "%T %E").strip() == "drained fan check"
    for _ in range(3):
        slurm_sync(executor=cluster.executor)
    agent = NodeHealth.objects.get(node=node)
    assert agent.state == NodeState.DRAINED and "fan check" in agent.reason
    node_resume(node=node)
    assert "drain" not in sh("sinfo", "-h", "-n", "gpu15", "-o", "%T")
    for _ in range(50):
        slurm_sync(executor=cluster.executor)
        if NodeHealth.objects.get(node=node).state == NodeState.UP:
            break
        time.sleep(0.2)
    assert NodeHealth.objects.get(node=node).state == NodeState.UP


def test_a_job_past_its_time_limit_fails_with_the_agents_reason(cluster, user):
    """time_limit_min 1: Slurm's TimeLimit=1 stops it (TIMEOUT); the reason is the one the agents'
    server side gives (tests/unit/scheduling/test_time_limits.py)."""
    job = place(cluster, user, {**spec("slow", 2, ["sleep", "600"], tp=2), "time_limit_min": 1})
    job = sync_until(cluster, job, (JobStatus.RUNNING,))
    slurm_id = SlurmSubmission.objects.get(job=job).slurm_job_id
    assert "TimeLimit=00:01:00" in sh("scontrol", "show", "job", str(slurm_id))
    job = sync_until(cluster, job, (JobStatus.FAILED, JobStatus.COMPLETED), timeout=150)
    assert job.status == JobStatus.FAILED
    assert job.pending_reason.startswith("time limit: stopped after its time_limit_min of 1 min")
    assert "TIMEOUT" in job.pending_reason
    assert (job.finished_at - job.started_at).total_seconds() >= 55
