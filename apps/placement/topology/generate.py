"""The `generate:` form: expand a generator block into the full spec form."""

from __future__ import annotations

from typing import Any

from .checks import _bw, _check_keys, _count, _Errors, _latency, _name, _positive
from .model import SHAPES
from .ranges import (
    GPU_MODEL_HELP,
    GPU_MODEL_RE,
    MAX_CLUSTER_GPUS,
    MAX_GEN_NODES_PER_LEAF,
    MAX_GEN_PODS,
    MAX_GEN_SWITCHES,
    MAX_LINKS,
    MAX_NODE_GPUS,
    MAX_NODE_NICS,
    MAX_NODES,
    MAX_NVLINK_DOMAIN_NODES,
    MAX_PEAK_TFLOPS,
    MAX_SWITCHES,
    MIN_PEAK_TFLOPS,
)
from .safeload import cut

_GEN_REQUIRED = {
    "shape",
    "spines",
    "leaves",
    "nodes_per_leaf",
    "gpus_per_node",
    "gpu_model",
    "peak_tflops",
    "nvlink_bw_GBps",
    "nic_bw_GBps",
    "nics_per_node",
    "uplink_bw_GBps",
}
_GEN_OPTIONAL = {
    "pods",
    "cores",
    "core_uplink_bw_GBps",
    "nvlink_domain_nodes",
    "nvlink_latency_us",
    "nic_latency_us",
    "uplink_latency_us",
    "core_uplink_latency_us",
    "nvls",
}


