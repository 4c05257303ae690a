"""Placement speed: how long `topo` takes per job, and how that grows with the cluster.

Clusters (generated, 8 GPUs per node): 1k GPUs (one leaf-spine pod of 4 leaves x 32 nodes), 16k
(3-tier: 8 pods x 8 leaves x 32 nodes) and 100k (3-tier: 50 pods x 8 leaves x 32 nodes). Each run
places one job on a freshly fragmented free set (0%, 15% or 30% busy, seeded, in blocks of 1-8
GPUs). Printed:
- latency p50/p99 (ms) of topo (and tree_best_fit for scale) for 8-, 64- and 1,024-GPU jobs;
- placements/s of 8-GPU jobs on the 2,048-node cluster, booking each and releasing old ones so
  the cluster stays about 80% busy;
- growth: the exponent k in time ~ GPUs^k between cluster sizes (k <= 1 is linear or better);
- the targets.

    .venv/bin/python bench/placement_speed.py [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from figures import figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.jobs import load_job  # noqa: E402
from apps.placement.solvers import NoFit, place  # noqa: E402
from apps.placement.topology import Topology, load_topology  # noqa: E402

TARGETS = {
    "p50_1024_on_16k_ms": 100.0,
    "p99_1024_on_16k_ms": 1000.0,
    "p99_on_100k_ms": 2000.0,
    "placements_per_s": 500.0,
}


def cluster(name: str, pods: int, leaves: int, nodes_per_leaf: int) -> Topology:
    """A generated 8-GPU-per-node leaf-spine cluster, 3-tier when pods > 1."""
    gen = {
        "shape": "leaf-spine",
        "spines": 8,
        "leaves": leaves,
        "nodes_per_leaf": nodes_per_leaf,
        "gpus_per_node": 8,
        "gpu_model": "H100-SXM5-80GB",
        "peak_tflops": 989,
        "nvlink_bw_GBps": 450,
        "nic_bw_GBps": 50,
        "nics_per_node": 8,
        "uplink_bw_GBps": 800,
    }
    if pods > 1:
        gen.update(pods=pods, cores=8, core_uplink_bw_GBps=800)
    return load_topology({"version": 1, "name": name, "generate": gen})


def llm_job(gpus: int):
    """tp8 (or fewer for small jobs) x pp up to 4 x dp: a dense LLM of `gpus` GPUs."""
    tp = min(8, gpus)
    pp = 4 if gpus >= 64 else 1
    dp = gpus // (tp * pp)
    return load_job(
        {
            "version": 1,
            "name": f"llm-{gpus}",
            "gpus": gpus,
            "parallelism": {"tp": tp, "pp": pp, "dp": dp},
            "step": {"compute_ms": 2000},
            "comm": [
                {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 160},
                {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
                {"group": "dp", "collective": "allreduce", "bytes": 8.1e8},
            ],
        }
    )


def fragment(topology: Topology, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A free mask with about `fraction` of GPUs busy, in blocks of 1, 2, 4 or 8 GPUs per node."""
    free = np.ones(topology.n_gpus, dtype=bool)
    per_node = int(topology.node_gpu_count[0])
    n_nodes = len(topology.nodes)
    target = int(round(fraction * topology.n_gpus))
    sizes = rng.choice((1, 2, 4, 8), size=max(1, target))
    # Blocks land on random nodes at random offsets; overlaps just make a node busier.
    nodes = rng.integers(n_nodes, size=sizes.size)
    offsets = rng.integers(per_node, size=sizes.size)
    total = np.cumsum(np.minimum(sizes, per_node))
    k = int(np.searchsorted(total, target)) + 1
    for node, off, size in zip(nodes[:k], offsets[:k], sizes[:k], strict=True):
        first = int(topology.node_first_gid[node])
        idx = first + (off + np.arange(min(size, per_node))) % per_node
        free[idx] = False
    return free


def latency(topology: Topology, gpus: int, policy: str, runs: int, seed: int) -> list[float]:
    """Seconds per placement over `runs` fragmented free sets."""
    job = llm_job(gpus)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(runs):
        frac = float(rng.choice((0.0, 0.15, 0.3)))
        free = fragment(topology, frac, rng)
        if int(free.sum()) < gpus:
            free = topology.free_mask()
        start = time.perf_counter()
        result = place(topology, free, None, job, policy=policy)
        out.append(time.perf_counter() - start)
        assert not isinstance(result, NoFit), result
    return out


