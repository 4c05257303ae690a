"""One node's inside as the node-level formats (nvidia-smi, NCCL) describe it, and nodes merged
into a cluster: GPU pairs by link class, NICs by PCIe distance to each GPU."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePath

from .base import MAX_NODES, Defaults, Imported, Source, assumed, cluster_spec, fail
from .hardware import GpuKind, gpu_kind, matches, nic_fabric, pair_links

# PCIe distance classes of nvidia-smi, nearest first.
PCIE_CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NV = re.compile(r"^NV(\d+)$")


@dataclass
class NodeHW:
    """A node's GPUs, the class of each GPU pair (`NV<links>` or a PCIe class), and its NICs with
    each one's class to every GPU; `where` says where each came from for messages."""

    name: str
    where: str
    gpus: int
    pairs: dict[tuple[int, int], str] = field(default_factory=dict)
    nics: list[str] = field(default_factory=list)
    nic_class: dict[tuple[str, int], str] = field(default_factory=dict)
    nic_bw_GBps: dict[str, float] = field(default_factory=dict)
    numa: dict[int, str] = field(default_factory=dict)
    nic_fabric: dict[str, str] = field(default_factory=dict)  # NIC -> ethernet | infiniband | efa
    nic_vendor: dict[str, str] = field(default_factory=dict)
    model: str = ""  # the GPU model the file names, if any
    kind: GpuKind | None = None  # the NVLink GPU model the file names, if any
    nvlink_known: bool = True  # False: the file cannot show NVLink (cloud VM dumps)
    nics_assumed: bool = False  # the file showed no NICs; nics_per_node made them
    link_GBps: float = 0.0  # GB/s per NVLink when the GPU model says (else nvlink_link_GBps)


def nv_links(cls: str) -> int:
    """Number of bonded NVLinks of a pair class (0 for a PCIe class)."""
    m = _NV.match(cls)
    return int(m.group(1)) if m else 0


def node_name(source: Source) -> str:
    """The node a per-node file describes: `NAME=path` on the command line, else the file's stem."""
    return source.node or PurePath(source.name).stem


def assign_nics(hw: NodeHW) -> dict[str, list[int]]:
    """Each GPU's NIC: the nearest by PCIe class, the least loaded among equals; NICs that serve
    no GPU are left out."""
    load: dict[str, list[int]] = {n: [] for n in hw.nics}
    for g in range(hw.gpus):
        rank = {n: PCIE_CLASSES.index(hw.nic_class.get((n, g), "SYS")) for n in hw.nics}
        best = min(rank.values())
        nearest = [n for n in hw.nics if rank[n] == best]
        choice = min(nearest, key=lambda n: len(load[n]))
        load[choice].append(g)
    return {n: gs for n, gs in load.items() if gs}


def select_rails(hw: NodeHW, defaults: Defaults, notes: list[str]) -> None:
    """Keep the NICs that are fabric rails: those matching the `nics` patterns when given, else
    all but the Ethernet front ends of a node whose other NICs are InfiniBand or EFA."""
    if "nics" in defaults.given:
        patterns = defaults.take("nics")
        keep = [n for n in hw.nics if matches(n, patterns)]
        if not keep:
            raise fail(
                hw.where, f"no NIC of node {hw.name!r} matches nics={patterns!r}; it has {', '.join(hw.nics)}"
            )
        why = f"not in nics={patterns}"
    else:
        fabric = {n: hw.nic_fabric.get(n) or nic_fabric(n) for n in hw.nics}
        rails = [n for n in hw.nics if fabric[n] != "ethernet"]
        keep = rails if rails else hw.nics
        why = "Ethernet/RoCE front end (the other NICs are the fabric); set nics=PATTERNS to choose"
    dropped = [n for n in hw.nics if n not in keep]
    if dropped:
        notes.append(f"{hw.name}: NICs {', '.join(dropped)} left out: {why}")
        hw.nics = keep