def generate_spec(name: str, gen: Any) -> dict:
    """Expand a `generate:` block into the full spec form (a plain dict).

    The counts of nodes, GPUs, switches and links it would make are checked against the cluster
    limits (`ranges`) before anything is generated; SpecError names the field to shrink.
    """
    errs = _Errors()
    if not _check_keys(errs, "generate", gen, _GEN_REQUIRED, _GEN_OPTIONAL):
        errs.raise_if_any()
    shape = gen["shape"]
    if shape not in SHAPES:
        errs.add("generate.shape", f"must be one of {', '.join(SHAPES)}, got {cut(shape)}")
    spines = _count(errs, "generate.spines", gen["spines"], maximum=MAX_GEN_SWITCHES)
    leaves = _count(errs, "generate.leaves", gen["leaves"], maximum=MAX_GEN_SWITCHES)
    per_leaf = _count(errs, "generate.nodes_per_leaf", gen["nodes_per_leaf"], maximum=MAX_GEN_NODES_PER_LEAF)
    gpn = _count(errs, "generate.gpus_per_node", gen["gpus_per_node"], maximum=MAX_NODE_GPUS)
    model = _name(errs, "generate.gpu_model", gen["gpu_model"], pattern=GPU_MODEL_RE, help=GPU_MODEL_HELP)
    peak = _positive(
        errs, "generate.peak_tflops", gen["peak_tflops"], minimum=MIN_PEAK_TFLOPS, maximum=MAX_PEAK_TFLOPS
    )
    nvbw = _bw(errs, "generate.nvlink_bw_GBps", gen["nvlink_bw_GBps"])
    nicbw = _bw(errs, "generate.nic_bw_GBps", gen["nic_bw_GBps"])
    nics = _count(errs, "generate.nics_per_node", gen["nics_per_node"], maximum=MAX_NODE_NICS)
    upbw = _bw(errs, "generate.uplink_bw_GBps", gen["uplink_bw_GBps"])
    pods = _count(errs, "generate.pods", gen.get("pods", 1), maximum=MAX_GEN_PODS)
    cores = _count(errs, "generate.cores", gen.get("cores", 0), minimum=0, maximum=MAX_GEN_SWITCHES)
    core_bw = _bw(errs, "generate.core_uplink_bw_GBps", gen.get("core_uplink_bw_GBps", upbw))
    dom_nodes = _count(
        errs,
        "generate.nvlink_domain_nodes",
        gen.get("nvlink_domain_nodes", 1),
        maximum=MAX_NVLINK_DOMAIN_NODES,
    )
    nvlat = _latency(errs, "generate.nvlink_latency_us", gen.get("nvlink_latency_us", 2.0))
    nvls = gen.get("nvls")
    if nvls is not None and not isinstance(nvls, bool):
        errs.add("generate.nvls", f"must be true or false, got {nvls!r}"[:200])
        nvls = None
    niclat = _latency(errs, "generate.nic_latency_us", gen.get("nic_latency_us", 1.5))
    uplat = _latency(errs, "generate.uplink_latency_us", gen.get("uplink_latency_us", 1.0))
    corelat = _latency(errs, "generate.core_uplink_latency_us", gen.get("core_uplink_latency_us", 1.0))
    if gpn % nics:
        errs.add("generate.nics_per_node", f"must divide gpus_per_node ({gpn}), got {nics}")
    if shape == "rail-optimized" and leaves % nics:
        errs.add("generate.leaves", f"must be a multiple of nics_per_node ({nics}) for rail-optimized")
    if pods > 1 and cores == 0:
        errs.add("generate.cores", "must be at least 1 when pods > 1")
    errs.raise_if_any()
    _check_totals(errs, shape, spines, leaves, per_leaf, gpn, nics, pods, cores)
    errs.raise_if_any()

    units = leaves // nics if shape == "rail-optimized" else leaves
    n_nodes = pods * units * per_leaf
    if n_nodes % dom_nodes:
        errs.add("generate.nvlink_domain_nodes", f"must divide the node count ({n_nodes})")
        errs.raise_if_any()
    width = max(3, len(str(n_nodes)))
    per_nic = gpn // nics
    switches: list[dict] = []
    links: list[dict] = []
    nodes: list[dict] = []
    for c in range(1, cores + 1):
        switches.append({"name": f"core-{c}", "tier": "core"})
    node_no = 0
    for p in range(pods):
        spine_names = [f"spine-{p * spines + s + 1}" for s in range(spines)]
        switches += [{"name": s, "tier": "spine"} for s in spine_names]
        for s in spine_names:
            for c in range(1, cores + 1):
                links.append({"a": s, "b": f"core-{c}", "bw_GBps": core_bw, "latency_us": corelat})
        leaf_names = [f"leaf-{p * leaves + i + 1}" for i in range(leaves)]
        switches += [{"name": lf, "tier": "leaf"} for lf in leaf_names]
        for lf in leaf_names:
            for s in spine_names:
                links.append({"a": lf, "b": s, "bw_GBps": upbw, "latency_us": uplat})
        for u in range(units):
            for _ in range(per_leaf):
                node_no += 1
                nname = f"node-{node_no:0{width}d}"
                first = (node_no - 1) // dom_nodes * dom_nodes + 1
                nic_list = []
                for k in range(nics):
                    leaf = leaf_names[u] if shape == "leaf-spine" else leaf_names[u * nics + k]
                    nic_list.append(
                        {
                            "name": f"mlx5_{k}",
                            "gpus": list(range(k * per_nic, (k + 1) * per_nic)),
                            "leaf": leaf,
                            "bw_GBps": nicbw,
                            "latency_us": niclat,
                        }
                    )
                nodes.append(
                    {
                        "name": nname,
                        "gpu_model": model,
                        "gpus": gpn,
                        "nvlink": {
                            "domain": f"node-{first:0{width}d}",
                            "bw_GBps": nvbw,
                            "latency_us": nvlat,
                        }
                        | ({} if nvls is None else {"nvls": nvls}),
                        "nics": nic_list,
                    }
                )
    return {
        "version": 1,
        "name": name,
        "gpu_models": {model: {"peak_tflops": peak}},
        "switches": switches,
        "links": links,
        "nodes": nodes,
    }


def _check_totals(
    errs: _Errors,
    shape: str,
    spines: int,
    leaves: int,
    per_leaf: int,
    gpn: int,
    nics: int,
    pods: int,
    cores: int,
) -> None:
    """What the block would generate, against the cluster limits, from the counts alone."""
    units = leaves // nics if shape == "rail-optimized" else leaves
    n_nodes = pods * units * per_leaf
    totals = (
        ("generate.nodes_per_leaf", "nodes", n_nodes, MAX_NODES),
        ("generate.gpus_per_node", "GPUs", n_nodes * gpn, MAX_CLUSTER_GPUS),
        ("generate.leaves", "switches", cores + pods * (spines + leaves), MAX_SWITCHES),
        ("generate.spines", "links", pods * spines * (leaves + cores), MAX_LINKS),
    )
    for field, what, count, limit in totals:
        if count > limit:
            errs.add(
                field,
                f"would generate {count} {what}; the limit is {limit} (pods={pods}, spines={spines},"
                f" leaves={leaves}, nodes_per_leaf={per_leaf}, gpus_per_node={gpn}, cores={cores})",
            )
