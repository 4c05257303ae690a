"""The Slurm sync against a scripted slurmrestd (no Slurm): states, rebinding, races, refusals."""

from __future__ import annotations

import re
from datetime import UTC

import pytest
from django.contrib.auth import get_user_model

from apps.executors.models import ForeignAllocation, SlurmSubmission
from apps.executors.slurm.connect import slurm_connect
from apps.executors.slurm.rest import SlurmError, SlurmJob, SlurmNode
from apps.executors.slurm.sync import slurm_orphans, slurm_sync, stop_job
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.cycle import schedule_cluster
from apps.scheduling.models import Allocation, NodeHealth
from apps.scheduling.services import job_cancel, job_submit
from tests.unit.scheduling.conftest import eager_celery  # noqa: F401  (autouse: tasks run in-process)

TOPOLOGY = (
    "SwitchName=leaf1 Nodes=n[1-2]\nSwitchName=leaf2 Nodes=n[3-4]\nSwitchName=spine Switches=leaf[1-2]\n"
)


class FakeSlurm:
    """What slurmrestd would answer: `nodes`, `records` (SlurmJob by id); records submissions."""

    def __init__(self):
        self.nodes_ = {f"n{i}": SlurmNode(f"n{i}", "idle", (), "", 8, f"10.0.0.{i}") for i in range(1, 5)}
        self.records: dict[int, list[SlurmJob]] = {}
        self.submitted: list[dict] = []
        self.cancelled: list[int] = []
        self.refuse: str = ""
        self.next_id = 100

    def ping(self):
        return [{"ping": "UP"}]

    def nodes(self):
        return list(self.nodes_.values())

    def jobs(self):
        return [j for comps in self.records.values() for j in comps]

    def job(self, job_id):
        return self.records.get(job_id, [])

    def submit(self, body, *, user=None):
        if self.refuse:
            raise SlurmError(self.refuse)
        self.next_id += 1
        self.submitted.append(body)
        comps = body.get("jobs") or [body["job"]]
        self.records[self.next_id] = [
            SlurmJob(
                self.next_id + i,
                self.next_id,
                "",
                "slurm",
                "PENDING",
                "Priority",
                None,
                None,
                (),
                {},
                c.get("comment", ""),
            )
            for i, c in enumerate(comps)
        ]
        return self.next_id

    def cancel(self, job_id, *, user=None):
        self.cancelled.append(job_id)
        self.records[job_id] = [_with(j, state="CANCELLED") for j in self.records.get(job_id, [])]

    def run(self, job_id, granted: dict[str, list[int]]):
        """Start the job: component i on the i-th node of `granted`, with those GPU indexes."""
        comps = self.records[job_id]
        self.records[job_id] = [
            _with(c, state="RUNNING", reason="None", nodes=(node,), gpus={node: tuple(idx)})
            for c, (node, idx) in zip(comps, granted.items(), strict=True)
        ]

    def end(self, job_id, state, exit_code=None):
        self.records[job_id] = [_with(c, state=state, exit_code=exit_code) for c in self.records[job_id]]


def _with(job: SlurmJob, **changes) -> SlurmJob:
    fields = {k: getattr(job, k) for k in SlurmJob.__slots__ if not k.startswith("_")}
    fields.update(changes)
    return SlurmJob(**fields)


@pytest.fixture
def fake():
    return FakeSlurm()


@pytest.fixture
def cluster(db, fake):
    cluster, _ = slurm_connect(name="fake", url="unix:/nonexistent.sock", topology_text=TOPOLOGY, client=fake)
    return cluster


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("alice", password="x")


