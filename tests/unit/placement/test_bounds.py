"""lower_bound(): the cheapest feasible joint assignment of group kinds to levels; nothing beats it."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.__main__ import main
from apps.placement.bounds import _capacity, _most_cells, gap, lower_bound, region_gpus, smallest_level
from apps.placement.costmodel import (
    NVLS_EFFICIENCY_HOPPER,
    alltoall_spanning_ms,
    domain_ms,
    evaluate,
    p2p_ms,
    spanning_ms,
)
from apps.placement.jobs import COLLECTIVES, GROUP_KINDS
from apps.placement.solvers import POLICIES, Placement, place
from apps.placement.topology import load_topology, load_topology_file, topology_to_spec
from tests.unit.placement.specs import generated, job

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
LLM_COMM = [("tp", "allreduce", 4.2e7, 160), ("pp", "p2p", 4.2e7, 16), ("dp", "allreduce", 8.1e8)]


def _levels(bound) -> dict[str, str]:
    return {g.group: g.level for g in bound.groups}


def _alone(topo, j) -> float:
    # Each comm entry bounded on its own (a job with that entry only): the per-kind "alone" bound.
    return sum(
        lower_bound(topo, job(j.gpus, tp=j.tp, pp=j.pp, dp=j.dp, ep=j.ep, comm=[c])).comm_ms
        for c in [(e.group, e.collective, e.bytes, e.count) for e in j.comm]
    )


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


def test_a_rail_optimized_unit_is_one_leaf_region(rail):
    # Each leaf serves one GPU per node, but the unit's 2 nodes x 4 GPUs all meet under its leaves.
    assert region_gpus(rail) == {"nvlink": 4, "leaf": 8, "spine": 16, "core": 16}
    b = lower_bound(rail, job(8, comm=[("dp", "allreduce", 1e9)]))
    assert _levels(b) == {"dp": "leaf"}
    # The unit's two nodes in rank order are rail-aligned: each rail's ring stays under one leaf.
    assert evaluate(rail, job(8, comm=[("dp", "allreduce", 1e9)]), list(range(8))).comm_ms == pytest.approx(
        b.comm_ms
    )


def test_a_pipeline_across_a_rail_unit_pays_no_uplink(rail):
    # 8 stages over the unit's two nodes, turning on rail 3: one NIC hop under one leaf, no spine.
    j = job(8, pp=8, comm=[("pp", "p2p", 1e6)])
    b = lower_bound(rail, j)
    assert b.comm_ms == pytest.approx(p2p_ms(1e6, 50, 2 * 1.5))
    assert evaluate(rail, j, [0, 1, 2, 3, 7, 6, 5, 4]).comm_ms == pytest.approx(b.comm_ms)


def test_leaf_regions_join_domains_that_share_a_leaf_and_pods_join_regions(hetero):
    # d1 (n1+n2, 8 GPUs) and n3 share leaf-2: 10 GPUs; leaf-3 and leaf-4 share spine-2: n4+n5 = 12.
    assert region_gpus(hetero) == {"nvlink": 8, "leaf": 10, "spine": 12, "core": 24}


def test_a_group_larger_than_a_domain_is_priced_at_the_best_split_over_nics(pod256):
    # 16 ranks, 8-GPU domains, 8 NICs of 50 GB/s each: 2 domains x 8 rails beats every other split.
    b = lower_bound(pod256, job(16, comm=[("dp", "allreduce", 1e9)]))
    assert b.groups[0].level == "leaf"
    # 2 domains of 8 over 8 rails: the faster of hierarchical and pipelined (min(450, 8 x 50) GB/s).
    expected = spanning_ms("allreduce", 16, 8, 2, 1e9, 450, 2.0, 50, 3.0, 8)
    assert b.comm_ms == pytest.approx(expected)
    # The contiguous placement achieves exactly that.
    assert evaluate(
        pod256, job(16, comm=[("dp", "allreduce", 1e9)]), list(range(16))
    ).comm_ms == pytest.approx(expected)


def test_a_pipeline_too_big_for_a_leaf_pays_one_uplink_hop(pods):
    b = lower_bound(pods, job(16, pp=16, comm=[("pp", "p2p", 1e8)]))
    assert b.groups[0].level == "spine"
    assert b.comm_ms == pytest.approx(p2p_ms(1e8, 50, 1.5 * 2 + 1.0 * 2))


def test_a_block_larger_than_a_pod_sends_a_kind_through_the_core(pods):
    # tp4 dp8 fills both 16-GPU pods: TP stays in the nodes, so DP groups must cross pods.
    j = job(32, tp=4, dp=8, comm=[("tp", "allreduce", 1e9, 8), ("dp", "allreduce", 1e8)])
    b = lower_bound(pods, j)
    assert _levels(b) == {"tp": "nvlink", "dp": "core"}
    assert evaluate(pods, j, list(range(32))).comm_ms >= b.comm_ms


def test_tp_pp_and_dp_cannot_all_stay_on_nvlink_when_their_block_exceeds_a_domain(pod256):
    # tp8 pp2 dp4: each group fits an 8-GPU node, but TP x PP (16) and TP x DP (32) do not.
    j = job(64, tp=8, pp=2, dp=4, comm=LLM_COMM)
    b = lower_bound(pod256, j)
    assert _levels(b) == {"tp": "nvlink", "pp": "leaf", "dp": "leaf"}
    # Each node holds one whole TP group, so a DP group has one member per node: 4 domains over
    # one rail and no NVLink stage; PP hops cross one NIC pair.
    expected = (
        160 * domain_ms("allreduce", 8, 4.2e7, 450, 2.0, NVLS_EFFICIENCY_HOPPER)
        + 16 * p2p_ms(4.2e7, 50, 3.0)
        + spanning_ms("allreduce", 4, 1, 4, 8.1e8, math.inf, 0.0, 50, 3.0, 1)
    )
    assert b.comm_ms == pytest.approx(expected)
    assert _alone(pod256, j) < b.comm_ms


def test_the_pod_llm_bound_is_met_by_spreading_pp_and_dp_blocks_over_four_leaves(pod256):
    # tp8 pp4 dp4 (128 GPUs): TP in the nodes; the 4 x 4 grid of (pp, dp) nodes in 2 x 2 squares,
    # one per leaf. Each leaf then carries 16 PP and 16 DP flows: 800 GB/s of uplinks / 16 = 50 GB/s,
    # no less than a NIC, so neither kind is slowed and the bound is reached.
    j = job(128, tp=8, pp=4, dp=4, comm=LLM_COMM)
    gids = []
    for rank in range(128):
        tp, dp, pp = rank % 8, rank // 8 % 4, rank // 32
        gids.append((pp // 2 * 2 + dp // 2) * 64 + (pp % 2 * 2 + dp % 2) * 8 + tp)
    assert evaluate(pod256, j, gids).comm_ms == pytest.approx(lower_bound(pod256, j).comm_ms)


def test_an_expert_block_on_nvlink_leaves_eight_dp_members_per_domain(pod256):
    # ep8 dp16: EP groups fill the nodes, so DP spans 2 domains with 8 members and 8 rails each.
    j = job(16, dp=16, ep=8, comm=[("ep", "alltoall", 6.4e7, 32), ("dp", "allreduce", 5e8)])
    b = lower_bound(pod256, j)
    assert _levels(b) == {"ep": "nvlink", "dp": "leaf"}
    dp_ms = spanning_ms("allreduce", 16, 8, 2, 5e8, 450, 2.0, 50, 3.0, 8)
    assert b.entry_ms[1] == pytest.approx(dp_ms)
    assert evaluate(pod256, j, list(range(16))).comm_ms == pytest.approx(b.comm_ms)


def test_a_kind_that_cannot_stay_under_one_leaf_shares_its_leaves_uplinks():
    # 2 leaves x 2 nodes x 4 GPUs, 2 x 10 GB/s uplinks per leaf. tp4 dp4 fills both leaves and TP
    # (heavy) stays in the nodes, so every DP group crosses; each node meets 4 of them, so 4 rings
    # share a leaf's 20 GB/s.
    topo = load_topology(generated(uplink_bw_GBps=10))
    j = job(16, tp=4, dp=4, comm=[("tp", "allreduce", 1e9, 8), ("dp", "allreduce", 1e8)])
    b = lower_bound(topo, j)
    assert _levels(b) == {"tp": "nvlink", "dp": "spine"}
    assert b.entry_ms[1] == pytest.approx(
        spanning_ms("allreduce", 4, 1, 4, 1e8, math.inf, 0.0, 20 / 4, 5.0, 1)
    )
    assert evaluate(topo, j, list(range(16))).comm_ms == pytest.approx(b.comm_ms)


def _rail_units():
    # Two rail-optimised units of 4 nodes x 8 GPUs (8 rails): 32 GPUs per unit, 64 in all.
    return load_topology(
        generated("rail-optimized", leaves=16, nodes_per_leaf=4, gpus_per_node=8, nics_per_node=8)
    )


def _nvl_racks():
    # Multi-node NVLink domains: 8 nodes x 4 GPUs per domain and per leaf, two racks.
    return load_topology(
        generated(
            nodes_per_leaf=8, gpus_per_node=4, nics_per_node=4, nvlink_domain_nodes=8, nvlink_bw_GBps=900
        )
    )


def _nvl72():
    # NVL72 racks: 18 nodes x 4 GPUs per NVLink domain, one leaf per rack, two racks.
    return load_topology(
        generated(
            nodes_per_leaf=18, gpus_per_node=4, nics_per_node=4, nvlink_domain_nodes=18, nvlink_bw_GBps=900
        )
    )


@pytest.mark.parametrize(
    ("cluster", "pp", "dp"),
    [("pod256", 2, 4), ("rail_units", 2, 4), ("nvl_racks", 2, 4), ("nvl72", 4, 4)],
)
def test_the_joint_bound_beats_the_alone_bound_and_topo_stays_above_it(request, cluster, pp, dp):
    builders = {"rail_units": _rail_units, "nvl_racks": _nvl_racks, "nvl72": _nvl72}
    topo = request.getfixturevalue("pod256") if cluster == "pod256" else builders[cluster]()
    j = job(8 * pp * dp, tp=8, pp=pp, dp=dp, comm=LLM_COMM)
    b = lower_bound(topo, j)
    ours = place(topo, topo.free_mask(), None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert _alone(topo, j) < b.comm_ms * (1 - 1e-6)
    assert b.comm_ms <= ours.prediction.comm_ms * (1 + 1e-9)
    assert _levels(b)["tp"] == "nvlink"


def test_bound_mfu_is_an_upper_bound(case44, case44_job):
    b = lower_bound(case44, case44_job)
    assert b.mfu >= evaluate(case44, case44_job, list(range(16))).mfu - 1e-12


def test_a_job_too_big_for_one_standalone_node_has_an_infinite_bound():
    topo = load_topology(
        {
            "version": 1,
            "name": "islands",
            "gpu_models": {"A": {"peak_tflops": 312}},
            "switches": [],
            "links": [],
            "nodes": [
                {
                    "name": f"n{i}",
                    "gpu_model": "A",
                    "gpus": 2,
                    "standalone": True,
                    "nvlink": {"domain": f"n{i}", "bw_GBps": 300, "latency_us": 2.0},
                }
                for i in range(2)
            ],
        }
    )
    assert lower_bound(topo, job(2, comm=[("dp", "allreduce", 1e6)])).comm_ms > 0
    assert math.isinf(lower_bound(topo, job(4, comm=[("dp", "allreduce", 1e6)])).comm_ms)


def test_gap_is_predicted_comm_over_bound_comm_and_one_when_both_are_zero():
    assert gap(3.0, 2.0) == pytest.approx(1.5)
    assert gap(0.0, 0.0) == 1.0
    assert math.isinf(gap(1.0, 0.0))


@pytest.fixture(scope="module")
def clusters(hetero, pods, rail, case44):
    shared_nic = load_topology(generated(nics_per_node=1, nvlink_domain_nodes=2, uplink_bw_GBps=20))
    nvl = load_topology(
        generated(nvlink_domain_nodes=2, nodes_per_leaf=4, nics_per_node=2, uplink_bw_GBps=30)
    )
    rail3 = load_topology(generated("rail-optimized", leaves=4, nodes_per_leaf=3, nics_per_node=2))
    # Racks of 8 H100s whose switches run NVLS (the default), and the same with NVLS off on half
    # of them: in-domain groups priced at the best of ring, tree and NVLS.
    nvls = load_topology(
        generated(nvlink_domain_nodes=2, nodes_per_leaf=4, nics_per_node=2, gpu_model="H100-SXM5-80GB")
    )
    half = topology_to_spec(nvls)
    for node in half["nodes"][: len(half["nodes"]) // 2]:
        node["nvlink"]["nvls"] = False
    return {
        "hetero": hetero,
        "pods": pods,
        "rail": rail,
        "case44": case44,
        "shared_nic": shared_nic,
        "nvl": nvl,
        "rail3": rail3,
        "nvls": nvls,
        "nvls_half": load_topology(half),
    }


def _structured(topo, j, data, free) -> np.ndarray:
    """Ranks laid on the free GPUs of whole nodes in a drawn node order, the rank grid's axes in a
    drawn order, then a few swaps: the kind of placement that keeps groups together and can come
    close to the bound."""
    nodes = data.draw(st.permutations(range(len(topo.nodes))))
    slots = np.concatenate(
        [np.arange(topo.node_first_gid[n], topo.node_first_gid[n] + topo.node_gpu_count[n]) for n in nodes]
    )
    slots = slots[free[slots]]
    start = data.draw(st.integers(0, slots.size - j.gpus))
    axes = data.draw(st.permutations(range(5)))
    grid = np.arange(j.gpus).reshape(j.pp, j.dp // j.ep, j.ep, j.cp, j.tp)
    gids = np.empty(j.gpus, dtype=np.int64)
    gids[grid.transpose(axes).ravel()] = slots[start : start + j.gpus]
    for a, b in data.draw(
        st.lists(st.tuples(st.integers(0, j.gpus - 1), st.integers(0, j.gpus - 1)), max_size=2)
    ):
        gids[[a, b]] = gids[[b, a]]
    return gids


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_no_placement_on_a_free_set_beats_its_free_bound(clusters, data):
    topo = clusters[data.draw(st.sampled_from(sorted(clusters)))]
    gpus = data.draw(st.sampled_from([n for n in (2, 4, 6, 8, 12, 16) if n <= topo.n_gpus]))
    tp = data.draw(st.sampled_from([d for d in (1, 2, 4) if gpus % d == 0]))
    pp = data.draw(st.sampled_from([d for d in (1, 2, 3) if (gpus // tp) % d == 0]))
    cp = data.draw(st.sampled_from([d for d in (1, 2, 3) if (gpus // (tp * pp)) % d == 0]))
    dp = gpus // (tp * pp * cp)
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
    order = data.draw(st.sampled_from(["tp-ep-dp-pp", "tp-pp-ep-dp", "ep-dp-tp-pp", "pp-tp-ep-dp"]))
    if cp > 1:
        order = data.draw(st.sampled_from([order, "tp-cp-ep-dp-pp", "cp-tp-pp-ep-dp"]))
    j = job(
        gpus,
        tp=tp,
        pp=pp,
        dp=dp,
        ep=ep,
        cp=cp,
        comm=entries,
        rank_order=order,
        model={"flops_per_step": 1e14},
        microbatches=data.draw(st.sampled_from([None, 1, 4])),
    )
    # A random free set (often the whole cluster); every candidate below uses free GPUs only.
    order_gids = np.asarray(data.draw(st.permutations(range(topo.n_gpus))))
    n_free = data.draw(st.one_of(st.just(topo.n_gpus), st.integers(gpus, topo.n_gpus)))
    free = np.zeros(topo.n_gpus, dtype=bool)
    free[order_gids[:n_free]] = True
    empty = lower_bound(topo, j)
    bound = lower_bound(topo, j, free=free)
    assert bound.comm_ms >= empty.comm_ms * (1 - 1e-9)
    load = {leaf: float(data.draw(st.integers(0, 8))) for leaf in topo.leaf_names}
    candidates = [
        evaluate(topo, j, order_gids[:gpus], load),
        evaluate(topo, j, _structured(topo, j, data, free)),
    ]
    congested = data.draw(st.booleans())
    result = place(topo, free, load if congested else None, j, policy=data.draw(st.sampled_from(POLICIES)))
    if isinstance(result, Placement):
        assert free[list(result.gids)].all()
        candidates.append(result.prediction)
    for got in candidates:
        assert got.comm_ms >= bound.comm_ms * (1 - 1e-9)
        assert got.step_ms >= bound.step_ms * (1 - 1e-9)


def _without_first_gpu_of_each_node(topo) -> np.ndarray:
    free = topo.free_mask()
    free[topo.node_first_gid] = False
    return free


def test_free_counts_replace_region_sizes(pods):
    # pods: 4-GPU domains, 8 GPUs per leaf, 16 per pod; one GPU per node taken leaves 3 of 4.
    free = _without_first_gpu_of_each_node(pods)
    assert region_gpus(pods, free=free) == {"nvlink": 3, "leaf": 6, "spine": 12, "core": 24}
    assert region_gpus(pods, free=pods.free_mask()) == region_gpus(pods)


def test_the_bound_on_an_all_free_mask_is_the_empty_cluster_bound(pod256):
    j = job(64, tp=8, pp=2, dp=4, comm=LLM_COMM)
    assert lower_bound(pod256, j, free=pod256.free_mask()) == lower_bound(pod256, j)


def test_an_expert_group_with_no_whole_free_node_is_priced_over_nics(pod256):
    # ep8 dp16 with GPU 0 of every node taken: no 8-GPU domain is free, so EP must leave NVLink.
    j = job(16, dp=16, ep=8, comm=[("ep", "alltoall", 6.4e7, 32), ("dp", "allreduce", 5e8)])
    free = _without_first_gpu_of_each_node(pod256)
    empty = lower_bound(pod256, j)
    bound = lower_bound(pod256, j, free=free)
    assert _levels(empty)["ep"] == "nvlink"
    assert _levels(bound)["ep"] == "leaf"
    assert bound.entry_ms[0] == pytest.approx(32 * alltoall_spanning_ms(8, 4, 6.4e7, 50, 3.0))
    assert bound.comm_ms > 3 * empty.comm_ms
    ours = place(pod256, free, None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert bound.comm_ms <= ours.prediction.comm_ms * (1 + 1e-9)
    # Against the free-set bound topo is close; against the empty cluster it looks 3x off.
    assert gap(ours.prediction.comm_ms, bound.comm_ms) < 1.05
    assert gap(ours.prediction.comm_ms, empty.comm_ms) > 3


def test_free_sets_with_the_same_counts_share_one_memo(pods):
    j = job(8, tp=2, dp=4, comm=[("tp", "allreduce", 1e8), ("dp", "allreduce", 1e9)])
    a = _without_first_gpu_of_each_node(pods)
    b = pods.free_mask()
    b[pods.node_first_gid + 3] = False
    assert not (a == b).all()
    assert lower_bound(pods, j, free=a) == lower_bound(pods, j, free=b)
    assert _capacity(pods, a) is _capacity(pods, b)


def test_a_job_larger_than_the_free_set_has_no_bound(pods):
    free = np.zeros(pods.n_gpus, dtype=bool)
    free[:8] = True
    with pytest.raises(ValueError, match="free: job .* needs 16 GPUs, 8 are free"):
        lower_bound(pods, job(16, comm=[("dp", "allreduce", 1e6)]), free=free)


@pytest.mark.parametrize("mask", [np.ones(31, dtype=bool), np.ones(32, dtype=np.int64)])
def test_a_free_mask_of_the_wrong_shape_or_dtype_is_rejected(pods, mask):
    with pytest.raises(ValueError, match="free: expected a bool array of 32 GPUs"):
        lower_bound(pods, job(4, comm=[("dp", "allreduce", 1e6)]), free=mask)


def test_the_bound_command_takes_busy_gpus(tmp_path, capsys):
    topology = str(EXAMPLES / "pod-256.yaml")
    spec = {
        "version": 1,
        "name": "moe",
        "gpus": 16,
        "parallelism": {"tp": 1, "pp": 1, "dp": 16, "ep": 8},
        "step": {"compute_ms": 100},
        "comm": [{"group": "ep", "collective": "alltoall", "bytes": 6.4e7, "count": 32}],
    }
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(spec))
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps([{"node": n.name, "gpu": 0} for n in load_topology_file(topology).nodes]))

    def bound(*extra: str) -> tuple[int, dict]:
        status = main(["bound", "--topology", topology, "--job", str(job_path), *extra])
        return status, json.loads(capsys.readouterr().out)

    status, empty = bound()
    status_busy, fragmented = bound("--busy", str(busy))
    assert (status, status_busy) == (0, 0)
    assert fragmented["lower_bound"]["comm_ms"] == pytest.approx(
        32 * alltoall_spanning_ms(8, 4, 6.4e7, 50, 3.0)
    )
    assert fragmented["lower_bound"]["comm_ms"] > empty["lower_bound"]["comm_ms"]
    # Every node but the first taken: 8 free GPUs for a 16-GPU job.
    nodes = load_topology_file(topology).nodes[1:]
    busy.write_text(json.dumps([{"node": n.name, "gpu": g} for n in nodes for g in range(n.gpus)]))
    status, out = bound("--busy", str(busy))
    assert status == 1
    assert "needs 16 GPUs, 8 are free" in out["no_fit"]


def test_expert_groups_leave_nvlink_when_too_few_domains_are_whole(pod256):
    # ep8 dp64 needs 8 whole free nodes; with only 4, some EP group must span domains, even though
    # the largest free domain still holds 8 GPUs.
    j = job(64, dp=64, ep=8, comm=[("ep", "alltoall", 6.4e7, 32), ("dp", "allreduce", 5e8)])
    free = pod256.free_mask()
    free[pod256.node_first_gid[4:]] = False
    assert region_gpus(pod256, free=free)["nvlink"] == 8
    bound = lower_bound(pod256, j, free=free)
    assert _levels(bound)["ep"] == "leaf"
    assert bound.entry_ms[0] == pytest.approx(32 * alltoall_spanning_ms(8, 4, 6.4e7, 50, 3.0))
    ours = place(pod256, free, None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert bound.comm_ms <= ours.prediction.comm_ms * (1 + 1e-9)


def _one_whole_node_and_half_nodes(topo) -> np.ndarray:
    # Node 0 wholly free; every other node has only its GPUs 0-3 (and their 4 NICs) free.
    free = topo.free_mask()
    for first in topo.node_first_gid[1:]:
        free[first + 4 : first + 8] = False
    return free


def test_a_dp_allreduce_over_partial_nodes_is_priced_at_their_free_rails(pod256):
    # dp16 with one whole free node: the best cover is 4 halves with 4 rails each (the pipelined
    # form at 4 x 50 GB/s, and a shallower NVLink stage than 8 + 4 + 4), not 2 whole nodes with 8
    # rails as on the empty cluster.
    j = job(16, comm=[("dp", "allreduce", 1e9)])
    free = _one_whole_node_and_half_nodes(pod256)
    bound = lower_bound(pod256, j, free=free)
    expected = spanning_ms("allreduce", 16, 4, 4, 1e9, 450, 2.0, 50, 3.0, 4)
    assert bound.comm_ms == pytest.approx(expected)
    assert bound.comm_ms > lower_bound(pod256, j).comm_ms * 1.2
    # That cover is a real placement, and it meets the bound.
    gids = [*range(8, 12), *range(16, 20), *range(24, 28), *range(32, 36)]
    assert evaluate(pod256, j, gids).comm_ms == pytest.approx(expected)
    ours = place(pod256, free, None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert gap(ours.prediction.comm_ms, bound.comm_ms) == pytest.approx(1.0)


def test_partial_nodes_that_hold_fewer_members_raise_the_fullest_domain_bound(pod256):
    # dp12 on 4-GPU halves only: 3 domains of 4 (k=4, 4 rails); no split may assume 8 in a domain.
    j = job(12, comm=[("dp", "allreduce", 1e9)])
    free = _one_whole_node_and_half_nodes(pod256)
    free[:8] = False
    bound = lower_bound(pod256, j, free=free)
    expected = min(
        spanning_ms("allreduce", 12, 4, 3, 1e9, 450, 2.0, 50, 3.0, 4),
        spanning_ms("allreduce", 12, 2, 6, 1e9, 450, 2.0, 50, 3.0, 2),
        spanning_ms("allreduce", 12, 3, 4, 1e9, 450, 2.0, 50, 3.0, 3),
    )
    assert bound.comm_ms == pytest.approx(expected)
    for gids in (
        [*range(8, 12), *range(16, 20), *range(24, 28)],
        [*range(8, 11), *range(16, 19), *range(24, 27), *range(32, 35)],
    ):
        assert evaluate(pod256, j, gids).comm_ms >= bound.comm_ms * (1 - 1e-9)


def test_topo_stops_at_the_free_set_bound_it_meets(pod256, monkeypatch):
    # On the half-node free set the first candidate meets the free-set bound (not the empty one),
    # so topo prices no baseline or spread layout.
    import apps.placement.solvers.topo as topo_solver

    j = job(16, comm=[("dp", "allreduce", 1e9)])
    free = _one_whole_node_and_half_nodes(pod256)
    wider = []
    real = topo_solver._wider_candidates
    monkeypatch.setattr(topo_solver, "_wider_candidates", lambda *a: wider.append(1) or real(*a))
    ours = place(pod256, free, None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert wider == []


def test_place_and_evaluate_gaps_are_against_the_free_set_bound_with_busy(tmp_path, capsys):
    topology = str(EXAMPLES / "pod-256.yaml")
    spec = {
        "version": 1,
        "name": "dp16",
        "gpus": 16,
        "parallelism": {"tp": 1, "pp": 1, "dp": 16},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e9}],
    }
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(spec))
    nodes = load_topology_file(topology).nodes
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps([{"node": n.name, "gpu": g} for n in nodes[1:] for g in range(4, 8)]))
    expected = spanning_ms("allreduce", 16, 4, 4, 1e9, 450, 2.0, 50, 3.0, 4)

    def run(*args: str) -> tuple[int, dict]:
        status = main([*args, "--topology", topology, "--job", str(job_path)])
        return status, json.loads(capsys.readouterr().out or "{}")

    status, placed = run("place", "--busy", str(busy))
    assert status == 0
    assert placed["lower_bound"]["comm_ms"] == pytest.approx(expected)
    assert placed["gap"] == pytest.approx(1.0)
    status, unfragmented = run("place")
    assert unfragmented["lower_bound"]["comm_ms"] < expected
    ranks = tmp_path / "ranks.json"
    ranks.write_text(json.dumps(placed))
    status, evaluated = run("evaluate", "--ranks", str(ranks), "--busy", str(busy))
    assert status == 0
    assert evaluated["gap"] == pytest.approx(1.0)
    status, against_empty = run("evaluate", "--ranks", str(ranks))
    assert against_empty["gap"] > 1.2
    # A rank on a GPU that --busy lists is bad input: the free-set bound does not cover it.
    taken = [
        {"rank": r, "node": nodes[1].name, "gpu": 4 + r} if r < 4 else entry
        for r, entry in enumerate(placed["ranks"])
    ]
    ranks.write_text(json.dumps(taken))
    status = main(
        [
            "evaluate",
            "--topology",
            topology,
            "--job",
            str(job_path),
            "--ranks",
            str(ranks),
            "--busy",
            str(busy),
        ]
    )
    assert status == 2
    assert "which --busy lists as taken" in capsys.readouterr().err


def _pod(uplink_bw_GBps: float):
    # pod-256's shape: 4 leaves x 8 nodes x 8 GPUs, 2 spines.
    return load_topology(
        generated(leaves=4, nodes_per_leaf=8, gpus_per_node=8, nics_per_node=8, uplink_bw_GBps=uplink_bw_GBps)
    )


@pytest.mark.parametrize(("n1", "n2", "room"), [(2, 3, 4), (3, 3, 4), (3, 4, 5), (2, 4, 3)])
def test_most_cells_is_never_below_any_region_part_of_the_grid(n1, n2, room):
    # Every set of at most `room` cells of the n1 x n2 grid: its crossing K1 lines (columns of n1)
    # and K2 lines (rows of n2) must admit at least its size.
    most = _most_cells(n1, n2, room)
    cells = [(i, j) for i in range(n1) for j in range(n2)]
    seen = 0
    for size in range(1, room + 1):
        for part in itertools.combinations(cells, size):
            cols = {j for _, j in part}
            rows = {i for i, _ in part}
            x1 = sum(1 for j in cols if sum(1 for _, c in part if c == j) < n1)
            x2 = sum(1 for i in rows if sum(1 for r, _ in part if r == i) < n2)
            assert most[x1, x2] >= size, (part, x1, x2)
            seen += 1
    assert seen > 0
    assert most.max() <= room


def test_pp_and_dp_crossing_leaves_only_together_still_share_the_uplinks():
    # tp8 pp4 dp8 fills the pod: 4 x 8 nodes of (pp, dp), 8 per leaf. However the grid is cut, some
    # leaf meets 3+ crossing PP chains and 3+ crossing DP rings, or 4+ of one (8 flows each), so
    # 800 GB/s of uplinks give under a NIC's 50 GB/s; with uplinks that never congest they do not.
    j = job(256, tp=8, pp=4, dp=8, comm=LLM_COMM)
    wide = lower_bound(_pod(1e6), j).comm_ms
    b = lower_bound(_pod(400), j)
    assert b.comm_ms > wide * 1.05
    ours = place(_pod(400), np.ones(256, dtype=bool), None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert b.comm_ms <= ours.prediction.comm_ms * (1 + 1e-9)


def test_a_leaf_region_holds_only_the_whole_free_nodes_its_domains_offer(pod256):
    # tp8 pp4 dp4 on 16 whole free nodes: 5, 5, 3 and 3 per leaf, plus 7-GPU nodes that no TP
    # block fits. Counting free GPUs alone (45+ per leaf) would allow four 2 x 2 squares, no leaf
    # congested; by whole nodes some leaf holds 5 grid cells, so PP or DP meets 24+ flows there.
    free = np.zeros(256, dtype=bool)
    for leaf, whole in enumerate((5, 5, 3, 3)):
        for node in range(8):
            gpus = 8 if node < whole else 7 if node < whole + 3 else 0
            free[(leaf * 8 + node) * 8 : (leaf * 8 + node) * 8 + gpus] = True
    j = job(128, tp=8, pp=4, dp=4, comm=LLM_COMM)
    b = lower_bound(pod256, j, free=free)
    assert _levels(b)["tp"] == "nvlink"
    assert min(g.bottleneck_GBps for g in b.groups if g.group in ("pp", "dp")) < 50
    assert b.comm_ms > lower_bound(pod256, j).comm_ms * 1.05
    ours = place(pod256, free, None, j, policy="topo")
    assert isinstance(ours, Placement)
    assert b.comm_ms <= ours.prediction.comm_ms * (1 + 1e-9)
