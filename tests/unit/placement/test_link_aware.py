"""Shared NICs in the cost model, and topo's traffic-aware nesting, link-aware sets and search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.bounds import lower_bound
from apps.placement.costmodel import evaluate, load_array, ring_allreduce_ms
from apps.placement.costmodel.prediction import spine_pods
from apps.placement.groups import group_arrays
from apps.placement.jobs import job_to_spec, load_job
from apps.placement.solvers import Placement, place
from apps.placement.solvers.mapping import traffic_nesting
from apps.placement.solvers.search import search
from apps.placement.topology import SpecError, load_topology, topology_to_spec
from tests.unit.placement.specs import generated


def node(name: str, nics: int, leaf: str = "leaf-1", gpus: int = 8, nic_bw: float = 50.0) -> dict:
    per = gpus // nics
    return {
        "name": name,
        "gpu_model": "H100",
        "gpus": gpus,
        "nvlink": {"domain": name, "bw_GBps": 450, "latency_us": 2.0},
        "nics": [
            {
                "name": f"mlx5_{i}",
                "gpus": list(range(i * per, (i + 1) * per)),
                "leaf": leaf,
                "bw_GBps": nic_bw,
            }
            | {"latency_us": 1.5}
            for i in range(nics)
        ],
    }


def cluster(nodes: list[dict]):
    return load_topology(
        {
            "version": 1,
            "name": "links",
            "gpu_models": {"H100": {"peak_tflops": 989}},
            "switches": [{"name": "leaf-1", "tier": "leaf"}],
            "links": [],
            "nodes": nodes,
        }
    )


def job(tp=1, pp=1, dp=1, ep=1, comm=(), name="j"):
    return load_job(
        {
            "version": 1,
            "name": name,
            "gpus": tp * pp * dp,
            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "ep": ep},
            "step": {"compute_ms": 100},
            "comm": list(comm),
        }
    )


def test_groups_crossing_one_shared_nic_share_its_rate():
    # tp8 x dp2 over two nodes: eight DP pairs cross between the nodes at once.
    j = job(tp=8, dp=2, comm=[{"group": "dp", "collective": "allreduce", "bytes": 1e9}])
    gids = np.arange(16)
    one = evaluate(cluster([node("a", 1), node("b", 1)]), j, gids).comm_ms
    eight = evaluate(cluster([node("a", 8), node("b", 8)]), j, gids).comm_ms
    latency_ms = 2 * 3.0 / 1e3
    assert eight == pytest.approx(ring_allreduce_ms(2, 1e9, 50, 3.0))
    assert one - latency_ms == pytest.approx(8 * (eight - latency_ms))


def test_pipelines_through_one_shared_nic_share_its_rate():
    # tp8 x pp2: the eight stage-0 -> stage-1 hops all leave through node a's NIC(s).
    j = job(tp=8, pp=2, comm=[{"group": "pp", "collective": "p2p", "bytes": 1e9}])
    gids = np.arange(16)
    one = evaluate(cluster([node("a", 1), node("b", 1)]), j, gids).comm_ms
    eight = evaluate(cluster([node("a", 8), node("b", 8)]), j, gids).comm_ms
    assert one == pytest.approx(3.0 / 1e3 + 8 * 1e9 / 50e6)
    assert eight == pytest.approx(3.0 / 1e3 + 1e9 / 50e6)


def test_volume_entries_keep_the_seeds_per_rank_accounting():
    j = job(tp=8, dp=2, comm=[{"group": "dp", "collective": "volume", "bytes": 1.2e9}])
    got = evaluate(cluster([node("a", 1, nic_bw=11), node("b", 1, nic_bw=11)]), j, np.arange(16)).comm_ms
    assert got == pytest.approx(1.2e9 / 11e6)


# --------------------------------------------------------------------------- nesting by traffic

SHAPES = [(2, 8, 1), (2, 8, 2), (4, 4, 1), (4, 4, 2), (8, 2, 2)]


def _tp_pp_job(tp, pp, dp, tp_bytes, pp_bytes):
    return job(
        tp=tp,
        pp=pp,
        dp=dp,
        comm=[
            {"group": "tp", "collective": "allreduce", "bytes": tp_bytes, "count": 16},
            {"group": "pp", "collective": "p2p", "bytes": pp_bytes, "count": 16},
        ],
    )


def _inside_nodes(topo, gids, groups) -> bool:
    return bool((topo.gpu_node[gids[groups]] == topo.gpu_node[gids[groups[:, :1]]]).all())


@pytest.fixture(scope="module")
def eight_nics():
    return cluster([node(f"n{i}", 8) for i in range(4)])


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(SHAPES), st.sampled_from([1e6, 4e6]), st.sampled_from([2e8, 4e8]))
def test_nesting_follows_declared_traffic(eight_nics, shape, light, heavy):
    tp, pp, dp = shape
    free = np.ones(eight_nics.n_gpus, dtype=bool)
    for tp_bytes, pp_bytes, inner in ((heavy, light, "tp"), (light, heavy, "pp")):
        j = _tp_pp_job(tp, pp, dp, tp_bytes, pp_bytes)
        assert traffic_nesting(j)[0] == inner
        placed = place(eight_nics, free, None, j)
        assert isinstance(placed, Placement)
        # The heavier kind's groups ride NVLink inside a node; swapping the volumes flips it.
        assert _inside_nodes(eight_nics, np.asarray(placed.gids), group_arrays(j)[inner])


def test_a_long_pipeline_with_small_tp_keeps_its_stages_in_a_node(eight_nics):
    j = _tp_pp_job(2, 8, 1, 1e6, 4e8)
    placed = place(eight_nics, np.ones(eight_nics.n_gpus, dtype=bool), None, j)
    tp_first = evaluate(eight_nics, j, np.arange(16)).comm_ms
    assert placed.prediction.comm_ms < tp_first / 5


# --------------------------------------------------------------------------- link-aware sets


@settings(max_examples=15, deadline=None)
@given(st.integers(4, 7), st.sampled_from([1e8, 1e9]), st.sampled_from([2, 4]))
def test_a_faster_disjoint_free_set_is_preferred_to_a_tighter_slow_one(free_per_fast_node, nbytes, slow):
    # `slow` nodes whose GPUs share one NIC, wholly free (a tight fit), and four 8-NIC nodes with
    # only some GPUs free each: a DP job of 16 is faster on the latter.
    nodes = [node(f"slow{i}", 1) for i in range(slow)] + [node(f"fast{i}", 8) for i in range(4)]
    topo = cluster(nodes)
    free = np.zeros(topo.n_gpus, dtype=bool)
    free[: slow * 8] = True
    for i in range(4):
        first = (slow + i) * 8
        free[first : first + free_per_fast_node] = True
    j = job(dp=16, comm=[{"group": "dp", "collective": "allreduce", "bytes": nbytes}])
    placed = place(topo, free, None, j)
    assert isinstance(placed, Placement)
    used = {topo.nodes[int(topo.gpu_node[g])].name for g in placed.gids}
    assert all(name.startswith("fast") for name in used)
    slow_set = evaluate(topo, j, np.arange(16)).comm_ms
    assert placed.prediction.comm_ms < slow_set / 2


# --------------------------------------------------------------------------- search


def test_search_improves_a_poor_map_and_never_raises_the_cost(eight_nics):
    j = _tp_pp_job(2, 8, 2, 1e6, 4e8)
    free = np.ones(eight_nics.n_gpus, dtype=bool)
    start = np.random.default_rng(3).permutation(eight_nics.n_gpus)[: j.gpus]
    bound = lower_bound(eight_nics, j, free=free).comm_ms
    before = evaluate(eight_nics, j, start).comm_ms
    gids, cost = search(eight_nics, j, start, free, np.zeros(1), bound, max_evals=3000, stall_evals=3000)
    assert cost == pytest.approx(evaluate(eight_nics, j, gids).comm_ms)
    assert bound <= cost < before / 2
    assert free[gids].all() and np.unique(gids).size == j.gpus


def test_search_stops_at_once_when_the_start_meets_the_bound(eight_nics):
    j = _tp_pp_job(2, 8, 2, 1e6, 4e8)
    free = np.ones(eight_nics.n_gpus, dtype=bool)
    start = np.random.default_rng(3).permutation(eight_nics.n_gpus)[: j.gpus]
    gids, cost = search(eight_nics, j, start, free, np.zeros(1), 1e9, max_evals=3000)
    assert (gids == start).all()
    assert cost == pytest.approx(evaluate(eight_nics, j, start).comm_ms)


def test_search_uses_only_free_gpus():
    topo = cluster([node(f"n{i}", 1 + 7 * (i % 2)) for i in range(4)])
    free = np.ones(topo.n_gpus, dtype=bool)
    free[8:12] = False
    j = job(dp=16, comm=[{"group": "dp", "collective": "allreduce", "bytes": 1e9}])
    start = np.flatnonzero(free)[:16]
    gids, _ = search(topo, j, start, free, np.zeros(1), 0.0, max_evals=300)
    assert free[gids].all() and np.unique(gids).size == 16


# --------------------------------------------------------------------------- core links


def _two_pods_through_thin_cores():
    # 2 pods x 2 leaves x 2 nodes x 4 GPUs; each pod's 2 spines reach 1 core at 25 GB/s each (50 in
    # all), where a leaf has 800 GB/s of uplinks: crossing pods is the narrow way, as it is.
    return load_topology(
        {
            "version": 1,
            "name": "cores",
            "generate": {
                "shape": "leaf-spine",
                "spines": 2,
                "leaves": 2,
                "nodes_per_leaf": 2,
                "gpus_per_node": 4,
                "gpu_model": "H100",
                "peak_tflops": 989,
                "nvlink_bw_GBps": 450,
                "nic_bw_GBps": 50,
                "nics_per_node": 4,
                "uplink_bw_GBps": 400,
                "pods": 2,
                "cores": 1,
                "core_uplink_bw_GBps": 25,
            },
        }
    )


def test_groups_crossing_pods_share_the_pods_core_links():
    topo = _two_pods_through_thin_cores()
    j = job(tp=4, dp=2, comm=[{"group": "dp", "collective": "allreduce", "bytes": 1e9}])

    def on(a: str, b: str) -> float:
        return evaluate(
            topo, j, [topo.gid(a, i) for i in range(4)] + [topo.gid(b, i) for i in range(4)]
        ).comm_ms

    in_pod = on("node-001", "node-003")  # leaf-1 to leaf-2 through a spine
    across = on("node-001", "node-005")  # pod 1 to pod 2 through the core
    # Four DP pairs cross at once: 4 flows on each pod's 50 GB/s of core links, 12.5 GB/s each
    # (a 2-member allreduce moves S once; its microseconds of latency are below the tolerance).
    assert across == pytest.approx(1e9 / 12.5e6, rel=1e-3)
    assert across > 3 * in_pod


# --------------------------------------------------------------------------- overlap per entry


def _hidden_dp_job(dp_overlap):
    return job(
        tp=2,
        dp=8,
        comm=[
            {"group": "tp", "collective": "allreduce", "bytes": 1e7, "count": 20},
            {"group": "dp", "collective": "allreduce", "bytes": 4e9, "overlap": dp_overlap},
        ],
    )


def test_step_time_counts_each_entry_minus_its_own_overlap():
    j = _hidden_dp_job(0.75)
    p = evaluate(cluster([node("a", 8), node("b", 8)]), j, np.arange(16))
    tp_ms, dp_ms = p.entry_ms
    assert p.step_ms == pytest.approx(100 + tp_ms + 0.25 * dp_ms)


def test_a_hidden_dp_allreduce_no_longer_pushes_tp_off_nvlink(eight_nics):
    free = np.ones(eight_nics.n_gpus, dtype=bool)
    tp, dp = group_arrays(_hidden_dp_job(0.0))["tp"], group_arrays(_hidden_dp_job(0.0))["dp"]
    exposed = place(eight_nics, free, None, _hidden_dp_job(0.0))
    hidden = place(eight_nics, free, None, _hidden_dp_job(1.0))
    # Exposed, the 4 GB DP allreduce dominates and keeps its 8 ranks on one node's NVLink; once
    # backward hides it, the per-layer TP allreduces decide and stay inside the nodes instead.
    assert _inside_nodes(eight_nics, np.asarray(exposed.gids), dp)
    assert _inside_nodes(eight_nics, np.asarray(hidden.gids), tp)
    assert hidden.prediction.step_ms < evaluate(eight_nics, _hidden_dp_job(1.0), exposed.gids).step_ms


def test_the_bound_step_stays_below_every_placement_with_per_entry_overlap(eight_nics):
    j = _hidden_dp_job(0.9)
    bound = lower_bound(eight_nics, j)
    for seed in range(5):
        gids = np.random.default_rng(seed).permutation(eight_nics.n_gpus)[:16]
        assert evaluate(eight_nics, j, gids).step_ms >= bound.step_ms * (1 - 1e-9)


def test_an_entry_overlap_outside_zero_to_one_is_rejected_by_field():
    spec = {
        "version": 1,
        "name": "j",
        "gpus": 2,
        "parallelism": {"tp": 1, "pp": 1, "dp": 2},
        "step": {"compute_ms": 1},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e6, "overlap": 1.5}],
    }
    with pytest.raises(SpecError) as err:
        load_job(spec)
    assert "comm[0].overlap" in err.value.as_dict()
    spec["comm"][0]["overlap"] = 0.5
    assert load_job(job_to_spec(load_job(spec))).comm[0].overlap == 0.5


def test_other_jobs_core_flows_share_the_pods_core_links_like_uplinks():
    topo = _two_pods_through_thin_cores()
    j = job(tp=4, dp=2, comm=[{"group": "dp", "collective": "allreduce", "bytes": 1e9}])
    gids = [topo.gid("node-001", i) for i in range(4)] + [topo.gid("node-005", i) for i in range(4)]
    alone = evaluate(topo, j, gids)
    # The job's four DP pairs offer 4 x 25 GB/s (one core link's rate, their path's bottleneck)
    # to each pod's 50 GB/s of core links: 12.5 each,
    # the core links full while the allreduce runs; reported on the pods' spines.
    t = alone.comm_ms
    assert t == pytest.approx(1e9 / 12.5e6, rel=1e-3)
    pods = spine_pods(topo)
    assert sum(alone.flows[s] for s in pods if pods[s] == 0) == pytest.approx(50 * t / (100 + t))
    assert sum(alone.flows[s] for s in pods if pods[s] == 1) == pytest.approx(50 * t / (100 + t))
    # A second such job's rates, added to link_load as a scheduler does, shrink each flow's share
    # in proportion: 25 x 50 / (other + 100).
    beside = evaluate(topo, j, gids, alone.flows)
    other = 50 * t / (100 + t)
    assert beside.comm_ms == pytest.approx(1e9 / (1250 / (other + 100) * 1e6), rel=1e-3)


def test_link_load_names_any_switch_link_and_refuses_other_keys():
    topo = _two_pods_through_thin_cores()
    # Leaves 800 GB/s of uplinks (2 x 400), pods 50 GB/s of core links (2 spines x 25).
    assert load_array(topo, {"leaf-1": 10}).tolist() == [10, 0, 0, 0, 0, 0]
    # One uplink named: priced as if the leaf's whole uplinks were that hot (x C / c).
    assert load_array(topo, {"leaf-1/spine-1": 10}).tolist() == [20, 0, 0, 0, 0, 0]
    assert load_array(topo, {"spine-1/leaf-1": 10}).tolist() == [20, 0, 0, 0, 0, 0]
    # A core-linked spine names its core links; a core spreads over its four spine links.
    assert load_array(topo, {"spine-1": 5}).tolist() == [0, 0, 0, 0, 10, 0]
    assert load_array(topo, {"core-1": 10}).tolist() == [0, 0, 0, 0, 5, 5]
    assert load_array(topo, {"spine-3/core-1": 5}).tolist() == [0, 0, 0, 0, 0, 10]
    # Spread over every link in proportion to their rates, it prices as the pooled load.
    even = {f"leaf-{i}/spine-{s}": 5.0 for i, s in ((1, 1), (1, 2), (2, 1), (2, 2))}
    assert load_array(topo, even).tolist() == [10, 10, 0, 0, 0, 0]
    j = job(tp=4, dp=2, comm=[{"group": "dp", "collective": "allreduce", "bytes": 1e9}])
    for bad, message in (
        ({"leaf-9": 1.0}, "link_load: unknown switch 'leaf-9'"),
        ({"leaf-1/leaf-2": 1.0}, "link_load: no link joins switches 'leaf-1' and 'leaf-2'"),
        ({"leaf-1/spine-3": 1.0}, "link_load: no link joins switches 'leaf-1' and 'spine-3'"),
        ({"a/b/c": 1.0}, "link_load: unknown switch 'a/b/c'"),
        ({"spine-1": -1.0}, r"link_load\['spine-1'\]: rates \(GB/s\) must be non-negative"),
    ):
        with pytest.raises(ValueError, match=message):
            evaluate(topo, j, list(range(8)), bad)


def _two_spine_groups(**gen):
    # 4 leaves of one 8-GPU node (8 NICs of 50 GB/s), 3 spines, 100 GB/s a link: leaves 1-2 reach
    # spines 1 and 2, leaves 3-4 spines 2 and 3 (one pod through spine 2).
    spec = topology_to_spec(
        load_topology(
            generated(
                spines=3,
                leaves=4,
                nodes_per_leaf=1,
                gpus_per_node=8,
                nics_per_node=8,
                uplink_bw_GBps=100,
                gpu_model="H100-SXM5-80GB",
                **gen,
            )
        )
    )
    far = {("leaf-1", "spine-3"), ("leaf-2", "spine-3"), ("leaf-3", "spine-1"), ("leaf-4", "spine-1")}
    spec["links"] = [lk for lk in spec["links"] if (lk["a"], lk["b"]) not in far]
    return load_topology(spec)


def test_a_hot_spine_slows_the_leaves_it_serves_and_placement_avoids_it():
    topo = _two_spine_groups()
    # On two tiers a spine key names its links to leaves (it was refused as an unknown leaf).
    hot = {"spine-1": 90.0}
    assert load_array(topo, hot).tolist() == [90, 90, 0, 0, 0]  # then one pod's core links
    j = job(dp=16, comm=[{"group": "dp", "collective": "allreduce", "bytes": 1e9}])
    cold = place(topo, np.ones(topo.n_gpus, dtype=bool), None, j)
    placed = place(topo, np.ones(topo.n_gpus, dtype=bool), hot, j)
    leaves = sorted({topo.leaf_names[int(topo.gpu_leaf[g])] for g in placed.gids})
    assert leaves == ["leaf-3", "leaf-4"]
    # The flows through spine 1 run slower on leaves 1-2 (ECMP may hash any flow onto it).
    on_12 = evaluate(topo, j, np.arange(16), hot).comm_ms
    assert on_12 > placed.prediction.comm_ms == pytest.approx(cold.prediction.comm_ms)
    # A spine's load spread over its links in proportion to their rates; the same load spread
    # over all three spines slows each leaf a third as much.
    spread = {f"spine-{s}": 30.0 for s in (1, 2, 3)}
    assert load_array(topo, spread).tolist() == pytest.approx([30, 30, 30, 30, 0])