def spec(gpus: int, **extra) -> dict:
    return {
        "version": 1,
        "name": f"j{gpus}",
        "cluster": "fake",
        "gpus": gpus,
        "parallelism": {"tp": min(gpus, 8), "pp": 1, "dp": max(gpus // 8, 1)},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}],
        "estimated_runtime_s": 600,
        "command": ["python", "train.py"],
        **extra,
    }


def placed(cluster, user, gpus=8, **extra):
    job = job_submit(user=user, spec=spec(gpus, **extra), cluster=cluster)
    schedule_cluster(cluster=cluster)
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    return job


def sync(cluster, fake):
    return slurm_sync(executor=cluster.executor, client=fake)


def test_node_states_and_foreign_gpus(cluster, fake):
    fake.nodes_["n2"] = SlurmNode("n2", "mixed", ("DRAIN",), "fan", 8, "x")
    fake.nodes_["n3"] = SlurmNode("n3", "idle", (), "", 4, "x")
    fake.records[7] = [
        SlurmJob(7, 0, "other", "bob", "RUNNING", "None", None, None, ("n4",), {"n4": (0, 5)}, "")
    ]
    result = sync(cluster, fake)
    assert result.foreign_jobs == 1
    agents = {a.node.name: a for a in NodeHealth.objects.select_related("node")}
    assert agents["n2"].state == NodeState.DRAINING and "fan" in agents["n2"].reason
    assert [g["gpu"] for g in agents["n3"].unhealthy_gpus] == [4, 5, 6, 7]
    assert sorted(ForeignAllocation.objects.values_list("gpu_index", flat=True)) == [0, 5]
    fake.records[7] = [_with(fake.records[7][0], state="COMPLETED")]
    sync(cluster, fake)
    assert not ForeignAllocation.objects.exists()


def test_job_goes_pending_running_rebinds_and_completes(cluster, fake, user):
    job = placed(cluster, user, 4)
    result = sync(cluster, fake)
    assert result.submitted == [job.pk]
    (sub,) = SlurmSubmission.objects.filter(job=job)
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING and "pending (Priority)" in job.pending_reason
    node = Allocation.objects.filter(job=job).first().node_name
    planned = sorted(Allocation.objects.filter(job=job).values_list("gpu_index", flat=True))
    granted = [g for g in range(8) if g not in planned][:4]  # Slurm picked other GPUs
    fake.run(sub.slurm_job_id, {node: granted})
    result = sync(cluster, fake)
    job.refresh_from_db()
    assert result.started == [job.pk] and job.status == JobStatus.RUNNING
    now = sorted(Allocation.objects.filter(job=job, live=True).values_list("gpu_index", flat=True))
    assert now == granted
    assert job.predicted_comm_ms is not None
    fake.end(sub.slurm_job_id, "COMPLETED", 0)
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert not Allocation.objects.filter(job=job, live=True).exists()


@pytest.mark.parametrize(
    ("state", "code", "status", "text"),
    [
        ("FAILED", 3, JobStatus.FAILED, "exit code 3"),
        ("CANCELLED", None, JobStatus.CANCELLED, "cancelled in Slurm"),
        ("NODE_FAIL", None, JobStatus.FAILED, "node failure"),
        ("TIMEOUT", None, JobStatus.FAILED, "timeout"),
    ],
)
def test_end_states_come_back(cluster, fake, user, state, code, status, text):
    job = placed(cluster, user, 8)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    node = Allocation.objects.filter(job=job).first().node_name
    fake.run(sub.slurm_job_id, {node: list(range(8))})
    sync(cluster, fake)
    fake.end(sub.slurm_job_id, state, code)
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == status
    assert text in job.pending_reason


def test_node_failure_requeues_a_job_that_asks_for_it(cluster, fake, user):
    job = placed(cluster, user, 8, requeue=True)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    fake.run(sub.slurm_job_id, {Allocation.objects.filter(job=job).first().node_name: list(range(8))})
    sync(cluster, fake)
    fake.end(sub.slurm_job_id, "NODE_FAIL")
    result = sync(cluster, fake)
    assert job.pk in result.requeued
    job.refresh_from_db()
    # Re-placed and submitted again in the same sync.
    assert job.status == JobStatus.PLACING and job.pk in result.submitted
    assert "node failure" in job.requeue_reason


def test_a_requeue_by_slurm_is_never_shown_running(cluster, fake, user):
    job = placed(cluster, user, 8)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    fake.run(sub.slurm_job_id, {Allocation.objects.filter(job=job).first().node_name: list(range(8))})
    sync(cluster, fake)
    fake.end(sub.slurm_job_id, "PENDING")
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert sub.slurm_job_id in fake.cancelled


def running_pair(cluster, fake, user, **extra):
    """A 16-GPU job Slurm runs as two components, one per planned node."""
    job = placed(cluster, user, 16, **extra)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    nodes = list(
        dict.fromkeys(Allocation.objects.filter(job=job).order_by("rank").values_list("node_name", flat=True))
    )
    fake.run(sub.slurm_job_id, {n: list(range(8)) for n in nodes})
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    return job, sub


@pytest.mark.parametrize("requeue", [True, False])
def test_a_component_slurm_requeued_ends_the_whole_slurm_job(cluster, fake, user, requeue):
    job, sub = running_pair(cluster, fake, user, requeue=requeue)
    leader, other = fake.records[sub.slurm_job_id]
    # Slurm requeued the leader (restart count 1, pending again) and failed the other component.
    fake.records[sub.slurm_job_id] = [
        _with(leader, state="PENDING", reason="BeginTime", restarts=1),
        _with(other, state="NODE_FAIL"),
    ]
    result = sync(cluster, fake)
    assert fake.cancelled == [sub.slurm_job_id]
    job.refresh_from_db()
    if requeue:
        assert job.pk in result.requeued and job.pk in result.submitted
        assert "Slurm requeued it (101 pending)" in job.requeue_reason
    else:
        assert job.status == JobStatus.FAILED
        assert "node failure" in job.pending_reason and "Slurm requeued it" in job.pending_reason
    # Had the cancel missed a component, the next syncs' orphan pass would cancel it.
    fake.records[sub.slurm_job_id] = [
        _with(leader, state="PENDING", restarts=1),
        _with(other, state="NODE_FAIL"),
    ]
    result = sync(cluster, fake)
    assert result.orphans_cancelled == [sub.slurm_job_id]


def test_components_ending_apart_end_the_whole_slurm_job_with_the_exit_code(cluster, fake, user):
    job, sub = running_pair(cluster, fake, user)
    leader, other = fake.records[sub.slurm_job_id]
    fake.records[sub.slurm_job_id] = [leader, _with(other, state="FAILED", exit_code=3)]
    sync(cluster, fake)
    assert fake.cancelled == [sub.slurm_job_id]
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "exit code 3" in job.pending_reason
    assert "ended apart" in job.pending_reason


def test_a_closed_submission_whose_slurm_job_lives_on_is_an_orphan(cluster, fake, user):
    job, sub = running_pair(cluster, fake, user)
    # What bug 1 left: the job failed, its submission closed, Slurm kept the job.
    job_cancel(job=job)
    SlurmSubmission.objects.filter(pk=sub.pk).update(state="FAILED")
    (orphan,) = slurm_orphans(cluster.executor, fake)
    assert orphan["slurm_id"] == sub.slurm_job_id and orphan["action"] == "cancel"
    assert orphan["why"] == f"TopoWeb job {job.pk} is cancelled" and orphan["state"] == "RUNNING"
    assert fake.cancelled == []  # listing cancels nothing
    result = sync(cluster, fake)
    assert result.orphans_cancelled == [sub.slurm_job_id] and result.cancelled == [job.pk]
    assert slurm_orphans(cluster.executor, fake) == []


def test_a_slurm_job_topoweb_never_saved_is_recorded_not_submitted_again(cluster, fake, user):
    job = placed(cluster, user, 8)

    class Crash(Exception):
        pass

    real = fake.submit

    def crash(body, *, user=None):
        real(body, user=user)
        raise Crash

    fake.submit = crash
    with pytest.raises(Crash):
        sync(cluster, fake)
    fake.submit = real
    (sid,) = fake.records
    assert [o["action"] for o in slurm_orphans(cluster.executor, fake)] == ["record"]
    result = sync(cluster, fake)
    assert result.recorded == [sid] and result.submitted == [] and len(fake.submitted) == 1
    assert SlurmSubmission.objects.get(job=job).slurm_job_id == sid


def test_stop_job_cancels_now_and_never_raises(cluster, fake, user, monkeypatch):
    job, sub = running_pair(cluster, fake, user)
    monkeypatch.setattr("apps.executors.slurm.sync.client_for", lambda ex, timeout: fake)
    job_cancel(job=job)
    assert stop_job(job) == [sub.slurm_job_id] and fake.cancelled == [sub.slurm_job_id]

    def down(job_id, *, user=None):
        raise SlurmError("slurmrestd at unix:/x unreachable")

    fake.cancel = down
    assert stop_job(job) == []
    other = placed(cluster, user, 8)
    assert stop_job(other) == []  # nothing in Slurm yet


def test_cancel_in_topoweb_cancels_in_slurm(cluster, fake, user):
    job = placed(cluster, user, 8)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    job_cancel(job=job)
    result = sync(cluster, fake)
    assert sub.slurm_job_id in fake.cancelled and result.cancelled == [job.pk]


def test_foreign_job_on_planned_gpus_replans_in_the_same_sync(cluster, fake, user):
    job = placed(cluster, user, 8)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    node = Allocation.objects.filter(job=job).first().node_name
    fake.records[9] = [SlurmJob(9, 0, "x", "bob", "RUNNING", "None", None, None, (node,), {node: (2,)}, "")]
    result = sync(cluster, fake)
    assert sub.slurm_job_id in fake.cancelled
    assert job.pk in result.requeued and job.pk in result.submitted
    job.refresh_from_db()
    assert "slurm job 9 (bob)" in job.requeue_reason
    assert node not in set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True))


