"""What the dashboard shows about a placed job: groups, levels, bottlenecks, shares."""

import pytest

from apps.dashboard.jobview import crossed_links, group_views, job_view, predicted_shares
from apps.placement.costmodel import evaluate
from apps.placement.groups import rank_groups
from apps.placement.jobs import load_job
from apps.placement.solvers import prediction_output

from .conftest import job_spec

GOOD_CASE44 = list(range(16))
BAD_CASE44 = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def test_case44_bad_mapping_puts_both_dp_groups_on_the_11_GBps_nic(case44, case44_job):
    pred = prediction_output(evaluate(case44, case44_job, BAD_CASE44))
    view = job_view(case44, id=1, label="j", details=True, job=case44_job, gids=BAD_CASE44, predicted=pred)
    dp = view.groups["dp"]
    assert [g.level for g in dp] == ["leaf", "leaf"]
    assert [g.bottleneck_GBps for g in dp] == [11.0, 11.0]
    assert dp[0].time_ms == pytest.approx(1.2e9 / 11e9 * 1e3)


def test_case44_good_mapping_keeps_dp_on_nvlink(case44, case44_job):
    pred = prediction_output(evaluate(case44, case44_job, GOOD_CASE44))
    view = job_view(case44, id=1, label="j", details=True, job=case44_job, gids=GOOD_CASE44, predicted=pred)
    assert [g.level for g in view.groups["dp"]] == ["nvlink", "nvlink"]
    assert view.step_ms == pytest.approx(100 + 1.2e9 / 450e9 * 1e3)


def test_unpriced_groups_take_level_and_bottleneck_from_the_path_model(case44, case44_job):
    # The case-4.4 job prices only DP; its PP pairs (rank r, r+8) cross the NIC in the good mapping.
    views = group_views(case44, GOOD_CASE44, rank_groups(case44_job), priced=())
    pp = views["pp"]
    assert len(pp) == 8
    assert all(g.level == "leaf" and g.bottleneck_GBps == 11.0 and g.time_ms is None for g in pp)


def test_single_rank_groups_are_left_out(case44, case44_job):
    views = group_views(case44, GOOD_CASE44, rank_groups(case44_job))
    assert "tp" not in views and "ep" not in views


def test_rank_groups_finds_the_groups_of_one_rank(case44, case44_job):
    view = job_view(case44, id=1, label="j", details=True, job=case44_job, gids=GOOD_CASE44, predicted={})
    kinds = {g.kind: g.ranks for g in view.rank_groups(9)}
    assert kinds == {"pp": (1, 9), "dp": tuple(range(8, 16))}


def test_other_users_job_view_has_no_groups(case44, case44_job):
    view = job_view(case44, id=1, label="j", details=False, job=case44_job, gids=GOOD_CASE44, predicted={})
    assert view.groups == {}
    assert view.rank_groups(0) == []


def test_predicted_shares_split_compute_and_communication():
    util, comm = predicted_shares(100.0, 50.0, 150.0)
    assert util == pytest.approx(100 / 150)
    assert comm == pytest.approx(50 / 150)
    # Half of the communication hidden behind compute: the step is shorter, the comm share is not.
    util, comm = predicted_shares(100.0, 50.0, 125.0)
    assert util == pytest.approx(0.8)
    assert comm == pytest.approx(50 / 150)
    assert predicted_shares(100.0, None, None) == (None, None)


def test_crossed_links_name_leaves_only_for_groups_that_cross_the_spine(leafspine):
    job = load_job(job_spec(16))
    inside = group_views(leafspine, list(range(16)), rank_groups(job))
    across = group_views(leafspine, list(range(8)) + list(range(16, 24)), rank_groups(job))
    nic_gids, leaves, pods = crossed_links(leafspine, list(range(16)), inside)
    assert nic_gids == set(range(16)) and leaves == set() and pods == set()
    _, leaves, _ = crossed_links(leafspine, list(range(8)) + list(range(16, 24)), across)
    assert leaves == {0, 1}
