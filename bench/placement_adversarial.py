"""Adversarial placement quality: topo against an independent search oracle, on scenarios built to
break it, and topo's speed on large clusters, in one run.

Scenario classes (each a seeded generator of a cluster, a free set, other jobs' link load and a
job): leaf-spine at 4:1 and 8:1 oversubscription, rail-optimized scalable units, a 3-tier cluster
whose core is 4:1 oversubscribed, NVL72 racks, NVLink domains that straddle two leaves, mixed 4-
and 8-GPU nodes, 1-NIC nodes next to 8-NIC nodes, slow and fast NICs side by side, busy
(fragmented) free sets, and other jobs' flows on the uplinks; and mixed fleets: PCIe nodes or
DGX-1 cube-mesh nodes (`intra` links) beside NVLink nodes, 24-GPU NVLink domains straddling leaves
with DP-only jobs of 16-48 ranks, every node with 3, 5, 6, 7 or 8 GPUs free (half the jobs TP6),
and per-node NIC speeds (8 x 100, 8 x 25 or 4 x 50 GB/s) under one leaf; and mixed GPU
generations (A100 and H100 nodes), where the oracle and the ratios use step time, not comm; GB200
NVL72 racks with 4 NICs a tray (NVLS switches, half the jobs small frequent DP allreduces of 16-64
ranks); a hot spine (other jobs' rates on one spine or on single leaf-spine links, spread as
ECMP does); and classes nobody tuned for: failed NICs (a neighbour NIC serving two GPUs) and
slower NICs, 8:1 oversubscribed cores on 3 tiers, 2,048-rank jobs on 8,192 GPUs (the oracle
limited to CLASS_EVALS there), context parallelism with expert parallelism, and 90%-busy
clusters in odd patterns (one rail free per node, two GPUs on every other node, a few whole
nodes, scattered). Jobs are otherwise drawn
per scenario from pipeline-heavy, TP-heavy, DP-heavy, MoE and mixed LLM shapes of 8 to 64 GPUs.

The oracle knows nothing of topo: it is simulated annealing over rank -> GPU maps that calls
`costmodel.evaluate` as a black box (moves: swap two ranks, move a rank to an unused free GPU,
exchange the ranks of two nodes), started from random maps, random whole nodes in rank order,
the baselines' placements (first_fit, naive, tree_best_fit) and topo's own answer taken as one
more map (so topo / oracle >= 1: how much a search could still improve topo). Both are priced by
the same model with the same link load. With `--against REF` each scenario is also placed by REF's
topo (`placement_ref.py`: a release named in CHANGELOG.md, or a commit), priced by today's model;
the run exits 1 where today's topo is more than 0.5% worse.

Printed per class: scenarios, geomean and max of topo / oracle, how many the oracle beat by more
than 2% and by more than 20%, topo's gap to the free-set lower bound (p50, p90), geomean and max
of topo's step time over that of the oracle's map and over the best baseline's; overall the targets (geomean topo/oracle <=
1.02, none worse than 1.10, worst step ratio <= 1.02, gap p50 <= 1.05); then topo's latency
for a 1,024-GPU job on 16,384 GPUs (p99 < 1 s) and a 16,384-GPU job on 131,072 GPUs (< 2 s),
each cluster warmed by one small placement first (its per-topology index, as the scheduler has).

    .venv/bin/python bench/placement_adversarial.py [--quick] [--seed N] [--per-class K] [--evals E]
        [--classes a,b] [--table] [--no-speed] [--against REF]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.bounds import gap as bound_gap  # noqa: E402
from apps.placement.bounds import lower_bound  # noqa: E402
from apps.placement.costmodel import evaluate  # noqa: E402
from apps.placement.costmodel.speed import allowed  # noqa: E402
from apps.placement.jobs import JobSpec, job_to_spec, load_job  # noqa: E402
from apps.placement.solvers import NoFit, place  # noqa: E402
from apps.placement.topology import Topology, generate_spec, load_topology, topology_to_spec  # noqa: E402
from apps.placement.topology.examples import DGX1_CUBE_MESH, PCIE_TWO_SOCKETS, intra_spec  # noqa: E402
from bench.placement_quality import job_spec  # noqa: E402
from bench.placement_ref import RefPlacer  # noqa: E402

ORACLE_TARGET_GEOMEAN, ORACLE_TARGET_MAX, GAP_P50_TARGET, STEP_TARGET_MAX = 1.02, 1.10, 1.05, 1.01
# --against REF: a scenario where topo prices more than this much above REF's placement fails.
AGAINST_TOLERANCE = 0.005
SPEED_TARGET_1K_P99_MS, SPEED_TARGET_16K_MS = 1000.0, 2000.0
BASELINE_STARTS = ("first_fit", "naive", "tree_best_fit")


# --- clusters -----------------------------------------------------------------------------------


GEN_BASE = {
    "gpu_model": "H100",
    "peak_tflops": 989,
    "nvlink_bw_GBps": 450,
    "nic_bw_GBps": 50,
    "gpus_per_node": 8,
    "nics_per_node": 8,
}


def _generated(name: str, **gen) -> Topology:
    return load_topology({"version": 1, "name": name, "generate": {**GEN_BASE, **gen}})


def _node(
    name: str, gpus: int, leaves: list[str], nics: int, nic_bw: float, domain: str | None = None, nvlink=450
):
    """A full-form node: `nics` NICs of `nic_bw` GB/s sharing its GPUs evenly, NIC i under
    leaves[i % len(leaves)]."""
    per = gpus // nics
    return {
        "name": name,
        "gpu_model": "H100",
        "gpus": gpus,
        "nvlink": {"domain": domain or name, "bw_GBps": nvlink, "latency_us": 2.0},
        "nics": [
            {
                "name": f"mlx5_{i}",
                "gpus": list(range(i * per, (i + 1) * per)),
                "leaf": leaves[i % len(leaves)],
                "bw_GBps": nic_bw,
                "latency_us": 1.5,
            }
            for i in range(nics)
        ],
    }


def _full(
    name: str, leaves: int, spines: int, uplink_bw: float, nodes: list[dict], models: dict | None = None
) -> Topology:
    switches = [{"name": f"leaf-{i + 1}", "tier": "leaf"} for i in range(leaves)]
    switches += [{"name": f"spine-{i + 1}", "tier": "spine"} for i in range(spines)]
    links = [
        {"a": f"leaf-{i + 1}", "b": f"spine-{j + 1}", "bw_GBps": uplink_bw, "latency_us": 1.0}
        for i in range(leaves)
        for j in range(spines)
    ]
    return load_topology(
        {
            "version": 1,
            "name": name,
            "gpu_models": models or {"H100": {"peak_tflops": 989}},
            "switches": switches,
            "links": links,
            "nodes": nodes,
        }
    )


def leafspine(ratio: int) -> Callable[[np.random.Generator], Topology]:
    # 4 leaves x 4 nodes x 8 GPUs at 8 x 50 GB/s: 1,600 GB/s down per leaf, ratio:1 up over 2 spines.
    return lambda rng: _generated(
        f"ls-{ratio}to1", shape="leaf-spine", spines=2, leaves=4, nodes_per_leaf=4, uplink_bw_GBps=800 / ratio
    )


def rail_su(rng: np.random.Generator) -> Topology:
    return _generated(
        "rail-su", shape="rail-optimized", spines=4, leaves=16, nodes_per_leaf=4, uplink_bw_GBps=100
    )


def three_tier(ratio: int, pods: int) -> Callable[[np.random.Generator], Topology]:
    # Non-blocking leaves; each pod's 2 spines reach the 2 cores at 1/ratio of the pod's demand.
    return lambda rng: _generated(
        f"3tier-{ratio}to1",
        shape="leaf-spine",
        spines=2,
        leaves=2,
        nodes_per_leaf=4,
        uplink_bw_GBps=800,
        pods=pods,
        cores=2,
        core_uplink_bw_GBps=800 / ratio,
    )


def nvl72(rng: np.random.Generator) -> Topology:
    return _generated(
        "nvl72",
        shape="leaf-spine",
        spines=2,
        leaves=3,
        nodes_per_leaf=18,
        gpus_per_node=4,
        nics_per_node=4,
        nvlink_bw_GBps=900,
        nvlink_domain_nodes=18,
        uplink_bw_GBps=400,
    )


def straddling(rng: np.random.Generator) -> Topology:
    # NVLink domains of 4 nodes x 4 GPUs, two nodes under each of two leaves; 2:1 uplinks.
    nodes = []
    for d in range(4):
        for k in range(4):
            leaf = f"leaf-{2 * (d // 2) + 1 + (k + d) % 2}"
            nodes.append(_node(f"n{d}{k}", 4, [leaf], 4, 50, domain=f"dom-{d}", nvlink=900))
    return _full("straddle", 4, 2, 200, nodes)


def mixed_4_8(rng: np.random.Generator) -> Topology:
    nodes = []
    for i in range(12):
        gpus = 8 if rng.random() < 0.5 else 4
        nodes.append(_node(f"n{i:02d}", gpus, [f"leaf-{i // 6 + 1}"], gpus, 50))
    return _full("mixed", 2, 2, 400, nodes)


def nic_1_vs_8(rng: np.random.Generator) -> Topology:
    nodes = [_node(f"one{i}", 8, ["leaf-1"], 1, 50) for i in range(4)]
    nodes += [_node(f"eight{i}", 8, ["leaf-1"], 8, 50) for i in range(4)]
    rng.shuffle(nodes)
    return _full("nic-1-8", 1, 1, 400, nodes)


def nic_slow_fast(rng: np.random.Generator) -> Topology:
    nodes = [
        _node(f"n{i:02d}", 8, [f"leaf-{i // 4 + 1}"], 8, float(rng.choice((12.5, 25.0, 50.0))))
        for i in range(8)
    ]
    return _full("nic-mix", 2, 2, 400, nodes)


def mixed_generations(rng: np.random.Generator) -> Topology:
    """A100 (312 TFLOPS, 300 GB/s NVLink) and H100 (989, 450) nodes in random order on 2 leaves, some
    A100 nodes with the faster NICs: comm alone often prefers the older GPUs."""
    nodes = []
    for i in range(12):
        a100 = rng.random() < 0.5
        node = _node(
            f"n{i:02d}",
            8,
            [f"leaf-{i // 6 + 1}"],
            8,
            float(rng.choice((25.0, 50.0))),
            nvlink=300 if a100 else 450,
        )
        node["gpu_model"] = "A100" if a100 else "H100"
        nodes.append(node)
    return _full("mixed-gens", 2, 2, 400, nodes, {"A100": {"peak_tflops": 312}, "H100": {"peak_tflops": 989}})


def _intra_node(name: str, leaf: str, links: list[list[str]], nics: int, nic_bw: float) -> dict:
    out = _node(name, 8, [leaf], nics, nic_bw, nvlink=50)
    out["intra"] = intra_spec(links)
    return out


def intra_beside_nvlink(links: list[list[str]]) -> Callable[[np.random.Generator], Topology]:
    """Two leaves of 6 nodes: NVLink nodes and, at random places, nodes with intra links (4 or
    8 NICs)."""

    def build(rng: np.random.Generator) -> Topology:
        nodes = []
        for i in range(12):
            leaf = f"leaf-{i // 6 + 1}"
            if rng.random() < 0.5:
                nodes.append(_intra_node(f"x{i:02d}", leaf, links, int(rng.choice((4, 8))), 25.0))
            else:
                nodes.append(_node(f"n{i:02d}", 8, [leaf], 8, 50))
        return _full("intra-mix", 2, 2, 400, nodes)

    return build


def straddling_24(rng: np.random.Generator) -> Topology:
    # NVLink domains of 3 nodes x 8 GPUs over 4 leaves of 4 nodes (so most domains straddle two
    # leaves), 2:1 uplinks.
    nodes = [_node(f"n{i:02d}", 8, [f"leaf-{i // 4 + 1}"], 8, 50, domain=f"dom-{i // 3}") for i in range(16)]
    return _full("straddle-24", 4, 2, 400, nodes)


def nic_per_node(rng: np.random.Generator) -> Topology:
    # One leaf: 8-GPU nodes with 8 x 100, 8 x 25 or 4 x 50 GB/s NICs, at random.
    nodes = []
    for i in range(8):
        nics, bw = [(8, 100.0), (8, 25.0), (4, 50.0)][int(rng.integers(3))]
        nodes.append(_node(f"n{i:02d}", 8, ["leaf-1"], nics, bw))
    return _full("nic-per-node", 1, 1, 800, nodes)


# --- GB200 NVL72 racks with 4 NICs a tray, and a hot spine ------------------------------------


def gb200_nvl72_4nic(rng: np.random.Generator) -> Topology:
    """Four GB200 NVL72 racks: 18 trays of 4 GPUs a rack, one NVLink domain (NVL72 switches run
    NVLS: `Topology.domain_nvls`), 4 x 50 GB/s NICs a tray on 4 rails; 2 rail-optimized units of
    2 racks, non-blocking uplinks over 4 spines."""
    return _generated(
        "gb200-nvl72",
        shape="rail-optimized",
        gpu_model="GB200",
        peak_tflops=2500,
        spines=4,
        leaves=8,
        nodes_per_leaf=36,
        gpus_per_node=4,
        nics_per_node=4,
        nvlink_bw_GBps=900,
        nvlink_domain_nodes=18,
        uplink_bw_GBps=450,
    )


def latency_dp_job(rng: np.random.Generator, max_gpus: int) -> JobSpec:
    """A data-parallel job of 16 to 64 ranks whose allreduce is small and frequent (latency-bound:
    0.1 to 10 MB, 20 to 100 calls a step), the kind one NVLink rack should hold."""
    dp = int(rng.choice([d for d in (16, 32, 48, 64) if d <= max_gpus]))
    nbytes, count = float(rng.choice((1e5, 1e6, 1e7))), int(rng.choice((20, 50, 100)))
    comm = [{"group": "dp", "collective": "allreduce", "bytes": nbytes, "count": count}]
    return job_spec(f"latency-dp{dp}-{int(nbytes)}B-x{count}", 1, 1, dp, 1, comm)


def hot_spine(rng: np.random.Generator) -> Topology:
    """4 leaves x 4 nodes x 8 GPUs (8 x 50 GB/s NICs) under 4 spines at 200 GB/s a link (2:1)."""
    return _generated(
        "hot-spine", shape="leaf-spine", spines=4, leaves=4, nodes_per_leaf=4, uplink_bw_GBps=200
    )


def hot_spine_load(topo: Topology, rng: np.random.Generator) -> dict[str, float]:
    """Other jobs' rates (GB/s) on one hot spine (half to twice its links' capacity, spread over
    them by ECMP) or, half the time, on one or two single leaf-spine links (`leaf/spine` keys)."""
    spines = [s.name for s in topo.switches if s.tier == "spine"]
    if rng.random() < 0.5:
        spine = str(rng.choice(spines))
        capacity = sum(lk.bw_GBps for lk in topo.links if spine in (lk.a, lk.b))
        return {spine: float(rng.uniform(0.5, 2.0) * capacity)}
    links = [
        topo.links[int(i)] for i in rng.choice(len(topo.links), size=int(rng.integers(1, 3)), replace=False)
    ]
    return {f"{lk.a}/{lk.b}": float(rng.uniform(0.5, 2.0) * lk.bw_GBps) for lk in links}


def nic_faults(rng: np.random.Generator) -> Topology:
    """Two leaves of 6 8-NIC nodes at 50 GB/s where some NICs failed (the node's GPUs behind it
    moved to its neighbour NIC, which then serves two) and some run slower (a 25 or 12.5 GB/s
    link after a bad cable or a fallback), at random."""
    gen = {"shape": "leaf-spine", "spines": 2, "leaves": 2, "nodes_per_leaf": 6, "uplink_bw_GBps": 400}
    spec = generate_spec("nic-faults", {**GEN_BASE, **gen})
    for node in spec["nodes"]:
        nics = node["nics"]
        for k in rng.choice(len(nics), size=int(rng.choice((0, 1, 1, 2))), replace=False):
            nics[k]["bw_GBps"] = float(rng.choice((25.0, 12.5)))
        if rng.random() < 0.4:
            k = int(rng.integers(len(nics)))
            partner = nics[k - 1] if k else nics[1]
            partner["gpus"] = sorted(partner["gpus"] + nics[k]["gpus"])
            del nics[k]
    return load_topology(spec)


# 8,192 GPUs: 4 pods x 8 leaves x 32 nodes, non-blocking leaves, cores 2:1.
GEN_8K = {"shape": "leaf-spine", "spines": 8, "leaves": 8, "nodes_per_leaf": 32, "uplink_bw_GBps": 800}


def gpus_8k(rng: np.random.Generator) -> Topology:
    return _generated("3tier-8k", pods=4, cores=8, core_uplink_bw_GBps=400, **GEN_8K)


def leafspine_512(rng: np.random.Generator) -> Topology:
    # 8 leaves x 8 nodes x 8 GPUs at 8 x 50 GB/s, 2:1 up over 4 spines.
    return _generated("ls-512", shape="leaf-spine", spines=4, leaves=8, nodes_per_leaf=8, uplink_bw_GBps=200)


def busy_odd(topology: Topology, rng: np.random.Generator) -> np.ndarray:
    """About 90% of the GPUs busy in one of four patterns: one rail free on every node (GPU k),
    two GPUs free on every other node, the free GPUs of whole leaves but one in four nodes, or
    scattered single GPUs."""
    n = topology.n_gpus
    free = np.zeros(n, dtype=bool)
    first, count = topology.node_first_gid, topology.node_gpu_count
    pattern = int(rng.integers(4))
    for node, (f, c) in enumerate(zip(first.tolist(), count.tolist(), strict=True)):
        if pattern == 0:
            free[f + int(rng.integers(c)) if rng.random() < 0.15 else f + node % c] = True
        elif pattern == 1 and node % 2:
            free[f + rng.choice(c, size=2, replace=False)] = True
        elif pattern == 2 and node % 4 == 0 and topology.gpu_leaf[f] % 2 == 0:
            free[f : f + c] = rng.random(c) < 0.9
    if pattern == 3 or free.sum() < 8:
        free[rng.choice(n, size=n // 10, replace=False)] = True
    return free


def cp_ep_job(rng: np.random.Generator, max_gpus: int) -> JobSpec:
    """Context parallelism with expert parallelism (a long-context MoE): tp 1-4, cp 2-4, ep 2-8."""
    while True:
        tp, cp, ep = int(rng.choice((1, 2, 4))), int(rng.choice((2, 4))), int(rng.choice((2, 4, 8)))
        dp = ep * int(rng.choice((1, 2)))
        pp = int(rng.choice((1, 2)))
        gpus = tp * cp * pp * dp
        if 8 <= gpus <= min(64, max_gpus):
            break
    comm = [
        {"group": "cp", "collective": "p2p", "bytes": 3.2e7, "count": 48},
        {"group": "ep", "collective": "alltoall", "bytes": 6.4e7, "count": 32},
        {"group": "dp", "collective": "allreduce", "bytes": 5e8},
    ]
    if tp > 1:
        comm.append({"group": "tp", "collective": "allreduce", "bytes": 2e7, "count": 64})
    if pp > 1:
        comm.append({"group": "pp", "collective": "p2p", "bytes": 6e7, "count": 32})
    return load_job(
        {
            "version": 1,
            "name": f"cp-ep-tp{tp}-cp{cp}-pp{pp}-dp{dp}-ep{ep}",
            "gpus": gpus,
            "parallelism": {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep},
            "step": {"compute_ms": 500},
            "comm": comm,
        }
    )


def job_2k(rng: np.random.Generator, max_gpus: int) -> JobSpec:
    """A 2,048-rank LLM job: tp 8 x pp 4 or 8 x dp the rest."""
    pp = int(rng.choice((4, 8)))
    comm = [
        {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 96},
        {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
        {"group": "dp", "collective": "allreduce", "bytes": float(rng.choice((8e8, 2e9)))},
    ]
    return job_spec(f"llm-2k-tp8-pp{pp}-dp{2048 // (8 * pp)}", 8, pp, 2048 // (8 * pp), 1, comm)


CLUSTERS: dict[str, Callable[[np.random.Generator], Topology]] = {
    "leafspine-4:1": leafspine(4),
    "leafspine-8:1": leafspine(8),
    "rail-su": rail_su,
    "3tier-core-4:1": three_tier(4, 3),
    "nvl72": nvl72,
    "nvl-straddle": straddling,
    "mixed-4-8": mixed_4_8,
    "nic-1-vs-8": nic_1_vs_8,
    "nic-slow-fast": nic_slow_fast,
    "busy": leafspine(2),
    "link-load": leafspine(2),
    "pcie-beside-nvl": intra_beside_nvlink(PCIE_TWO_SOCKETS),
    "cube-beside-nvl": intra_beside_nvlink(DGX1_CUBE_MESH),
    "straddle-24-dp": straddling_24,
    "odd-free": leafspine(4),
    "nic-per-node": nic_per_node,
    "mixed-gens": mixed_generations,
    "gb200-nvl72-4nic": gb200_nvl72_4nic,
    "hot-spine": hot_spine,
    "nic-faults": nic_faults,
    "3tier-core-8:1": three_tier(8, 4),
    "2k-on-8k": gpus_8k,
    "cp-ep": leafspine(4),
    "busy-90-odd": leafspine_512,
}
# Oracle evaluations per scenario where a 2,048-rank job makes each one slow.
CLASS_EVALS = {"2k-on-8k": 150}


def fragment(topology: Topology, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A free mask with about `fraction` of the GPUs busy, taken in blocks of 1-8 GPUs per node."""
    free = np.ones(topology.n_gpus, dtype=bool)
    target = int(round(fraction * topology.n_gpus))
    first, count = topology.node_first_gid, topology.node_gpu_count
    busy = 0
    while busy < target:
        node = int(rng.integers(len(first)))
        local = np.flatnonzero(free[first[node] : first[node] + count[node]]) + first[node]
        if not local.size:
            continue
        size = min(int(rng.choice((1, 2, 3, 4, 8))), local.size, target - busy)
        free[rng.choice(local, size=size, replace=False)] = False
        busy += size
    return free


