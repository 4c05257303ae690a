"""Rank groups: Megatron-Core semantics for every rank order."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.groups import group_arrays, rank_coordinates, rank_groups
from tests.unit.placement.specs import job


def test_case_4_4_dp_groups_are_ranks_0_7_and_8_15_and_pp_pairs_cross_them(case44_job):
    g = rank_groups(case44_job)
    assert g["dp"] == [tuple(range(8)), tuple(range(8, 16))]
    assert g["pp"] == [(r, r + 8) for r in range(8)]
    assert g["tp"] == [(r,) for r in range(16)]
    assert g["ep"] == [(r,) for r in range(16)]


def test_megatron_reference_layout_tp2_pp4_dp2():
    # The example in Megatron-Core's parallel_state docstring (16 GPUs, tp=2, pp=4).
    g = rank_groups(job(16, tp=2, pp=4))
    assert g["tp"] == [(2 * i, 2 * i + 1) for i in range(8)]
    assert g["dp"] == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert g["pp"] == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


def test_first_ep_group_is_ranks_0_to_7_with_tp1_ep8():
    g = rank_groups(job(16, ep=8))
    assert g["ep"] == [tuple(range(8)), tuple(range(8, 16))]
    assert g["dp"] == [tuple(range(16))]


def test_ep_splits_dp_with_the_expert_index_varying_faster():
    g = rank_groups(job(16, tp=2, dp=8, ep=2))
    assert g["ep"][:3] == [(0, 2), (1, 3), (4, 6)]
    assert g["dp"] == [tuple(range(0, 16, 2)), tuple(range(1, 16, 2))]


def test_rank_order_with_dp_before_ep_interleaves_expert_groups():
    base = job(8, dp=8, ep=2)
    g = rank_groups(dataclasses.replace(base, rank_order="tp-dp-ep-pp"))
    # dp_index (size 4) now varies fastest: an EP group holds ranks 4 apart.
    assert g["ep"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # Members are listed by DP coordinate ep_index + ep * dp_index.
    assert g["dp"] == [(0, 4, 1, 5, 2, 6, 3, 7)]


def test_pp_fastest_order_puts_stages_on_consecutive_ranks():
    g = rank_groups(dataclasses.replace(job(8, tp=2, pp=2), rank_order="pp-tp-ep-dp"))
    assert g["pp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert g["tp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]


def test_group_arrays_are_cached_and_read_only():
    j = job(64, tp=4, pp=2)
    a, b = group_arrays(j), group_arrays(dataclasses.replace(j, name="other"))
    assert a is b
    assert not a["dp"].flags.writeable


ORDERS = ["-".join(p) for p in itertools.permutations(("tp", "ep", "dp", "pp"))]


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 3]),
    st.sampled_from(ORDERS),
)
def test_groups_match_the_coordinates_for_every_rank_order(tp, pp, dp_index, ep, order):
    j = dataclasses.replace(
        job(tp * pp * dp_index * ep, tp=tp, pp=pp, dp=dp_index * ep, ep=ep), rank_order=order
    )
    groups = rank_groups(j)
    coords = [rank_coordinates(j, r) for r in range(j.gpus)]
    for kind, size in (("tp", tp), ("pp", pp), ("dp", dp_index * ep), ("ep", ep)):
        flat = sorted(r for g in groups[kind] for r in g)
        assert flat == list(range(j.gpus)), kind
        assert all(len(g) == size for g in groups[kind])
    for g in groups["tp"]:
        assert [coords[r]["tp"] for r in g] == list(range(tp))
        assert len({(coords[r]["pp"], coords[r]["dp"]) for r in g}) == 1
    for g in groups["pp"]:
        assert [coords[r]["pp"] for r in g] == list(range(pp))
    for g in groups["dp"]:
        assert [coords[r]["dp"] for r in g] == list(range(dp_index * ep))
        assert len({(coords[r]["tp"], coords[r]["pp"]) for r in g}) == 1
    for g in groups["ep"]:
        # An EP group is ep consecutive DP coordinates of one DP group.
        dps = [coords[r]["dp"] for r in g]
        assert dps == list(range(dps[0], dps[0] + ep)) and dps[0] % ep == 0
        assert len({(coords[r]["tp"], coords[r]["pp"]) for r in g}) == 1
