"""The occupancy a worker keeps between scheduling cycles (apps/scheduling/occupancy.py), on the
real Postgres with its change triggers: every kept snapshot must equal a whole read of the
database, whoever changed the running jobs and when, so a stale one can never double-book."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction

from apps.placement.topology import read_spec_file
from apps.scheduling import cycle, lifecycle, occupancy, services
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import JobStatus, NodeState, RankState
from apps.scheduling.models import Allocation, ClusterOccupancy, Job, NodeHealth, OccupancyChange, RankRun
from apps.topology import services as topology_services
from apps.topology.models import Cluster, Gpu
from tests.integration.test_scheduling_postgres import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]


def spec(name: str, gpus: int, **extra) -> dict:
    body = {
        "version": 1,
        "name": name,
        "cluster": "pod-256",
        "gpus": gpus,
        "parallelism": {"tp": min(gpus, 8), "pp": 1, "dp": max(gpus // 8, 1)},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}] if gpus > 1 else [],
        "estimated_runtime_s": 3600,
    }
    body.update(extra)
    return body


@pytest.fixture
def pod(transactional_db, monkeypatch):
    # Cycles run where a test says: a submission or a release queues none.
    monkeypatch.setattr(cycle, "request_cycle", lambda cluster_id, **kw: False)
    occupancy._KEPT.clear()
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))
    yield cluster
    occupancy._KEPT.clear()


@pytest.fixture
def user(transactional_db):
    return get_user_model().objects.create_user("occ")


def submit(user, cluster, name: str, gpus: int, **extra) -> Job:
    return services.job_submit(user=user, spec=spec(name, gpus, **extra), cluster=cluster)


def run_cycle(cluster: Cluster) -> cycle.CycleCost:
    cycle.schedule_cluster(cluster=cluster)
    return cycle.LAST_CYCLE[cluster.pk]


def assert_same(kept, whole) -> None:
    assert np.array_equal(kept.free, whole.free)
    assert np.array_equal(kept.stopping, whole.stopping)
    assert kept.link_load.keys() == whole.link_load.keys()
    for leaf, load in whole.link_load.items():
        assert kept.link_load[leaf] == pytest.approx(load)
    assert kept.active == whole.active


def index_of(occ, gpu_pk: int) -> int:
    return occ.snapshot.index.gid_of_pk[gpu_pk]


def kept_snapshot(cluster: Cluster):
    """What the next cycle would plan against, beside a whole read at the same moment; the kept
    occupancy is left as a cycle would leave it."""
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        occ = occupancy.CycleOccupancy(cluster=locked)
        whole = snap.cluster_snapshot(cluster=locked)
        occ.finish()
    return occ, whole


def test_the_triggers_record_an_active_job_s_changes_and_not_a_queued_one_s(pod, user):
    OccupancyChange.objects.all().delete()
    queued = submit(user, pod, "q", 8)
    assert not OccupancyChange.objects.exists()
    run_cycle(pod)
    # The cycle's own change rows are consumed by it.
    assert not OccupancyChange.objects.exists()
    queued.refresh_from_db()
    assert queued.status == JobStatus.PLACING
    services.job_start(job=queued)
    assert list(OccupancyChange.objects.values_list("cluster_id", "job_id")) == [(pod.pk, queued.pk)]


def test_a_second_cycle_reads_only_what_changed_and_sees_what_a_whole_read_sees(pod, user):
    for i in range(6):
        submit(user, pod, f"j{i}", 8)
    first = run_cycle(pod)
    assert first.read_whole
    assert Job.objects.filter(status=JobStatus.PLACING).count() == 6
    second = run_cycle(pod)
    assert not second.read_whole
    assert second.jobs_read == 0
    occ, whole = kept_snapshot(pod)
    assert not occ.read_whole
    assert len(occ.snapshot.active) == 6
    assert_same(occ.snapshot, whole)


def test_gpus_freed_outside_the_cycle_are_free_in_the_next_cycle(pod, user):
    jobs = [submit(user, pod, f"j{i}", 128) for i in range(2)]
    run_cycle(pod)
    assert Job.objects.filter(status=JobStatus.PLACING).count() == 2
    waiting = submit(user, pod, "waits", 128)
    cost = run_cycle(pod)
    assert not cost.read_whole
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.QUEUED
    services.job_complete(job=jobs[0])
    last = run_cycle(pod)
    assert not last.read_whole
    # The completed job, then (at the cycle's end) the job placed on its GPUs.
    assert last.jobs_read == 2
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.PLACING
    freed = set(Allocation.objects.filter(job=jobs[0]).values_list("gpu_id", flat=True))
    taken = set(Allocation.objects.filter(job=waiting, live=True).values_list("gpu_id", flat=True))
    assert taken == freed
    occ, whole = kept_snapshot(pod)
    assert_same(occ.snapshot, whole)
    assert not occ.snapshot.free.any()


def test_gpus_taken_outside_the_cycle_are_busy_in_the_next_cycle(pod, user):
    held = submit(user, pod, "held", 8)
    run_cycle(pod)
    run_cycle(pod)
    # Another writer books a GPU of its own for a running job (as an operator's migration does).
    held.refresh_from_db()
    index = snap.gpu_index(cluster=pod, topology=snap.cluster_topology(cluster=pod))
    occ, _ = kept_snapshot(pod)
    gid = int(np.flatnonzero(occ.snapshot.free)[0])
    Allocation.objects.create(
        job=held, rank=8, gpu_id=index.gpu_pk[gid], generation=held.generation, live=True
    )
    occ, whole = kept_snapshot(pod)
    assert not occ.read_whole
    assert not occ.snapshot.free[gid]
    assert_same(occ.snapshot, whole)


def test_rank_starts_node_states_and_the_job_s_own_fields_reach_the_kept_occupancy(pod, user):
    job = submit(user, pod, "j", 16)
    run_cycle(pod)
    run_cycle(pod)
    job.refresh_from_db()
    rows = list(Allocation.objects.filter(job=job, live=True).select_related("gpu"))
    RankRun.objects.create(
        job=job, generation=job.generation, rank=0, node_id=rows[0].gpu.node_id, state=RankState.STARTED
    )
    services.job_start(job=job)
    Job.objects.filter(pk=job.pk).update(priority=7, flows={"leaf-x": 3.5})
    NodeHealth.objects.create(node_id=rows[0].gpu.node_id, state=NodeState.DOWN)
    occ, whole = kept_snapshot(pod)
    assert not occ.read_whole
    assert_same(occ.snapshot, whole)
    (active,) = occ.snapshot.active
    assert active.launched and active.running and active.priority == 7
    assert occ.snapshot.link_load["leaf-x"] == pytest.approx(3.5)
    topo = occ.snapshot.topology
    down = np.flatnonzero(topo.gpu_node == topo.gpu_node[index_of(occ, rows[0].gpu_id)])
    assert len(down) == 8 and not occ.snapshot.free[down].any()


def test_two_workers_alternating_never_use_a_kept_occupancy_another_s_cycle_made_stale(pod, user):
    submit(user, pod, "a", 64)
    run_cycle(pod)
    worker_a = dict(occupancy._KEPT)
    # Worker B (another process: its own kept occupancies, none yet) places more.
    occupancy._KEPT.clear()
    submit(user, pod, "b", 64)
    b = run_cycle(pod)
    assert b.read_whole
    # Back to worker A, whose kept occupancy lacks B's job: its epoch is no longer the cluster's.
    occupancy._KEPT.clear()
    occupancy._KEPT.update(worker_a)
    submit(user, pod, "c", 128)
    a = run_cycle(pod)
    assert a.read_whole
    assert Job.objects.filter(status=JobStatus.PLACING).count() == 3
    gpus = list(Allocation.objects.filter(live=True).values_list("gpu_id", flat=True))
    assert len(gpus) == len(set(gpus)) == 256


def test_a_topology_edit_drops_the_kept_occupancy(pod, user):
    submit(user, pod, "a", 8)
    run_cycle(pod)
    assert not run_cycle(pod).read_whole
    topology_services.cluster_touch(cluster=pod)
    assert run_cycle(pod).read_whole
    assert not run_cycle(pod).read_whole


def test_a_failed_cycle_keeps_nothing_and_the_next_reads_whole(pod, user, monkeypatch):
    submit(user, pod, "a", 8)
    run_cycle(pod)

    def broken(*args, **kwargs):
        raise RuntimeError("planner broke")

    monkeypatch.setattr(cycle, "plan_cycle", broken)
    epoch = ClusterOccupancy.objects.get(cluster=pod).epoch
    with pytest.raises(RuntimeError):
        cycle.schedule_cluster(cluster=pod)
    assert ClusterOccupancy.objects.get(cluster=pod).epoch == epoch
    assert pod.pk not in occupancy._KEPT
    monkeypatch.undo()
    assert run_cycle(pod).read_whole


def test_a_change_committed_while_a_cycle_runs_is_seen_by_the_next_cycle(pod, user):
    jobs = [submit(user, pod, f"j{i}", 64) for i in range(2)]
    run_cycle(pod)
    run_cycle(pod)
    done = threading.Event()

    def complete_elsewhere() -> None:
        try:
            # Its own connection and transaction, committed while the cycle below is open.
            with transaction.atomic():
                job = Job.objects.select_for_update().get(pk=jobs[0].pk)
                lifecycle.finish(job=job, status=JobStatus.COMPLETED)
        finally:
            connections.close_all()
            done.set()

    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=pod.pk)
        occ = occupancy.CycleOccupancy(cluster=locked)
        assert len(occ.snapshot.active) == 2
        worker = threading.Thread(target=complete_elsewhere)
        worker.start()
        assert done.wait(30)
        worker.join()
        occ.finish()
    assert connection.in_atomic_block is False
    occ, whole = kept_snapshot(pod)
    assert not occ.read_whole
    assert [a.job_id for a in occ.snapshot.active] == [jobs[1].pk]
    assert_same(occ.snapshot, whole)


def test_gpu_index_of_a_kept_occupancy_matches_the_rows(pod, user):
    job = submit(user, pod, "a", 8)
    run_cycle(pod)
    occ, _ = kept_snapshot(pod)
    (active,) = occ.snapshot.active
    pks = {occ.snapshot.index.gpu_pk[g] for g in active.gids}
    assert pks == set(Allocation.objects.filter(job=job, live=True).values_list("gpu_id", flat=True))
    assert Gpu.objects.filter(pk__in=pks).count() == 8


def test_booked_allocation_rows_carry_the_gpu_s_place_and_rank_0_s_master_port(pod, user):
    job = submit(user, pod, "a", 8)
    run_cycle(pod)
    job.refresh_from_db()
    rows = list(Allocation.objects.filter(job=job).select_related("gpu__node", "gpu__nic").order_by("rank"))
    assert [r.rank for r in rows] == list(range(8))
    for r in rows:
        assert r.live and r.released_at is None and r.generation == job.generation
        assert (r.node_name, r.gpu_index) == (r.gpu.node.name, r.gpu.index)
        assert r.nic_name == (r.gpu.nic.name if r.gpu.nic else "")
        assert r.created_at == job.placed_at
    assert rows[0].master_port is not None
    assert all(r.master_port is None for r in rows[1:])
