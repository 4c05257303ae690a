"""The scenarios of bench/placement_adversarial.py where topo fell furthest behind a search over
`evaluate`, cut down to run in a unit test, and the search's independence from the clock."""

from __future__ import annotations

import time

import numpy as np
import pytest

from apps.placement.bounds import lower_bound
from apps.placement.costmodel import evaluate
from apps.placement.jobs import load_job
from apps.placement.solvers import Placement, place
from apps.placement.solvers.topo import search_evals
from apps.placement.topology import load_topology


def node(name: str, gpus: int, leaf: str, nics: int, domain: str | None = None) -> dict:
    per = gpus // nics
    return {
        "name": name,
        "gpu_model": "H100",
        "gpus": gpus,
        "nvlink": {"domain": domain or name, "bw_GBps": 900 if domain else 450, "latency_us": 2.0},
        "nics": [
            {
                "name": f"mlx5_{i}",
                "gpus": list(range(i * per, (i + 1) * per)),
                "leaf": leaf,
                "bw_GBps": 50,
                "latency_us": 1.5,
            }
            for i in range(nics)
        ],
    }


def cluster(leaves: int, uplink_bw: float, nodes: list[dict]):
    switches = [{"name": f"leaf-{i + 1}", "tier": "leaf"} for i in range(leaves)]
    switches += [{"name": f"spine-{i + 1}", "tier": "spine"} for i in range(2)]
    links = [
        {"a": f"leaf-{i + 1}", "b": f"spine-{j + 1}", "bw_GBps": uplink_bw, "latency_us": 1.0}
        for i in range(leaves)
        for j in range(2)
    ]
    return load_topology(
        {
            "version": 1,
            "name": "adversarial",
            "gpu_models": {"H100": {"peak_tflops": 989}},
            "switches": switches,
            "links": links,
            "nodes": nodes,
        }
    )


def job(tp: int, pp: int, dp: int, comm: list[dict]):
    return load_job(
        {
            "version": 1,
            "name": f"tp{tp}-pp{pp}-dp{dp}",
            "gpus": tp * pp * dp,
            "parallelism": {"tp": tp, "pp": pp, "dp": dp},
            "step": {"compute_ms": 500},
            "comm": comm,
        }
    )


TP_HEAVY = [
    {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 96},
    {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
    {"group": "dp", "collective": "allreduce", "bytes": 8e8},
]
LLM = [
    {"group": "tp", "collective": "allreduce", "bytes": 2e7, "count": 64},
    {"group": "pp", "collective": "p2p", "bytes": 6e7, "count": 32},
    {"group": "dp", "collective": "allgather", "bytes": 4e8},
    {"group": "dp", "collective": "reducescatter", "bytes": 4e8},
]


@pytest.fixture(scope="module")
def one_and_eight_nics():
    """Four 8-GPU nodes whose GPUs share one NIC and four with a NIC per GPU, under one leaf, busy
    as in the benchmark's scenario: free GPUs per node 6, 8, 2, 3 (1 NIC) and 8, 8, 8, 5 (8 NICs)."""
    names = [("one0", 1), ("one1", 1), ("eight2", 8), ("one2", 1), ("eight3", 8), ("eight0", 8)]
    names += [("eight1", 8), ("one3", 1)]
    topo = cluster(1, 400, [node(n, 8, "leaf-1", nics) for n, nics in names])
    busy = {"one0": (3, 6), "one2": (0, 1, 3, 5, 6, 7), "eight0": (0, 3, 6), "one3": (1, 2, 3, 5, 7)}
    free = np.ones(topo.n_gpus, dtype=bool)
    for name, gpus in busy.items():
        free[[topo.gid(name, g) for g in gpus]] = False
    return topo, free


def test_a_tp8_job_takes_8_nic_nodes_and_one_gpu_per_1_nic_node(one_and_eight_nics):
    topo, free = one_and_eight_nics
    j = job(8, 2, 2, TP_HEAVY)
    placed = place(topo, free, None, j)
    assert isinstance(placed, Placement)
    # The map a search over `evaluate` converges to: every free GPU of the 8-NIC nodes (29), the
    # three left one apiece on 1-NIC nodes, so no NIC carries more than one rank's traffic.
    eight = [g for g in np.flatnonzero(free) if topo.nodes[int(topo.gpu_node[g])].name.startswith("eight")]
    singles = [topo.gid(n, g) for n, g in (("one0", 0), ("one1", 0), ("one3", 0))]
    spread = evaluate(topo, j, np.array(eight + singles)).comm_ms
    # Best fit's choice: whole nodes, the fourth TP group on a node whose 8 GPUs share one NIC.
    whole = [
        g for n in ("eight1", "eight2", "eight3", "one1") for g in range(topo.gid(n, 0), topo.gid(n, 0) + 8)
    ]
    packed = evaluate(topo, j, np.array(whole)).comm_ms
    assert placed.prediction.comm_ms <= spread * (1 + 1e-9)
    assert placed.prediction.comm_ms < packed * 0.7
    on_one_nic = [g for g in placed.gids if len(topo.nodes[int(topo.gpu_node[g])].nics) == 1]
    assert len(on_one_nic) == 3


@pytest.fixture(scope="module")
def straddling():
    """Four NVLink domains of four 1-GPU nodes; domains 1-2 straddle leaves 1 and 2, domains 3-4
    leaves 3 and 4, alternating node by node; 2:1 uplinks."""
    nodes = []
    for d in range(4):
        for k in range(4):
            leaf = f"leaf-{2 * (d // 2) + 1 + (k + d) % 2}"
            nodes.append(node(f"n{d}{k}", 1, leaf, 1, domain=f"dom-{d}"))
    return cluster(4, 50, nodes)


def test_dp_across_leaf_straddling_domains_spans_the_fewest_leaves(straddling):
    # tp2-pp2 pipelines fill a domain each; DP crosses the four domains. Laid domain by domain in
    # node-id order, a DP group touches all four leaves; leaf by leaf inside each domain, two.
    j = job(2, 2, 4, LLM)
    free = np.ones(straddling.n_gpus, dtype=bool)
    placed = place(straddling, free, None, j)
    bound = lower_bound(straddling, j, free=free).comm_ms
    assert placed.prediction.comm_ms == pytest.approx(bound, rel=1e-9)
    in_id_order = evaluate(straddling, j, np.arange(16)).comm_ms
    assert in_id_order > 1.3 * bound


def test_topo_gives_the_same_map_whatever_the_clock_says(one_and_eight_nics, monkeypatch):
    topo, free = one_and_eight_nics
    j = job(8, 2, 2, TP_HEAVY)
    first = place(topo, free, None, j)
    # A clock that jumps an hour per reading would stop any time-budgeted stage at once.
    ticks = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
    again = place(topo, free, None, j)
    assert again.gids == first.gids
    assert again.prediction.comm_ms == first.prediction.comm_ms


def test_the_search_budget_shrinks_with_the_job():
    sizes = [8, 64, 65, 512, 4096, 16384]
    budgets = [search_evals(job(1, 1, n, [])) for n in sizes]
    assert budgets == sorted(budgets, reverse=True)
    assert budgets[0] > budgets[-1] > 0