def throughput(topology: Topology, placements: int, seed: int) -> float:
    """Placements per second of 8-GPU jobs, booked one after another at ~80% utilisation."""
    job = llm_job(8)
    rng = np.random.default_rng(seed)
    free = topology.free_mask()
    running: list[tuple[int, ...]] = []
    spent = 0.0
    done = 0
    while done < placements:
        if free.sum() < 0.2 * topology.n_gpus or free.sum() < job.gpus:
            victim = running.pop(int(rng.integers(len(running))))
            free[list(victim)] = True
            continue
        start = time.perf_counter()
        result = place(topology, free, None, job, policy="topo")
        spent += time.perf_counter() - start
        free[list(result.gids)] = False
        running.append(result.gids)
        done += 1
    return done / spent


def _ms(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k and 16k clusters, few runs: a smoke run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    wall = time.perf_counter()
    specs = [("1k", 1, 4, 32), ("16k", 8, 8, 32)] + ([] if args.quick else [("100k", 50, 8, 32)])
    runs = 3 if args.quick else 40
    sizes = (8, 64, 1024)
    lat: dict[tuple[str, int, str], list[float]] = {}
    n_gpus: dict[str, int] = {}
    print(f"{'cluster':<8}{'GPUs':>8}{'job':>6}{'topo p50':>10}{'p99':>9}{'tree p50':>10}{'p99':>9}  (ms)")
    topologies: dict[str, Topology] = {}
    for name, pods, leaves, per_leaf in specs:
        topo = topologies[name] = cluster(name, pods, leaves, per_leaf)
        n_gpus[name] = topo.n_gpus
        place(topo, topo.free_mask(), None, llm_job(8))  # builds the per-topology indexes once
        for gpus in sizes:
            if gpus > topo.n_gpus:
                continue
            for policy in ("topo", "tree_best_fit"):
                lat[(name, gpus, policy)] = latency(topo, gpus, policy, runs, args.seed)
            t, b = lat[(name, gpus, "topo")], lat[(name, gpus, "tree_best_fit")]
            print(
                f"{name:<8}{topo.n_gpus:>8}{gpus:>6}{_ms(t, 50):>10.2f}{_ms(t, 99):>9.2f}"
                f"{_ms(b, 50):>10.2f}{_ms(b, 99):>9.2f}"
            )
    rate = throughput(topologies["16k"], 200 if args.quick else 3000, args.seed)
    print(f"\nplacements/s of 8-GPU jobs on {len(topologies['16k'].nodes)} nodes: {rate:.0f}")
    print()
    for (name, gpus, policy), xs in lat.items():
        short = "topo" if policy == "topo" else "tree"
        figure(f"{short}_{gpus}_on_{name}_p50_ms", _ms(xs, 50), "ms")
        figure(f"{short}_{gpus}_on_{name}_p99_ms", _ms(xs, 99), "ms")
    figure("placements_per_s_8gpu", rate, "1/s")

    print("\ngrowth exponent k (p50 time ~ GPUs^k)")
    names = [s[0] for s in specs]
    for gpus in sizes:
        for a, b in zip(names, names[1:], strict=False):
            if (a, gpus, "topo") in lat and (b, gpus, "topo") in lat:
                ta, tb = _ms(lat[(a, gpus, "topo")], 50), _ms(lat[(b, gpus, "topo")], 50)
                k = math.log(tb / ta) / math.log(n_gpus[b] / n_gpus[a])
                print(f"  {gpus:>5}-GPU job, {a} -> {b}: {ta:.2f} -> {tb:.2f} ms, k = {k:.2f}")

    print("\ntargets")
    p50 = _ms(lat[("16k", 1024, "topo")], 50)
    p99 = _ms(lat[("16k", 1024, "topo")], 99)
    checks = [
        (f"1,024-GPU job on 16k p50 {p50:.1f} ms < 100 ms", p50 < TARGETS["p50_1024_on_16k_ms"]),
        (f"1,024-GPU job on 16k p99 {p99:.1f} ms < 1 s", p99 < TARGETS["p99_1024_on_16k_ms"]),
        (f"placements/s {rate:.0f} >= 500", rate >= TARGETS["placements_per_s"]),
    ]
    if "100k" in names:
        worst = max(_ms(lat[("100k", g, "topo")], 99) for g in sizes)
        checks.append((f"100k GPUs p99 {worst:.1f} ms < 2 s", worst < TARGETS["p99_on_100k_ms"]))
    for text, ok in checks:
        print(f"  {text}: {'met' if ok else 'NOT met'}")
    print(f"\n({time.perf_counter() - wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