def nodes_to_spec(nodes: list[NodeHW], defaults: Defaults) -> Imported:
    """A cluster of the given nodes: NIC k of every node on leaf k (rails) or all on one leaf,
    leaves joined by one spine; NVLink domains per node from the pair classes."""
    notes: list[str] = []
    seen: dict[str, str] = {}
    spec_nodes = []
    origins: dict[str, str] = {}
    models: dict[str, float] = {}
    rails = defaults.take("rails")
    n_leaves = 1
    unpriced_nics = 0
    default_model = 0
    if len(nodes) > MAX_NODES:
        raise fail("input", f"more than {MAX_NODES} node files")
    for hw in nodes:
        if hw.name in seen:
            raise fail(hw.where, f"node {hw.name!r} is already described by {seen[hw.name]}")
        seen[hw.name] = hw.where
        select_rails(hw, defaults, notes)
        served = assign_nics(hw)
        if not served:
            raise fail(hw.where, f"node {hw.name!r} has no NIC; spec v1 needs one per GPU")
        unused = [n for n in hw.nics if n not in served]
        if unused:
            notes.append(
                f"{hw.name}: NICs {', '.join(unused)} are nearer to no GPU than the others; left out"
            )
        nics = []
        for k, (nic, gpus) in enumerate(served.items()):
            bw = hw.nic_bw_GBps.get(nic)
            if not bw:
                bw = defaults.take("nic_bw_GBps")
                unpriced_nics += 1
            leaf = f"leaf-{k + 1}" if rails else "leaf-1"
            n_leaves = max(n_leaves, k + 1 if rails else 1)
            nics.append(
                {
                    "name": nic,
                    "gpus": gpus,
                    "leaf": leaf,
                    "bw_GBps": bw,
                    "latency_us": defaults.take("nic_latency_us"),
                }
            )
        kind = nvlink_fallback(hw, defaults, notes)
        if "gpu_model" in defaults.given or not (hw.model or kind):
            model = defaults.take("gpu_model")
            default_model += "gpu_model" not in defaults.given
        else:
            model = kind.model if kind else hw.model
        if model not in models:
            known = kind is not None and "peak_tflops" not in defaults.given
            models[model] = kind.peak_tflops if known else defaults.take("peak_tflops")
        bw, lat, what = _domain(hw, defaults)
        entry = {
            "name": hw.name,
            "gpu_model": model,
            "gpus": hw.gpus,
            "nvlink": {"domain": hw.name, "bw_GBps": bw, "latency_us": lat},
            "nics": nics,
        }
        if what != "nvlink":
            entry["intra"] = intra_spec(hw, [c["name"] for c in nics], defaults)
            entry["nvlink"]["bw_GBps"] = max(c["bw_GBps"] for c in entry["intra"]["classes"].values())
            notes.append(f"{hw.name}: {what}; GPU pairs described by link class (intra)")
        origins[f"nodes[{len(spec_nodes)}]"] = hw.where
        spec_nodes.append(entry)
    leaves = [f"leaf-{k + 1}" for k in range(n_leaves)]
    switches = [{"name": lf, "tier": "leaf"} for lf in leaves]
    links = []
    if n_leaves > 1:
        switches.append({"name": "spine-1", "tier": "spine"})
        links = [
            {
                "a": lf,
                "b": "spine-1",
                "bw_GBps": defaults.take("uplink_bw_GBps"),
                "latency_us": defaults.take("uplink_latency_us"),
            }
            for lf in leaves
        ]
    notes.append(
        "NIC k of each node is cabled to leaf-k+1 (rails), leaves joined by spine-1"
        if n_leaves > 1
        else "every NIC is cabled to leaf-1"
    )
    assumed(
        notes, defaults, "nic_bw_GBps", "{} GB/s per NIC", unpriced_nics, "NICs without a speed in the file"
    )
    assumed(notes, defaults, "gpu_model", "GPU model {}", default_model, "nodes naming none")
    return cluster_spec(defaults, models, switches, links, spec_nodes, notes, origins)