def test_refusals(cluster, fake, user):
    job = placed(cluster, user, 8)
    fake.refuse = "Requested node configuration is not available"
    result = sync(cluster, fake)
    # Released and re-placed; after three refusals the job fails with Slurm's words.
    assert job.pk in result.requeued
    for _ in range(3):
        schedule_cluster(cluster=cluster)
        sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "node configuration is not available" in job.pending_reason
    other = placed(cluster, user, 8)
    fake.refuse = "Invalid user id"
    sync(cluster, fake)
    other.refresh_from_db()
    assert other.status == JobStatus.FAILED and "Invalid user id" in other.pending_reason


def test_unreachable_slurm_is_recorded(cluster):
    result = slurm_sync(executor=cluster.executor)
    assert "unreachable" in result.error
    cluster.executor.refresh_from_db()
    assert "unreachable" in cluster.executor.last_error


def test_no_migration_proposals_on_a_slurm_cluster(cluster, fake, user):
    from apps.scheduling.proposals import migrations_propose

    job = placed(cluster, user, 4)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    fake.run(sub.slurm_job_id, {Allocation.objects.filter(job=job).first().node_name: [0, 1, 2, 3]})
    sync(cluster, fake)
    assert migrations_propose(cluster=cluster) == []


def test_jobs_are_submitted_as_their_owners_unix_account(cluster, fake, user, monkeypatch):
    from apps.scheduling.models import UnixAccount

    seen = []
    submit = fake.submit

    def as_user(body, *, user=None):
        seen.append(user)
        return submit(body, user=user)

    fake.submit = as_user
    cluster.executor.submit_as_owner = True
    cluster.executor.save()
    accounts_here(monkeypatch, alice_hpc=2001)
    UnixAccount.objects.create(user=user, name="alice_hpc")
    placed(cluster, user, 4)
    sync(cluster, fake)
    assert seen == ["alice_hpc"]
    assert SlurmSubmission.objects.get().slurm_user == "alice_hpc"