# --- jobs ---------------------------------------------------------------------------------------


def random_job(rng: np.random.Generator, max_gpus: int) -> JobSpec:
    """One job of a random shape that fits `max_gpus` (8 to 64 GPUs)."""
    while True:
        shape = str(rng.choice(("pp-heavy", "tp-heavy", "dp-heavy", "moe", "llm")))
        if shape == "pp-heavy":
            tp, pp, dp, ep = int(rng.choice((1, 2))), int(rng.choice((4, 8))), int(rng.choice((1, 2, 4))), 1
            comm = [
                {"group": "tp", "collective": "allreduce", "bytes": 1e6, "count": 8},
                {"group": "pp", "collective": "p2p", "bytes": float(rng.choice((1e8, 4e8))), "count": 32},
                {"group": "dp", "collective": "allreduce", "bytes": 2e8},
            ]
        elif shape == "tp-heavy":
            tp, pp, dp, ep = (
                int(rng.choice((4, 8))),
                int(rng.choice((1, 2, 4))),
                int(rng.choice((1, 2, 4))),
                1,
            )
            comm = [
                {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 96},
                {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
                {"group": "dp", "collective": "allreduce", "bytes": 8e8},
            ]
        elif shape == "dp-heavy":
            tp, pp, dp, ep = 1, 1, int(rng.choice((8, 16, 32, 64))), 1
            comm = [{"group": "dp", "collective": "allreduce", "bytes": float(rng.choice((1e8, 1.3e9)))}]
        elif shape == "moe":
            tp, pp, ep = 1, 1, int(rng.choice((4, 8)))
            dp = ep * int(rng.choice((2, 4, 8)))
            comm = [
                {"group": "ep", "collective": "alltoall", "bytes": 6.4e7, "count": 32},
                {"group": "dp", "collective": "allreduce", "bytes": 5e8},
            ]
        else:
            tp, pp, dp, ep = (
                int(rng.choice((2, 4, 8))),
                int(rng.choice((2, 4))),
                int(rng.choice((1, 2, 4))),
                1,
            )
            comm = [
                {"group": "tp", "collective": "allreduce", "bytes": 2e7, "count": 64},
                {"group": "pp", "collective": "p2p", "bytes": 6e7, "count": 32},
                {"group": "dp", "collective": "allgather", "bytes": 4e8},
                {"group": "dp", "collective": "reducescatter", "bytes": 4e8},
            ]
        gpus = tp * pp * dp
        if 8 <= gpus <= min(64, max_gpus):
            return job_spec(f"{shape}-tp{tp}-pp{pp}-dp{dp}-ep{ep}", tp, pp, dp, ep, comm)


def odd_free(topology: Topology, rng: np.random.Generator) -> np.ndarray:
    """Every node with 3, 5, 6 or 7 GPUs free (or all 8), at random offsets."""
    free = np.zeros(topology.n_gpus, dtype=bool)
    for node, first in enumerate(topology.node_first_gid):
        count = int(topology.node_gpu_count[node])
        keep = min(count, int(rng.choice((3, 5, 6, 7, 8))))
        free[first + rng.choice(count, size=keep, replace=False)] = True
    return free


def dp_job(rng: np.random.Generator, max_gpus: int) -> JobSpec:
    """A data-parallel-only job of 16, 24, 32 or 48 ranks."""
    dp = int(rng.choice([d for d in (16, 24, 32, 48) if d <= max_gpus]))
    comm = [{"group": "dp", "collective": "allreduce", "bytes": float(rng.choice((1e8, 1.3e9)))}]
    return job_spec(f"dp-only-dp{dp}", 1, 1, dp, 1, comm)


def tp6_job(rng: np.random.Generator, max_gpus: int) -> JobSpec:
    """TP groups of 6 (they fit an 8-GPU node with 2 to spare) over 2 or 4 replicas or stages."""
    pp, dp = [(1, 2), (1, 4), (2, 2)][int(rng.integers(3)) if max_gpus >= 24 else 0]
    comm = [
        {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 96},
        {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
        {"group": "dp", "collective": "allreduce", "bytes": 8e8},
    ]
    return job_spec(f"tp6-pp{pp}-dp{dp}", 6, pp, dp, 1, comm)


def scenario(cls: str, rng: np.random.Generator):
    """(topology, free mask, link load, job) of one scenario of class `cls`."""
    topo = CLUSTERS[cls](rng)
    busy = {"busy": float(rng.choice((0.3, 0.5, 0.6)))}.get(cls, float(rng.choice((0.0, 0.0, 0.25))))
    if cls == "odd-free":
        free = odd_free(topo, rng)
    elif cls == "busy-90-odd":
        free = busy_odd(topo, rng)
    else:
        free = fragment(topo, busy, rng)
    if cls == "2k-on-8k":
        return topo, free, None, job_2k(rng, int(free.sum()))
    if cls == "cp-ep":
        return topo, free, None, cp_ep_job(rng, int(free.sum()))
    if cls == "busy-90-odd":
        return topo, free, None, random_job(rng, int(free.sum()))
    if cls == "straddle-24-dp":
        return topo, free, None, dp_job(rng, int(free.sum()))
    if cls == "odd-free" and rng.random() < 0.5:
        return topo, free, None, tp6_job(rng, int(free.sum()))
    load = None
    if cls == "gb200-nvl72-4nic" and rng.random() < 0.5:
        return topo, free, None, latency_dp_job(rng, int(free.sum()))
    if cls == "hot-spine":
        return topo, free, hot_spine_load(topo, rng), random_job(rng, int(free.sum()))
    if cls == "link-load":
        leaves = rng.choice(topo.leaf_names, size=max(1, len(topo.leaf_names) // 2), replace=False)
        # Other jobs' mean rates (GB/s): a quarter to twice each loaded leaf's uplink capacity.
        total = topo.leaf_uplink_total_bw
        load = {str(leaf): float(rng.uniform(0.25, 2.0) * total[topo.leaf_by_name[leaf]]) for leaf in leaves}
    job = random_job(rng, int(free.sum()))
    return topo, free, load, job


# --- the oracle ---------------------------------------------------------------------------------


class Oracle:
    """Simulated annealing over rank -> GPU maps, pricing with `evaluate` only."""

    def __init__(self, topology: Topology, job: JobSpec, free: np.ndarray, load, rng: np.random.Generator):
        self.topo, self.job, self.free, self.load, self.rng = topology, job, free, load, rng
        self.free_ids = np.flatnonzero(free)
        self.evals = 0

    def cost(self, gids: np.ndarray) -> float:
        self.evals += 1
        pred = evaluate(self.topo, self.job, gids, self.load, detail=False)
        # On a fleet of several GPU models compute depends on the GPUs too: the step is the aim.
        return pred.step_ms if len(self.topo.model_rates) > 1 else pred.comm_ms

    def starts(self, n_random: int, given: list[np.ndarray]) -> list[np.ndarray]:
        out = [np.asarray(g, dtype=np.int64) for g in given]
        for policy in BASELINE_STARTS:
            chosen = place(self.topo, self.free, self.load, self.job, policy=policy)
            if not isinstance(chosen, NoFit):
                out.append(np.asarray(chosen.gids, dtype=np.int64))
        for _ in range(n_random):
            out.append(self.rng.choice(self.free_ids, size=self.job.gpus, replace=False))
            # Random whole nodes in random order, ranks laid on them in rank order.
            nodes = self.rng.permutation(np.unique(self.topo.gpu_node[self.free_ids]))
            pos = np.empty(len(self.topo.nodes), dtype=np.int64)
            pos[nodes] = np.arange(nodes.size)
            key = pos[self.topo.gpu_node[self.free_ids]]
            out.append(self.free_ids[np.argsort(key, kind="stable")][: self.job.gpus])
        return out

    def _move(self, cur: np.ndarray, used: np.ndarray) -> np.ndarray:
        trial = cur.copy()
        kind = self.rng.random()
        n = cur.size
        spare = self.free_ids[~used[self.free_ids]]
        if kind < 0.5 or (kind < 0.8 and not spare.size):
            a, b = self.rng.choice(n, size=2, replace=False)
            trial[a], trial[b] = cur[b], cur[a]
        elif kind < 0.8:
            trial[int(self.rng.integers(n))] = int(self.rng.choice(spare))
        else:
            # Exchange whole nodes: the job's ranks on node A go to node B's GPUs (used or free).
            node = self.topo.gpu_node
            a, b = (int(x) for x in self.rng.choice(np.unique(node[self.free_ids]), size=2, replace=False))
            ga = np.flatnonzero(self.free[self.topo.node_first_gid[a] :][: self.topo.node_gpu_count[a]])
            gb = np.flatnonzero(self.free[self.topo.node_first_gid[b] :][: self.topo.node_gpu_count[b]])
            ga, gb = ga + self.topo.node_first_gid[a], gb + self.topo.node_first_gid[b]
            swap = dict(zip(ga.tolist(), gb.tolist(), strict=False))
            swap.update({v: k for k, v in list(swap.items())})
            trial = np.array([swap.get(int(g), int(g)) for g in cur], dtype=np.int64)
        return trial

    def anneal(self, start: np.ndarray, evals: int) -> tuple[float, np.ndarray]:
        cur = start.copy()
        used = np.zeros(self.topo.n_gpus, dtype=bool)
        used[cur] = True
        cur_cost = self.cost(cur)
        best_cost, best = cur_cost, cur.copy()
        t0 = max(cur_cost, 1e-9) * 0.05
        for i in range(evals):
            temp = t0 * (1 - i / evals) + 1e-12
            trial = self._move(cur, used)
            c = self.cost(trial)
            if c <= cur_cost or self.rng.random() < math.exp(-(c - cur_cost) / temp):
                used[cur] = False
                used[trial] = True
                cur, cur_cost = trial, c
                if c < best_cost:
                    best_cost, best = c, trial.copy()
        return best_cost, best

    def search(self, total_evals: int, given: list[np.ndarray], n_random: int = 2) -> tuple[float, float]:
        """The cheapest comm ms found from the given maps, the baselines' and random ones, and
        that map's step ms."""
        starts = self.starts(n_random, given)
        per = max(50, total_evals // len(starts))
        cost, best = min((self.anneal(s, per) for s in starts), key=lambda r: r[0])
        return cost, evaluate(self.topo, self.job, best, self.load, detail=False).step_ms


# --- the run ------------------------------------------------------------------------------------


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def run_quality(
    seed: int, per_class: int, evals: int, classes: list[str] | None = None, ref: RefPlacer | None = None
) -> list[dict]:
    """One row per scenario: class, job, topo and oracle comm ms, the free-set bound, and with
    `ref` REF's placement priced by today's model. `classes` (default all) picks classes by name;
    a scenario's seed depends only on its class's place in CLUSTERS, so a filtered run reproduces
    the same scenarios."""
    rows = []
    for ci, cls in enumerate(CLUSTERS):
        if classes and cls not in classes:
            continue
        for k in range(per_class):
            rng = np.random.default_rng([seed, ci, k])
            topo, free, load, job = scenario(cls, rng)
            t0 = time.perf_counter()
            placed = place(topo, free, load, job)
            topo_s = time.perf_counter() - t0
            if isinstance(placed, NoFit):
                continue
            # topo's own answer is one more start, used as a black box: the search can only improve it.
            oracle, oracle_step = Oracle(topo, job, free, load, rng).search(
                min(evals, CLASS_EVALS.get(cls, evals)), [np.asarray(placed.gids)]
            )
            gens = len(topo.model_rates) > 1
            bound = lower_bound(topo, job, free=free)
            bound = bound.step_ms if gens else bound.comm_ms
            baselines = [place(topo, free, load, job, policy=p) for p in BASELINE_STARTS]
            best_baseline = min(
                (b.prediction.step_ms for b in baselines if not isinstance(b, NoFit)), default=math.inf
            )
            ref_ms, ref_note = (math.nan, "") if ref is None else ref_price(ref, topo, free, load, job, gens)
            rows.append(
                {
                    "ref_ms": ref_ms,
                    "ref_note": ref_note,
                    "class": cls,
                    "k": k,
                    "job": job.name,
                    "empty": bool(free.all()),
                    "topo_ms": placed.prediction.step_ms if gens else placed.prediction.comm_ms,
                    "oracle_ms": oracle,
                    "topo_step_ms": placed.prediction.step_ms,
                    "oracle_step_ms": oracle_step,
                    "bound_ms": bound,
                    "topo_s": topo_s,
                    "baseline_step_ms": best_baseline,
                }
            )
    return rows


def ref_price(
    ref: RefPlacer, topo: Topology, free: np.ndarray, load, job: JobSpec, gens: bool
) -> tuple[float, str]:
    """REF's placement of the scenario priced by today's model (step ms on a fleet of several GPU
    models, else comm ms, as topo_ms), or nan and why REF gave none."""
    ok = allowed(topo, job)
    mask = free if ok is None else free & ok
    got = ref.place(topology_to_spec(topo), np.flatnonzero(mask).tolist(), load, job_to_spec(job))
    if isinstance(got, str):
        return math.nan, got
    node_at = {n.name: i for i, n in enumerate(topo.nodes)}
    gids = np.array([int(topo.node_first_gid[node_at[n]]) + i for n, i in got], dtype=np.int64)
    pred = evaluate(topo, job, gids, load, detail=False)
    return (pred.step_ms if gens else pred.comm_ms), ""


def report_against(rows: list[dict], ref_name: str) -> int:
    """Per class, topo / REF (geomean, max) and the scenarios where topo is more than
    AGAINST_TOLERANCE worse than REF's placement; the number of those."""
    print(f"\ntopo against {ref_name}'s placements, both priced by today's model, per scenario class")
    print(f"{'class':<16}{'n':>4}{'geo t/ref':>11}{'max t/ref':>11}{'worse':>7}{'no ref':>8}")
    by_class: dict[str, list[dict]] = {}
    for r in rows:
        by_class.setdefault(r["class"], []).append(r)
    for cls, rs in [*by_class.items(), ("all", rows)]:
        ratios = [_ref_ratio(r) for r in rs if math.isfinite(r["ref_ms"])]
        worse = sum(x > 1 + AGAINST_TOLERANCE for x in ratios)
        print(
            f"{cls:<16}{len(rs):>4}{_geomean(ratios):>11.3f}{max(ratios, default=math.nan):>11.3f}"
            f"{worse:>7}{len(rs) - len(ratios):>8}"
        )
    bad = [r for r in rows if math.isfinite(r["ref_ms"]) and _ref_ratio(r) > 1 + AGAINST_TOLERANCE]
    for r in bad:
        print(
            f"  REGRESSION {r['class']} k={r['k']} {r['job']}: topo {r['topo_ms']:.2f} ms, "
            f"{ref_name} {r['ref_ms']:.2f} ms ({_ref_ratio(r):.3f})"
        )
    for r in rows:
        if r["ref_note"]:
            print(f"  {ref_name} gave no placement on {r['class']} k={r['k']} {r['job']}: {r['ref_note']}")
    return len(bad)


def _ref_ratio(r: dict) -> float:
    if r["ref_ms"] <= 0:
        return 1.0 if r["topo_ms"] <= 0 else math.inf
    return r["topo_ms"] / r["ref_ms"]


def _ratio(r: dict) -> float:
    # topo / oracle; both zero (nothing to communicate) is a tie.
    if r["oracle_ms"] <= 0:
        return 1.0 if r["topo_ms"] <= 0 else math.inf
    return r["topo_ms"] / r["oracle_ms"]


def _step_ratio(r: dict) -> float:
    # topo's step time over the step time of the oracle's cheapest-comm map.
    return r["topo_step_ms"] / r["oracle_step_ms"] if r["oracle_step_ms"] > 0 else 1.0


def print_table(rows: list[dict]) -> None:
    """Every scenario: class, index, job, topo / oracle / bound comm ms, topo / oracle, topo's seconds."""
    print(
        f"{'class':<16}{'k':>2}  {'job':<28}{'topo ms':>10}{'oracle ms':>10}{'bound ms':>10}{'t/o':>7}"
        f"{'step':>7}{'s':>7}"
    )
    for r in rows:
        print(
            f"{r['class']:<16}{r['k']:>2}  {r['job']:<28}{r['topo_ms']:>10.2f}{r['oracle_ms']:>10.2f}"
            f"{r['bound_ms']:>10.2f}{_ratio(r):>7.3f}{_step_ratio(r):>7.3f}{r['topo_s']:>7.3f}"
        )
    print()


def report_quality(rows: list[dict]) -> dict:
    print("topo against the search oracle (both priced by evaluate), per scenario class")
    head = (
        f"{'class':<16}{'n':>4}{'geo t/o':>9}{'max t/o':>9}{'>2%':>5}{'>20%':>6}{'gap p50':>9}{'gap p90':>9}"
        f"{'geo step':>9}{'max step':>9}{'t/base':>8}{'max':>7}"
    )
    print(head)
    by_class: dict[str, list[dict]] = {}
    for r in rows:
        by_class.setdefault(r["class"], []).append(r)
    for cls, rs in [*by_class.items(), ("all", rows)]:
        ratios = [_ratio(r) for r in rs]
        gaps = [bound_gap(r["topo_ms"], r["bound_ms"]) for r in rs]
        # topo's step over the best baseline's (first_fit, naive, tree_best_fit).
        base = [r["topo_step_ms"] / r["baseline_step_ms"] for r in rs if math.isfinite(r["baseline_step_ms"])]
        print(
            f"{cls:<16}{len(rs):>4}{_geomean(ratios):>9.3f}{max(ratios):>9.3f}"
            f"{sum(x > 1.02 for x in ratios):>5}{sum(x > 1.2 for x in ratios):>6}"
            f"{np.percentile(gaps, 50):>9.3f}{np.percentile(gaps, 90):>9.3f}"
            f"{_geomean([_step_ratio(r) for r in rs]):>9.3f}{max(_step_ratio(r) for r in rs):>9.3f}"
            f"{_geomean(base):>8.3f}{max(base, default=math.nan):>7.3f}"
        )
    worst = sorted(rows, key=_ratio, reverse=True)[:5]
    print("\nworst scenarios (topo ms / oracle ms / bound ms)")
    for r in worst:
        print(
            f"  {r['class']:<16}{r['job']:<28}{r['topo_ms']:>10.2f}{r['oracle_ms']:>10.2f}{r['bound_ms']:>10.2f}"
        )
    ratios = [_ratio(r) for r in rows]
    gaps = [bound_gap(r["topo_ms"], r["bound_ms"]) for r in rows]
    print(f"\ntopo / oracle: median {float(np.median(ratios)):.3f}, worst {max(ratios):.3f}")
    steps = [_step_ratio(r) for r in rows]
    print(f"topo / oracle on step time: geomean {_geomean(steps):.3f}, worst {max(steps):.3f}")
    return {
        "step_max": max(steps),
        "geomean": _geomean(ratios),
        "max": max(ratios),
        "gap_p50": float(np.percentile(gaps, 50)),
        "empty_beaten": sum(_ratio(r) > 1.02 for r in rows if r["empty"]),
        "empty": sum(r["empty"] for r in rows),
    }


def speed_job(gpus: int) -> JobSpec:
    pp = 4 if gpus >= 64 else 1
    return job_spec(
        f"llm-{gpus}",
        8,
        pp,
        gpus // (8 * pp),
        1,
        [
            {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 160},
            {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
            {"group": "dp", "collective": "allreduce", "bytes": 8.1e8},
        ],
        2000,
    )


def run_speed(seed: int, runs: int, quick: bool) -> dict:
    """topo latency: a 1,024-GPU job on 16,384 GPUs (fragmented, `runs` times) and a 16,384-GPU
    job on 131,072 GPUs (once, 10% busy)."""
    out: dict[str, float] = {}
    big = _generated(
        "3tier-16k",
        shape="leaf-spine",
        spines=8,
        leaves=8,
        nodes_per_leaf=32,
        uplink_bw_GBps=800,
        pods=8,
        cores=8,
        core_uplink_bw_GBps=800,
    )
    job = speed_job(1024)
    # One warm-up placement builds the per-topology hierarchy index, as the scheduler's cached
    # topology has it already.
    place(big, np.ones(big.n_gpus, dtype=bool), None, speed_job(8))
    times = []
    for k in range(runs):
        free = fragment(big, (0.0, 0.15, 0.3)[k % 3], np.random.default_rng([seed, 99, k]))
        t0 = time.perf_counter()
        place(big, free, None, job)
        times.append((time.perf_counter() - t0) * 1e3)
    out["1k_on_16k_p50_ms"], out["1k_on_16k_p99_ms"] = (float(np.percentile(times, q)) for q in (50, 99))
    if not quick:
        huge = _generated(
            "3tier-128k",
            shape="leaf-spine",
            spines=8,
            leaves=16,
            nodes_per_leaf=32,
            uplink_bw_GBps=1600,
            pods=32,
            cores=16,
            core_uplink_bw_GBps=1600,
        )
        free = fragment(huge, 0.1, np.random.default_rng([seed, 98]))
        place(huge, free, None, speed_job(8))
        t0 = time.perf_counter()
        placed = place(huge, free, None, speed_job(16384))
        out["16k_on_128k_ms"] = (time.perf_counter() - t0) * 1e3
        out["16k_placed"] = float(not isinstance(placed, NoFit))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one scenario per class, short search: a smoke run"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-class", type=int, default=6, help="scenarios per class")
    parser.add_argument("--evals", type=int, default=4000, help="oracle evaluations per scenario")
    parser.add_argument("--classes", default="", help="comma-separated scenario classes (default all)")
    parser.add_argument("--table", action="store_true", help="print every scenario's row")
    parser.add_argument("--no-speed", action="store_true", help="skip the large-cluster latency runs")
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also price REF's topo placements (a release in CHANGELOG.md or a commit) with today's model;"
        # argparse %-formats help texts: a percent sign is written %%.
        f" exit 1 where topo is more than {AGAINST_TOLERANCE * 100:.1f}%% worse",
    )
    args = parser.parse_args(argv)
    per_class, evals = (1, 300) if args.quick else (args.per_class, args.evals)
    classes = [c for c in args.classes.split(",") if c]
    unknown = sorted(set(classes) - set(CLUSTERS))
    if unknown:
        parser.error(f"--classes: unknown {', '.join(unknown)}; known: {', '.join(CLUSTERS)}")
    start = time.perf_counter()
    ref = RefPlacer(args.against) if args.against else None
    try:
        rows = run_quality(args.seed, per_class, evals, classes, ref)
    finally:
        if ref is not None:
            ref.close()
    if args.table:
        print_table(rows)
    q = report_quality(rows)
    regressions = report_against(rows, args.against) if args.against else 0
    speed = {} if args.no_speed else run_speed(args.seed, 1 if args.quick else 12, args.quick)
    if speed:
        print("\nspeed (topo)")
        print(
            f"  1,024-GPU job on 16,384 GPUs: p50 {speed['1k_on_16k_p50_ms']:.1f} ms, "
            f"p99 {speed['1k_on_16k_p99_ms']:.1f} ms"
        )
    if "16k_on_128k_ms" in speed:
        print(
            f"  16,384-GPU job on 131,072 GPUs: {speed['16k_on_128k_ms']:.1f} ms (placed: {bool(speed['16k_placed'])})"
        )
    print("\ntargets")
    checks = [
        (
            f"geomean topo/oracle {q['geomean']:.3f} <= {ORACLE_TARGET_GEOMEAN}",
            q["geomean"] <= ORACLE_TARGET_GEOMEAN,
        ),
        (f"max topo/oracle {q['max']:.3f} <= {ORACLE_TARGET_MAX}", q["max"] <= ORACLE_TARGET_MAX),
        (
            f"worst step topo/oracle {q['step_max']:.3f} <= {STEP_TARGET_MAX}",
            q["step_max"] <= STEP_TARGET_MAX,
        ),
        (
            f"gap to the free-set bound p50 {q['gap_p50']:.3f} <= {GAP_P50_TARGET}",
            q["gap_p50"] <= GAP_P50_TARGET,
        ),
    ]
    if speed:
        checks.append(
            (
                f"1,024 GPUs on 16,384 p99 {speed['1k_on_16k_p99_ms']:.0f} ms < {SPEED_TARGET_1K_P99_MS:.0f} ms",
                speed["1k_on_16k_p99_ms"] < SPEED_TARGET_1K_P99_MS,
            )
        )
    if "16k_on_128k_ms" in speed:
        checks.append(
            (
                f"16,384 GPUs on 131,072 {speed['16k_on_128k_ms']:.0f} ms < {SPEED_TARGET_16K_MS:.0f} ms",
                speed["16k_on_128k_ms"] < SPEED_TARGET_16K_MS and bool(speed["16k_placed"]),
            )
        )
    for text, ok in checks:
        print(f"  {text}: {'met' if ok else 'NOT met'}")
    print(f"  empty clusters where the oracle beat topo by > 2%: {q['empty_beaten']} of {q['empty']}")
    if args.against:
        print(f"  scenarios where topo is > {AGAINST_TOLERANCE:.1%} worse than {args.against}: {regressions}")
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