def nvlink_fallback(hw: NodeHW, defaults: Defaults, notes: list[str]) -> GpuKind | None:
    """When the file shows no NVLink, take it from `nvlink_bw_GBps` (given), else from the GPU
    model (the file's, or a given `gpu_model`) when it is an SXM/NVSwitch part. Returns the
    node's NVLink GPU model, if known."""
    kind = hw.kind
    if "gpu_model" in defaults.given:
        kind = gpu_kind(model=defaults.gpu_model)
    elif kind is None and hw.model:
        kind = gpu_kind(model=hw.model)
    if kind is not None and "nvlink_link_GBps" not in defaults.given:
        hw.link_GBps = kind.link_GBps
    if hw.nvlink_known or any(nv_links(c) for c in hw.pairs.values()):
        return kind
    what = "this file has no NVLink information"
    n = hw.gpus
    if "nvlink_bw_GBps" in defaults.given and n > 1:
        links = max(1, round(defaults.nvlink_bw_GBps / defaults.take("nvlink_link_GBps")))
        hw.link_GBps = defaults.nvlink_bw_GBps / links
        for i in range(n):
            for j in range(n):
                if i != j:
                    hw.pairs[(i, j)] = f"NV{links}"
        notes.append(f"{hw.name}: {what}; NVLink from nvlink_bw_GBps={defaults.nvlink_bw_GBps}")
    elif kind is not None and n > 1:
        for i in range(n):
            for j in range(n):
                k = pair_links(kind, n, i, j) if i != j else 0
                if k:
                    hw.pairs[(i, j)] = f"NV{k}"
        notes.append(
            f"{hw.name}: {what}; NVLink taken from the GPU model {kind.model} "
            f"({kind.links} links of {kind.link_GBps:g} GB/s per GPU, {kind.fabric})"
        )
    elif n > 1:
        notes.append(
            f"{hw.name}: {what}; its GPU pairs are priced as PCIe. Set gpu_model to an SXM model "
            "(A100/H100/H200/B200 SXM, V100 SXM2) or nvlink_bw_GBps if the machine has NVLink"
        )
    return kind


def _domain(hw: NodeHW, defaults: Defaults) -> tuple[float, float, str]:
    """(bw_GBps, latency_us, what) of the node's one domain: its slowest NVLink pair when every
    pair has NVLink, else PCIe (and the pairs go into `intra`)."""
    links = [nv_links(hw.pairs.get((i, j), "SYS")) for i in range(hw.gpus) for j in range(i + 1, hw.gpus)]
    if links and min(links) > 0:
        rate = hw.link_GBps or defaults.take("nvlink_link_GBps")
        return min(links) * rate, defaults.take("nvlink_latency_us"), "nvlink"
    kind = "NVLink between some GPU pairs only" if any(links) else "no NVLink (PCIe only)"
    return defaults.take("pcie_bw_GBps"), defaults.take("pcie_latency_us"), kind


# Share of pcie_bw_GBps a GPU pair or GPU-NIC path of each PCIe class gets: peer traffic through
# the CPU's root complex (PHB, NODE) or across sockets (SYS) is slower than under one switch.
# Assumed, not measured; an operator can put measured values in the spec's `intra.classes`.
PCIE_CLASS_SHARE = {"PIX": 1.0, "PXB": 0.9, "PHB": 0.6, "NODE": 0.5, "SYS": 0.35}


def intra_spec(hw: NodeHW, nics: list[str], defaults: Defaults) -> dict:
    """The spec's `intra` block of a node: its pair classes, their bandwidths and latencies, and
    the class from each of its NICs to each GPU."""
    links = [["X" if i == j else hw.pairs[(i, j)] for j in range(hw.gpus)] for i in range(hw.gpus)]
    nic_links = {n: [hw.nic_class.get((n, g), "SYS") for g in range(hw.gpus)] for n in nics}
    used = sorted({c for row in links for c in row if c != "X"} | {c for r in nic_links.values() for c in r})
    classes = {}
    for c in used:
        k = nv_links(c)
        if k:
            rate = hw.link_GBps or defaults.take("nvlink_link_GBps")
            bw, lat = k * rate, defaults.take("nvlink_latency_us")
        else:
            bw, lat = PCIE_CLASS_SHARE[c] * defaults.take("pcie_bw_GBps"), defaults.take("pcie_latency_us")
        classes[c] = {"bw_GBps": round(bw, 3), "latency_us": lat}
    return {"links": links, "classes": classes, "nic_links": nic_links}