def test_admin_lists_executors_submissions_and_foreign_gpus(cluster, fake, user, client):
    admin = get_user_model().objects.create_superuser("root", password="x")
    fake.records[7] = [
        SlurmJob(7, 0, "other", "bob", "RUNNING", "None", None, None, ("n4",), {"n4": (1,)}, "")
    ]
    placed(cluster, user, 4)
    sync(cluster, fake)
    client.force_login(admin)
    page = client.get("/admin/executors/clusterexecutor/")
    assert page.status_code == 200 and b"unix:/nonexistent.sock" in page.content
    assert client.get("/admin/executors/slurmsubmission/").status_code == 200
    page = client.get("/admin/executors/foreignallocation/")
    assert page.status_code == 200 and b"bob" in page.content


def test_a_quiet_sync_costs_a_few_queries_whatever_the_cluster_size(cluster, fake):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    sync(cluster, fake)
    with CaptureQueriesContext(connection) as ctx:
        sync(cluster, fake)
    # Agents, nodes, GPUs, last_seen; our Slurm ids, node names, foreign rows (twice); open
    # submissions; jobs to submit; the executor: none per node (this cluster has 4).
    assert len(ctx.captured_queries) <= 11, "\n".join(q["sql"][:90] for q in ctx.captured_queries)
    assert NodeHealth.objects.filter(node__cluster=cluster, last_seen__isnull=True).count() == 0


