"""The what-if table: every policy on the free GPUs plus the job's own, priced."""

import numpy as np
import pytest

from apps.dashboard.whatif import what_if
from apps.placement.solvers import POLICIES

BAD_CASE44 = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def test_every_policy_gets_a_row(case44, case44_job):
    rows = what_if(case44, case44_job, free=np.ones(16, dtype=bool))
    assert [r.policy for r in rows] == list(POLICIES)


def test_topo_finds_the_nvlink_placement_for_a_badly_placed_job(case44, case44_job):
    busy = np.zeros(16, dtype=bool)  # every GPU is the job's own
    rows = what_if(case44, case44_job, free=busy, own_gids=BAD_CASE44, current_step_ms=209.09)
    topo = next(r for r in rows if r.policy == "topo")
    assert topo.fits
    assert topo.comm_ms == pytest.approx(2.667, rel=1e-3)
    assert topo.levels == "dp: nvlink"  # only the kinds that communicate are priced
    assert topo.gain == pytest.approx((209.09 - topo.step_ms) / 209.09)
    assert topo.moved_ranks and topo.moved_ranks > 0


def test_a_policy_that_reproduces_the_current_mapping_is_marked_current(case44, case44_job):
    rows = what_if(case44, case44_job, free=np.zeros(16, dtype=bool), own_gids=list(range(16)))
    first_fit = next(r for r in rows if r.policy == "first_fit")
    assert first_fit.is_current and first_fit.moved_ranks == 0


def test_no_free_gpus_gives_the_reason_per_policy(case44, case44_job):
    rows = what_if(case44, case44_job, free=np.zeros(16, dtype=bool))
    assert all(not r.fits and r.reason for r in rows)


def test_own_flows_are_taken_out_of_the_link_load(leafspine):
    from apps.placement.jobs import load_job

    from .conftest import job_spec

    job = load_job(job_spec(32))
    free = np.zeros(32, dtype=bool)
    own = list(range(32))
    alone = what_if(leafspine, job, free=free, own_gids=own)
    loaded = what_if(leafspine, job, free=free, own_gids=own, link_load={"leaf-1": 4000.0, "leaf-2": 4000.0})
    minus_own = what_if(
        leafspine,
        job,
        free=free,
        own_gids=own,
        link_load={"leaf-1": 4000.0, "leaf-2": 4000.0},
        own_flows={"leaf-1": 4000.0, "leaf-2": 4000.0},
    )
    topo = [next(r for r in rows if r.policy == "topo") for rows in (alone, loaded, minus_own)]
    assert topo[1].step_ms > topo[0].step_ms
    assert topo[2].step_ms == pytest.approx(topo[0].step_ms)
