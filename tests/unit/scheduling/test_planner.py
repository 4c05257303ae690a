"""The cycle planner over plain data (no database): priority order, EASY backfill, preemption."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from apps.placement.jobs import load_job
from apps.placement.planner import overdue_flags, plan_cycle
from apps.placement.planning import ActiveJob, ClusterSnapshot, GpuIndex, QueuedJob
from apps.placement.solvers import Placement, place
from apps.placement.topology import load_topology, load_topology_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def topo():
    return load_topology_file(str(EXAMPLES / "case-4-4.yaml"))


def spec(name: str, gpus: int, *, runtime_s: float | None = 3600, priority: int = 0):
    data = {
        "version": 1,
        "name": name,
        "gpus": gpus,
        "priority": priority,
        "parallelism": {"tp": 1, "pp": 1, "dp": gpus},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
    }
    if runtime_s is not None:
        data["estimated_runtime_s"] = runtime_s
    return load_job(data)


def queued(job_id: int, gpus: int, *, priority: int = 0, runtime_s: float | None = 3600, age_s: float = 0):
    return QueuedJob(
        job_id=job_id,
        priority=priority,
        submitted_at=NOW - timedelta(seconds=age_s),
        spec=spec(f"job-{job_id}", gpus, runtime_s=runtime_s, priority=priority),
        policy=None,
        pending_reason="",
    )


def active(
    job_id: int, gids, *, priority: int = 0, ends_in_s: float | None = 3600, started_s_ago: float = 60
):
    start = NOW - timedelta(seconds=started_s_ago)
    runtime = None if ends_in_s is None else ends_in_s + started_s_ago
    return ActiveJob(
        job_id=job_id,
        priority=priority,
        gids=tuple(gids),
        flows={},
        begin=start,
        expected_end=None if runtime is None else start + timedelta(seconds=runtime),
        running=True,
        started_at=start,
        estimated_runtime_s=runtime,
    )


def snapshot(topo, actives) -> ClusterSnapshot:
    free = np.ones(topo.n_gpus, dtype=bool)
    for a in actives:
        free[list(a.gids)] = False
    n = topo.n_gpus
    index = GpuIndex(tuple(range(n)), {i: i for i in range(n)}, ("mlx5_0",) * n)
    return ClusterSnapshot(1, topo, index, free, {}, list(actives))


def plan(topo, actives, queue, *, backfill=True, preemption=False):
    return plan_cycle(
        snapshot(topo, actives),
        queue,
        cluster_policy="topo",
        backfill=backfill,
        preemption=preemption,
        now=NOW,
    )


def booked(p) -> list[int]:
    return [b.job.job_id for b in p.bookings]


NODE_A = range(0, 8)
NODE_B = range(8, 16)


def test_jobs_are_booked_in_queue_order_until_the_gpus_run_out(topo):
    p = plan(topo, [], [queued(1, 8, priority=5), queued(2, 8), queued(3, 8)])
    assert booked(p) == [1, 2]
    assert "needs 8 GPUs, 0 free" in p.waiting[3]


def test_bookings_never_share_a_gpu(topo):
    p = plan(topo, [], [queued(i, 4) for i in range(1, 5)])
    gids = [g for b in p.bookings for g in b.placement.gids]
    assert len(gids) == len(set(gids)) == 16


def test_head_job_reservation_names_the_time_and_the_job_it_waits_for(topo):
    p = plan(topo, [active(7, NODE_A, ends_in_s=3600)], [queued(1, 16)])
    end = NOW + timedelta(seconds=3600)
    assert booked(p) == []
    assert f"reserved to start at {end:%Y-%m-%dT%H:%M:%SZ} when job 7 is expected to end" in p.waiting[1]
    assert p.waiting[1].startswith("needs 16 GPUs, 8 free")


def test_short_job_backfills_ahead_of_the_reserved_head(topo):
    p = plan(
        topo, [active(7, NODE_A, ends_in_s=3600)], [queued(1, 16, priority=9), queued(2, 4, runtime_s=1800)]
    )
    assert booked(p) == [2]


def test_long_job_waits_behind_the_reservation_with_the_head_named(topo):
    p = plan(
        topo, [active(7, NODE_A, ends_in_s=3600)], [queued(1, 16, priority=9), queued(2, 4, runtime_s=7200)]
    )
    assert booked(p) == []
    end = NOW + timedelta(seconds=3600)
    assert p.waiting[2].startswith(
        f"waiting behind job 1 (priority 9) reserved to start at {end:%Y-%m-%dT%H:%M:%SZ}"
    )


def test_job_without_estimate_is_not_backfilled_past_a_reservation(topo):
    p = plan(topo, [active(7, NODE_A)], [queued(1, 16, priority=9), queued(2, 2, runtime_s=None)])
    assert booked(p) == []
    assert "without estimated_runtime_s it cannot be backfilled" in p.waiting[2]


def test_long_jobs_backfill_only_outside_the_gpus_reserved_for_the_head(topo):
    # At the reservation 16 GPUs are free and the head needs 12: the long jobs may take only the
    # free GPUs its placement then leaves out, and the head still fits when job 7 ends.
    queue = [queued(1, 12, priority=9), queued(2, 4, runtime_s=99999), queued(3, 2, runtime_s=99999)]
    actives = [active(7, NODE_A, ends_in_s=3600)]
    p = plan(topo, actives, queue)
    taken = [g for b in p.bookings for g in b.placement.gids]
    assert 0 < len(taken) <= 4
    for job_id in {2, 3} - set(booked(p)):
        assert "does not fit outside the 12 GPUs reserved for it" in p.waiting[job_id]
    later = snapshot(topo, [])
    later.free[taken] = False
    assert isinstance(place(topo, later.free, {}, queued(1, 12).spec), Placement)


def test_a_job_ending_before_the_reservation_may_use_the_reserved_gpus(topo):
    p = plan(
        topo, [active(7, NODE_A, ends_in_s=3600)], [queued(1, 16, priority=9), queued(2, 8, runtime_s=600)]
    )
    assert booked(p) == [2]


def lone_nodes(n: int = 2, gpus: int = 8):
    """Nodes without a network: a job spanning two of them cannot run, whatever the GPU count."""
    return load_topology(
        {
            "version": 1,
            "name": "lone",
            "gpu_models": {"A100": {"peak_tflops": 312}},
            "switches": [],
            "nodes": [
                {
                    "name": f"n{i}",
                    "gpu_model": "A100",
                    "gpus": gpus,
                    "standalone": True,
                    "nvlink": {"domain": f"n{i}", "bw_GBps": 300, "latency_us": 2},
                }
                for i in range(n)
            ],
        }
    )


def test_the_head_is_reserved_where_its_shape_fits_and_long_jobs_use_the_other_node():
    # 8 GPUs are free, 4 on each node, but the head needs one node's 8: it is reserved node 0,
    # freed first, so a long job may start on node 1's free GPUs. Counting GPUs saw 8 free for
    # 8 needed, reserved the next end with none spare, and let nothing start.
    lone = lone_nodes()
    actives = [active(7, range(0, 4), ends_in_s=3600), active(8, range(8, 12), ends_in_s=36000)]
    queue = [queued(1, 8, priority=9), queued(2, 2, runtime_s=99999)]
    p = plan(lone, actives, queue)
    assert booked(p) == [2]
    assert set(p.bookings[0].placement.gids) <= set(range(12, 16))
    end = NOW + timedelta(seconds=3600)
    assert f"reserved to start at {end:%Y-%m-%dT%H:%M:%SZ} when job 7 is expected to end" in p.waiting[1]


def test_backfill_never_takes_the_free_gpus_of_the_node_reserved_for_the_head():
    # Node 0 frees its 6 busy GPUs first: the head (8 GPUs, one node) is reserved all of node 0.
    # Counting GPUs, 4 free + 6 released left 2 spare, and the long 2-GPU job could take node 0's
    # free pair and push the head back to job 8's end; here it must use node 1's pair.
    lone = lone_nodes()
    actives = [active(7, range(0, 6), ends_in_s=3600), active(8, range(8, 14), ends_in_s=36000)]
    queue = [queued(1, 8, priority=9), queued(2, 2, runtime_s=99999), queued(3, 2, runtime_s=99999)]
    p = plan(lone, actives, queue)
    assert booked(p) == [2]
    assert set(p.bookings[0].placement.gids) == {14, 15}
    assert "does not fit outside the 8 GPUs reserved for it" in p.waiting[3]


def test_a_head_that_fits_nowhere_until_an_unestimated_job_ends_has_no_start():
    lone = lone_nodes()
    actives = [active(7, range(0, 4), ends_in_s=None), active(8, range(8, 12), ends_in_s=None)]
    p = plan(lone, actives, [queued(1, 8, priority=9), queued(2, 2, runtime_s=60)])
    assert "start time unknown: it needs GPUs of jobs without estimated_runtime_s (7, 8)" in p.waiting[1]
    assert booked(p) == []


def test_backfill_off_keeps_every_later_job_waiting(topo):
    queue = [queued(1, 16, priority=9), queued(2, 1, runtime_s=60)]
    p = plan(topo, [active(7, NODE_A, ends_in_s=3600)], queue, backfill=False)
    assert booked(p) == []
    assert p.waiting[2].endswith("backfill is off on this cluster")


def test_unknown_end_of_running_job_makes_the_reservation_time_unknown(topo):
    p = plan(
        topo, [active(7, NODE_A, ends_in_s=None)], [queued(1, 16, priority=9), queued(2, 1, runtime_s=60)]
    )
    assert "start time unknown" in p.waiting[1]
    assert "nothing can be backfilled past it" in p.waiting[2]


def test_preemption_evicts_the_lowest_priority_job_for_a_higher_one(topo):
    actives = [active(7, NODE_A, priority=0), active(8, range(8, 12), priority=1)]
    p = plan(topo, actives, [queued(1, 8, priority=5)], preemption=True)
    assert [e.victim.job_id for e in p.evictions] == [7]
    assert booked(p) == [1]
    assert set(p.bookings[0].placement.gids) <= set(NODE_A) | set(range(12, 16))


def test_preemption_off_leaves_running_jobs_alone(topo):
    p = plan(topo, [active(7, NODE_A, priority=0)], [queued(1, 16, priority=5)], preemption=False)
    assert p.evictions == [] and booked(p) == []


def test_preemption_never_evicts_equal_priority(topo):
    p = plan(topo, [active(7, NODE_A, priority=5)], [queued(1, 16, priority=5)], preemption=True)
    assert p.evictions == []
    assert "reserved to start at" in p.waiting[1]


def launched(job: ActiveJob) -> ActiveJob:
    return dataclasses.replace(job, launched=True)


def test_a_launched_victim_is_stopped_not_released(topo):
    p = plan(topo, [launched(active(7, range(16), priority=0))], [queued(1, 8, priority=5)], preemption=True)
    (ev,) = p.evictions
    assert ev.victim.job_id == 7 and ev.stopping
    assert booked(p) == []
    assert p.waiting[1].startswith("preempting job 7: waiting for its ranks to exit")


def test_gpus_held_for_a_waiting_preemptor_go_to_no_job_behind_it(topo):
    # Job 7 holds node A and runs under agents; node B has 4 free GPUs.
    actives = [launched(active(7, NODE_A, priority=0)), active(9, range(8, 12), priority=9)]
    queue = [queued(1, 8, priority=5), queued(2, 4, priority=0, runtime_s=60)]
    p = plan(topo, actives, queue, preemption=True)
    assert [e.victim.job_id for e in p.evictions] == [7] and p.evictions[0].stopping
    # The preemptor's 8 GPUs are node A's; the 4 free ones on node B go to job 2.
    assert booked(p) == [2]
    assert set(p.bookings[0].placement.gids) == set(range(12, 16))


def test_a_preemptor_waits_for_stopping_gpus_without_a_second_victim(topo):
    # Next cycle: job 7 is preempted and its ranks still exit on node A (stopping GPUs);
    # job 8, lower priority, runs on node B and must not be preempted too.
    snap = snapshot(topo, [active(8, NODE_B, priority=0)])
    snap.free[list(NODE_A)] = False
    snap.stopping = np.zeros(topo.n_gpus, dtype=bool)
    snap.stopping[list(NODE_A)] = True
    p = plan_cycle(
        snap, [queued(1, 8, priority=5)], cluster_policy="topo", backfill=True, preemption=True, now=NOW
    )
    assert p.evictions == [] and booked(p) == []
    assert "waiting for the ranks of stopped jobs to exit" in p.waiting[1]
    # Once they exited the GPUs are free and the preemptor is booked there.
    snap.stopping[:] = False
    snap.free[list(NODE_A)] = True
    p = plan_cycle(
        snap, [queued(1, 8, priority=5)], cluster_policy="topo", backfill=True, preemption=True, now=NOW
    )
    assert booked(p) == [1] and set(p.bookings[0].placement.gids) == set(NODE_A)


def test_a_migrating_job_is_never_a_victim(topo):
    moving = dataclasses.replace(active(7, range(16), priority=0), launched=True, migrating=True)
    p = plan(topo, [moving], [queued(1, 8, priority=5)], preemption=True)
    assert p.evictions == [] and booked(p) == []


def test_overdue_means_running_past_twice_the_estimate():
    late = active(1, [0], ends_in_s=-4000, started_s_ago=8000)  # estimate 4000 s, ran 8000 s
    on_time = active(2, [1], ends_in_s=10, started_s_ago=100)
    assert overdue_flags([late, on_time], NOW + timedelta(seconds=1)) == {1: True, 2: False}