def test_foreign_jobs_across_leaves_load_their_uplinks_at_the_assumed_rate(cluster, fake):
    from apps.scheduling.snapshot import cluster_snapshot

    # Job 7 spans leaf1 (n1) and leaf2 (n3); job 8 stays on leaf1.
    fake.records[7] = [
        SlurmJob(
            7, 0, "a", "bob", "RUNNING", "None", None, None, ("n1", "n3"), {"n1": (0, 1), "n3": (0,)}, ""
        )
    ]
    fake.records[8] = [
        SlurmJob(8, 0, "b", "bob", "RUNNING", "None", None, None, ("n2",), {"n2": (0, 1, 2)}, "")
    ]
    sync(cluster, fake)
    assert cluster_snapshot(cluster=cluster).link_load == {}
    cluster.executor.foreign_gbps_per_gpu = 10.0
    cluster.executor.save()
    assert cluster_snapshot(cluster=cluster).link_load == {"leaf1": 20.0, "leaf2": 10.0}


def test_overlapping_syncs_of_one_cluster_are_skipped(cluster, fake):
    from django.core.cache import cache

    from apps.executors.slurm.sync import locked_sync

    key = f"executors:slurm-sync:{cluster.pk}"
    cache.add(key, 1, timeout=60)
    try:
        assert locked_sync(executor=cluster.executor) is None
    finally:
        cache.delete(key)
    # Free again: this one runs (and reports the unreachable socket).
    assert "unreachable" in locked_sync(executor=cluster.executor).error


def accounts_here(monkeypatch, **uids):
    """The TopoWeb host's Unix accounts (name -> uid), as the owner check sees them."""
    from apps.executors.slurm import sync as sync_module

    monkeypatch.setattr(sync_module, "local_uid", uids.get)
    monkeypatch.setattr(sync_module, "uid_min", lambda: 1000)


def test_a_user_without_a_unix_account_is_refused_at_submit_on_a_cluster_run_as_owners(
    cluster, fake, user, monkeypatch
):
    from rest_framework.test import APIClient

    from apps.placement.topology import SpecError
    from apps.scheduling.models import Job, UnixAccount

    accounts_here(monkeypatch, alice=1500, svc=998)
    # Not run as owners: every job runs as TopoWeb's Slurm user, any TopoWeb user may submit.
    nobody_here = get_user_model().objects.create_user("carol", password="x")
    assert job_submit(user=nobody_here, spec=spec(1), cluster=cluster).status == JobStatus.QUEUED
    cluster.executor.submit_as_owner = True
    cluster.executor.save()
    assert job_submit(user=user, spec=spec(1), cluster=cluster).status == JobStatus.QUEUED
    with pytest.raises(SpecError) as refused:
        job_submit(user=nobody_here, spec=spec(1), cluster=cluster)
    assert refused.value.errors[0][0] == "owner"
    assert (
        "no Unix account 'carol'" in refused.value.errors[0][1] and "as nobody" in refused.value.errors[0][1]
    )
    for name, why in (("root", "root (uid 0)"), ("svc", "system account (uid 998")):
        UnixAccount.objects.update_or_create(user=nobody_here, defaults={"name": name})
        with pytest.raises(SpecError, match=re.escape(why)):
            job_submit(user=nobody_here, spec=spec(1), cluster=cluster)
    # Through the API: a 400 naming the field, nothing queued.
    UnixAccount.objects.filter(user=nobody_here).delete()
    before = Job.objects.count()
    api = APIClient()
    api.force_authenticate(nobody_here)
    response = api.post("/api/v1/jobs/", spec(1), format="json")
    assert response.status_code == 400, response.content
    assert "owner" in response.content.decode() and "no Unix account 'carol'" in response.content.decode()
    response = api.post("/api/v1/jobs/", [spec(1), spec(2)], format="json")
    assert response.status_code == 400 and "[0].owner" in response.content.decode()
    assert Job.objects.count() == before


