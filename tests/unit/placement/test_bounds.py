"""lower_bound(): each group alone in the smallest domain that holds it; no placement beats it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.bounds import lower_bound, smallest_level
from apps.placement.costmodel import allgather_ms, evaluate, p2p_ms, ring_allreduce_ms
from apps.placement.jobs import COLLECTIVES, GROUP_KINDS
from apps.placement.topology import load_topology
from tests.unit.placement.specs import generated, job


def test_case_4_4_bound_is_the_nvlink_time_and_the_good_mapping_meets_it(case44, case44_job):
    b = lower_bound(case44, case44_job)
    assert b.comm_ms == pytest.approx(2.6667, abs=1e-4)
    assert {(g.group, g.level, g.bottleneck_GBps) for g in b.groups} == {("dp", "nvlink", 450.0)}
    assert [g.ranks for g in b.groups] == [tuple(range(8)), tuple(range(8, 16))]
    assert evaluate(case44, case44_job, list(range(16))).step_ms == pytest.approx(b.step_ms)


def test_smallest_level_steps_up_from_domain_to_leaf_to_pod_to_core(pods):
    # pods: 4-GPU domains, 8 GPUs per leaf, 16 per pod, 32 in all.
    assert [smallest_level(pods, n) for n in (4, 5, 8, 9, 16, 17)] == [
        "nvlink",
        "leaf",
        "leaf",
        "spine",
        "spine",
        "core",
    ]


def test_a_group_larger_than_a_domain_is_priced_at_the_best_split_over_nics(pod256):
    # 16 ranks, 8-GPU domains, 8 NICs of 50 GB/s each: 2 domains x 8 rails beats every other split.
    b = lower_bound(pod256, job(16, comm=[("dp", "allreduce", 1e9)]))
    assert b.groups[0].level == "leaf"
    # Reduce-scatter + allgather inside 8 GPUs over NVLink, ring of 2 domains with 1e9/8 per rail.
    expected = 2 * allgather_ms(8, 1e9, 450, 2.0) + ring_allreduce_ms(2, 1e9 / 8, 50, 3.0)
    assert b.comm_ms == pytest.approx(expected)
    # The contiguous placement achieves exactly that.
    assert evaluate(
        pod256, job(16, comm=[("dp", "allreduce", 1e9)]), list(range(16))
    ).comm_ms == pytest.approx(expected)


def test_a_pipeline_too_big_for_a_leaf_pays_one_uplink_hop(pods):
    b = lower_bound(pods, job(16, pp=16, comm=[("pp", "p2p", 1e8)]))
    assert b.groups[0].level == "spine"
    assert b.comm_ms == pytest.approx(p2p_ms(1e8, 50, 1.5 * 2 + 1.0 * 2))


def test_bound_mfu_is_an_upper_bound(case44, case44_job):
    b = lower_bound(case44, case44_job)
    assert b.mfu >= evaluate(case44, case44_job, list(range(16))).mfu - 1e-12


@pytest.fixture(scope="module")
def clusters(hetero, pods, rail, case44):
    shared_nic = load_topology(generated(nics_per_node=1, nvlink_domain_nodes=2, uplink_bw_GBps=20))
    return {"hetero": hetero, "pods": pods, "rail": rail, "case44": case44, "shared_nic": shared_nic}


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_no_random_placement_beats_the_bound(clusters, data):
    topo = clusters[data.draw(st.sampled_from(sorted(clusters)))]
    gpus = data.draw(st.sampled_from([n for n in (2, 4, 6, 8, 12, 16) if n <= topo.n_gpus]))
    tp = data.draw(st.sampled_from([d for d in (1, 2, 4) if gpus % d == 0]))
    pp = data.draw(st.sampled_from([d for d in (1, 2, 3) if (gpus // tp) % d == 0]))
    dp = gpus // (tp * pp)
    ep = data.draw(st.sampled_from([d for d in (1, 2, 4) if dp % d == 0]))
    entries = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(GROUP_KINDS),
                st.sampled_from(COLLECTIVES),
                st.sampled_from([0, 1e3, 1e6, 1e8, 2e9]),
                st.integers(1, 3),
            ),
            min_size=1,
            max_size=4,
        )
    )
    j = job(gpus, tp=tp, pp=pp, dp=dp, ep=ep, comm=entries, model={"flops_per_step": 1e14})
    gids = np.asarray(data.draw(st.permutations(range(topo.n_gpus)))[:gpus])
    load = {leaf: float(data.draw(st.integers(0, 8))) for leaf in topo.leaf_names}
    got = evaluate(topo, j, gids, load)
    bound = lower_bound(topo, j)
    for have, floor in zip(got.entry_ms, bound.entry_ms, strict=True):
        assert have >= floor * (1 - 1e-9)
    assert got.step_ms >= bound.step_ms * (1 - 1e-9)
