"""Spec builders shared by the placement core's unit tests."""

from __future__ import annotations

import copy

from apps.placement.jobs import load_job


def generated(shape="leaf-spine", **overrides) -> dict:
    """A small `generate:` spec; keyword arguments override its fields."""
    gen = {
        "shape": shape,
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
    }
    gen.update(overrides)
    return {"version": 1, "name": f"gen-{shape}", "generate": gen}


# A deliberately irregular cluster: a two-node NVLink domain, a node whose NICs sit under two leaves,
# parallel cables, uneven uplinks and NICs, two pods joined at one core, and a standalone node.
HETERO_SPEC = {
    "version": 1,
    "name": "hetero",
    "gpu_models": {"A": {"peak_tflops": 312}, "B": {"peak_tflops": 989}},
    "switches": [
        {"name": "leaf-1", "tier": "leaf"},
        {"name": "leaf-2", "tier": "leaf"},
        {"name": "leaf-3", "tier": "leaf"},
        {"name": "leaf-4", "tier": "leaf"},
        {"name": "spine-1", "tier": "spine"},
        {"name": "spine-2", "tier": "spine"},
        {"name": "core-1", "tier": "core"},
    ],
    "links": [
        {"a": "leaf-1", "b": "spine-1", "bw_GBps": 100, "latency_us": 1.0},
        {"a": "leaf-1", "b": "spine-1", "bw_GBps": 50, "latency_us": 1.0},
        {"a": "leaf-2", "b": "spine-1", "bw_GBps": 40, "latency_us": 2.0},
        {"a": "leaf-3", "b": "spine-2", "bw_GBps": 200, "latency_us": 1.0},
        {"a": "leaf-4", "b": "spine-2", "bw_GBps": 30, "latency_us": 1.5},
        {"a": "spine-1", "b": "core-1", "bw_GBps": 300, "latency_us": 3.0},
        {"a": "core-1", "b": "spine-2", "bw_GBps": 150, "latency_us": 2.5},
    ],
    "nodes": [
        {
            "name": "n1",
            "gpu_model": "A",
            "gpus": 4,
            "nvlink": {"domain": "d1", "bw_GBps": 300, "latency_us": 2.0},
            "nics": [
                {"name": "nic0", "gpus": [0, 1], "leaf": "leaf-1", "bw_GBps": 25, "latency_us": 1.5},
                {"name": "nic1", "gpus": [2, 3], "leaf": "leaf-2", "bw_GBps": 50, "latency_us": 1.0},
            ],
        },
        {
            "name": "n2",
            "gpu_model": "A",
            "gpus": 4,
            "nvlink": {"domain": "d1", "bw_GBps": 300, "latency_us": 2.0},
            "nics": [
                {"name": "nic0", "gpus": [0, 1, 2, 3], "leaf": "leaf-1", "bw_GBps": 12, "latency_us": 2.0}
            ],
        },
        {
            "name": "n3",
            "gpu_model": "B",
            "gpus": 2,
            "nvlink": {"domain": "n3", "bw_GBps": 900, "latency_us": 1.0},
            "nics": [{"name": "nic0", "gpus": [0, 1], "leaf": "leaf-2", "bw_GBps": 50, "latency_us": 1.2}],
        },
        {
            "name": "n4",
            "gpu_model": "B",
            "gpus": 8,
            "nvlink": {"domain": "n4", "bw_GBps": 450, "latency_us": 2.5},
            "nics": [
                {"name": "nic0", "gpus": [0, 1, 2, 3], "leaf": "leaf-3", "bw_GBps": 50, "latency_us": 1.5},
                {"name": "nic1", "gpus": [4, 5, 6, 7], "leaf": "leaf-3", "bw_GBps": 100, "latency_us": 1.5},
            ],
        },
        {
            "name": "n5",
            "gpu_model": "B",
            "gpus": 4,
            "nvlink": {"domain": "n5", "bw_GBps": 450, "latency_us": 2.0},
            "nics": [
                {"name": "nic0", "gpus": [0, 1, 2, 3], "leaf": "leaf-4", "bw_GBps": 50, "latency_us": 1.5}
            ],
        },
        {
            "name": "n6",
            "gpu_model": "A",
            "gpus": 2,
            "standalone": True,
            "nvlink": {"domain": "n6", "bw_GBps": 300, "latency_us": 2.0},
        },
    ],
}


def hetero_spec() -> dict:
    return copy.deepcopy(HETERO_SPEC)


def job(
    gpus, tp=1, pp=1, dp=None, ep=1, comm=(), compute_ms=10.0, overlap=0.0, cp=1, microbatches=None, **extra
):
    """A loaded JobSpec; `comm` holds (group, collective, bytes[, count]) tuples."""
    dp = gpus // (tp * pp * cp) if dp is None else dp
    spec = {
        "version": 1,
        "name": "j",
        "gpus": gpus,
        "parallelism": {"tp": tp, "pp": pp, "dp": dp, "ep": ep} | ({"cp": cp} if cp > 1 else {}),
        "step": {"compute_ms": compute_ms, "overlap": overlap}
        | ({} if microbatches is None else {"microbatches": microbatches}),
        "comm": [
            {"group": c[0], "collective": c[1], "bytes": c[2], **({"count": c[3]} if len(c) > 3 else {})}
            for c in comm
        ],
    }
    spec.update(extra)
    return load_job(spec)


def switch_node_sets(topology) -> dict[str, set[frozenset[str]]]:
    """What a tree-shaped format holds, names aside: per tier, the set of node sets below each
    switch (a node counted under the leaf of its first NIC)."""
    from apps.placement.convert.tree import node_hierarchy

    below: dict[tuple[str, str], set[str]] = {}
    for node, chain in zip(topology.nodes, node_hierarchy(topology), strict=True):
        for tier, sw in zip(("leaf", "spine", "core"), chain, strict=True):
            if sw is not None:
                below.setdefault((tier, sw), set()).add(node.name)
    out: dict[str, set[frozenset[str]]] = {"leaf": set(), "spine": set(), "core": set()}
    for (tier, _), nodes in below.items():
        out[tier].add(frozenset(nodes))
    return out