def test_a_job_whose_owner_lost_the_account_is_failed_not_submitted(cluster, fake, user, monkeypatch):
    from apps.scheduling.models import UnixAccount

    accounts_here(monkeypatch, alice=1500)
    cluster.executor.submit_as_owner = True
    cluster.executor.save()
    job = placed(cluster, user, 4)
    UnixAccount.objects.create(user=user, name="gone")
    calls = []
    fake.submit = lambda body, *, user=None: calls.append(user)
    sync(cluster, fake)
    job.refresh_from_db()
    assert calls == [] and job.status == JobStatus.FAILED
    assert job.pending_reason.startswith("owner: no Unix account 'gone'")


def test_admin_never_shows_the_slurm_secrets_and_keeps_them_on_save(cluster, client):
    admin = get_user_model().objects.create_superuser("root", password="x")
    ex = cluster.executor
    ex.slurm_token = "tok-SECRET-123"
    ex.jwt_key = "a2V5LVNFQ1JFVC00NTY="
    ex.save()
    client.force_login(admin)
    url = f"/admin/executors/clusterexecutor/{ex.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    assert b"tok-SECRET-123" not in page.content and b"a2V5LVNFQ1JFVC00NTY=" not in page.content
    assert b"stored; empty keeps it" in page.content
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("slurm_token", "jwt_key")}
    data.update({"cluster": cluster.pk, "slurm_token": "", "jwt_key": "", "partition": "gpu"})
    response = client.post(url, data)
    assert response.status_code == 302, response.content[:2000]
    ex.refresh_from_db()
    assert (ex.partition, ex.slurm_token, ex.jwt_key) == ("gpu", "tok-SECRET-123", "a2V5LVNFQ1JFVC00NTY=")
    data["clear_secrets"] = "on"
    assert client.post(url, data).status_code == 302
    ex.refresh_from_db()
    assert (ex.slurm_token, ex.jwt_key) == ("", "")


def test_jobs_slurm_gave_each_others_gpus_are_recorded_not_stopped(cluster, fake, user):
    """Two jobs planned on one node, each granted the other's planned GPUs (as when Slurm starts
    them in the other order): both are recorded where they run, neither is cancelled, and each
    keeps the MASTER_PORT its ranks use."""
    a = placed(cluster, user, 4)
    b = placed(cluster, user, 4)
    rows = {j.pk: list(Allocation.objects.filter(job=j).order_by("rank")) for j in (a, b)}
    assert {r.node_name for r in rows[a.pk] + rows[b.pk]} == {rows[a.pk][0].node_name}
    node = rows[a.pk][0].node_name
    ports = {pk: r[0].master_port for pk, r in rows.items()}
    sync(cluster, fake)
    subs = {s.job_id: s.slurm_job_id for s in SlurmSubmission.objects.all()}
    plan = {pk: [r.gpu_index for r in rows[pk]] for pk in rows}
    fake.run(subs[a.pk], {node: plan[b.pk]})
    fake.run(subs[b.pk], {node: plan[a.pk]})
    result = sync(cluster, fake)
    assert sorted(result.started) == [a.pk, b.pk]
    assert fake.cancelled == [] and result.requeued == []
    for job, other in ((a, b), (b, a)):
        job.refresh_from_db()
        assert job.status == JobStatus.RUNNING
        now = list(Allocation.objects.filter(job=job, live=True).order_by("rank"))
        assert sorted(r.gpu_index for r in now) == sorted(plan[other.pk])
        assert now[0].master_port == ports[job.pk]


def test_a_job_not_started_on_granted_gpus_is_replaced_and_the_started_one_kept(cluster, fake, user):
    a = placed(cluster, user, 4)
    b = placed(cluster, user, 4)
    sync(cluster, fake)
    subs = {s.job_id: s.slurm_job_id for s in SlurmSubmission.objects.all()}
    node = Allocation.objects.filter(job=a).first().node_name
    b_plan = list(Allocation.objects.filter(job=b).order_by("rank").values_list("gpu_index", flat=True))
    fake.run(subs[a.pk], {node: b_plan})  # b's Slurm job still pends
    result = sync(cluster, fake)
    assert result.started == [a.pk] and subs[a.pk] not in fake.cancelled
    assert b.pk in result.requeued and subs[b.pk] in fake.cancelled
    assert sorted(Allocation.objects.filter(job=a, live=True).values_list("gpu_index", flat=True)) == sorted(
        b_plan
    )


def test_foreign_job_on_planned_gpus_of_a_pending_job_with_room_moves_it_on_its_node(cluster, fake, user):
    """Slurm's request names the node and a count: a foreign job taking some planned GPUs of a
    job Slurm holds pending moves its plan to free GPUs of the same node; nothing is cancelled."""
    job = placed(cluster, user, 4)
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    node = Allocation.objects.filter(job=job).first().node_name
    planned = sorted(Allocation.objects.filter(job=job).values_list("gpu_index", flat=True))
    fake.records[9] = [
        SlurmJob(9, 0, "x", "bob", "RUNNING", "None", None, None, (node,), {node: (planned[1],)}, "")
    ]
    result = sync(cluster, fake)
    assert fake.cancelled == [] and result.requeued == []
    now = dict(Allocation.objects.filter(job=job, live=True).values_list("rank", "gpu_index"))
    assert planned[1] not in now.values() and len(set(now.values())) == 4
    assert set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True)) == {node}
    assert SlurmSubmission.objects.get(job=job).slurm_job_id == sub.slurm_job_id


def test_time_limit_is_slurms_timelimit_and_a_timeout_reads_as_on_agents(cluster, fake, user):
    job = placed(cluster, user, 8, time_limit_min=7)
    plain = placed(cluster, user, 8)
    sync(cluster, fake)
    bodies = {int(b["job"]["comment"].split(":")[2]): b["job"] for b in fake.submitted}
    assert bodies[job.pk]["time_limit"] == 7
    assert "time_limit" not in bodies[plain.pk]  # none: the partition's own limit
    sub = SlurmSubmission.objects.get(job=job)
    fake.run(sub.slurm_job_id, {Allocation.objects.filter(job=job).first().node_name: list(range(8))})
    sync(cluster, fake)
    fake.end(sub.slurm_job_id, "TIMEOUT")
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.pending_reason == (
        f"time limit: stopped after its time_limit_min of 7 min (Slurm job {sub.slurm_job_id}: TIMEOUT)"
    )


def test_drain_on_slurm_is_refused_with_how_unless_scontrol_is_allowed(cluster, fake):
    from apps.scheduling.executor import Refused
    from apps.scheduling.nodes import node_drain, node_resume
    from apps.topology.models import Node

    node = Node.objects.get(cluster=cluster, name="n2")
    with pytest.raises(Refused, match=r"run `scontrol update nodename=n2 state=drain 'reason=bad fan'`"):
        node_drain(node=node, reason="bad fan")
    with pytest.raises(Refused, match="state=resume"):
        node_resume(node=node)
    assert not NodeHealth.objects.filter(
        node=node, state__in=(NodeState.DRAINED, NodeState.DRAINING)
    ).exists()


def test_an_outage_is_named_with_since_when(cluster, fake):
    from datetime import datetime

    from apps.executors.slurm.sync import outage

    ok = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    down = SlurmError("Unspecified error", [{"error": "Unspecified error", "error_code": 1}])
    assert outage(down, ok) == (
        "controller (slurmctld) unreachable since 2026-01-02T03:04:05+00:00: slurmrestd answered Unspecified error"
    )
    gone = SlurmError("slurmrestd at unix:/x unreachable: [Errno 111] Connection refused")
    assert outage(gone, ok).startswith(
        "slurmrestd unreachable since 2026-01-02T03:04:05+00:00: slurmrestd at"
    )
    sync(cluster, fake)
    cluster.executor.refresh_from_db()
    fake.nodes = lambda: (_ for _ in ()).throw(down)
    result = sync(cluster, fake)
    assert result.error.startswith("controller (slurmctld) unreachable since ")
    cluster.executor.refresh_from_db()
    assert cluster.executor.last_error == result.error


def test_each_ranks_output_is_stored_while_it_runs_and_to_the_end(cluster, fake, user, tmp_path):
    """The tasks' rank logs (here written by the test) become rank runs with their output, as an
    agent's shipped logs: what is there at each sync, the rest when Slurm says the job ended."""
    from apps.executors.slurm.script import rank_log_name
    from apps.scheduling.choices import RankState
    from apps.scheduling.models import RankRun
    from apps.scheduling.selectors import rank_log_page

    job = placed(cluster, user, 4, workdir=str(tmp_path))
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    rows = {a.rank: a for a in Allocation.objects.filter(job=job)}
    # MASTER_ADDR: rank 0's node's address as Slurm reports it, as every rank map shows it.
    master = NodeHealth.objects.get(node__cluster=cluster, node__name=rows[0].node_name).addr
    assert master.startswith("10.0.0.") and f"MASTER_ADDR={master}" in fake.submitted[-1]["script"]
    logs = {r: tmp_path / rank_log_name(job.pk, job.generation, r) for r in rows}
    for rank, path in logs.items():
        path.write_text(f"hello {rank}\n")
    # A rank log that is a symbolic link (to a file the job's user may not read) is never read.
    secret = tmp_path / "secret"
    secret.write_text("not yours\n")
    logs[3].unlink()
    logs[3].symlink_to(secret)
    sync(cluster, fake)
    assert not RankRun.objects.filter(job=job).exists()  # not running in Slurm yet
    fake.run(sub.slurm_job_id, {rows[0].node_name: sorted(a.gpu_index for a in rows.values())})
    sync(cluster, fake)
    runs = {r.rank: r for r in RankRun.objects.filter(job=job)}
    assert sorted(runs) == [0, 1, 2, 3] and {r.state for r in runs.values()} == {RankState.STARTED}
    assert all(runs[r].log_tail == f"hello {r}\n" for r in (0, 1, 2)) and runs[3].log_tail == ""
    assert rank_log_page(run=runs[2], offset=0, limit=1024)["text"] == "hello 2\n"
    logs[3].unlink()
    logs[3].write_text("hello 3\n")
    for rank, path in logs.items():
        with path.open("a") as fh:
            fh.write(f"bye {rank}\n")
    fake.end(sub.slurm_job_id, "COMPLETED", 0)
    sync(cluster, fake)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    for run in RankRun.objects.filter(job=job):
        assert (run.state, run.exit_code, run.exit_cause) == (RankState.EXITED, 0, "exited")
        assert rank_log_page(run=run, offset=0, limit=1024)["text"] == f"hello {run.rank}\nbye {run.rank}\n"
    assert not Allocation.objects.filter(job=job, live=True).exists()


def test_a_cancelled_jobs_gpus_stay_booked_until_slurm_has_stopped_it(cluster, fake, user, tmp_path):
    from apps.scheduling.choices import RankState
    from apps.scheduling.models import RankRun

    job = placed(cluster, user, 8, workdir=str(tmp_path))
    sync(cluster, fake)
    sub = SlurmSubmission.objects.get(job=job)
    fake.run(sub.slurm_job_id, {Allocation.objects.filter(job=job).first().node_name: list(range(8))})
    sync(cluster, fake)
    job_cancel(job=job)
    # Its ranks still run in Slurm: their GPUs are not handed to another job yet.
    assert Allocation.objects.filter(job=job, live=True).count() == 8
    fake.cancel(sub.slurm_job_id)
    sync(cluster, fake)
    assert not Allocation.objects.filter(job=job, live=True).exists()
    assert set(RankRun.objects.filter(job=job).values_list("state", "exit_cause")) == {
        (RankState.EXITED, "stopped")
    }
