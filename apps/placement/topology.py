"""Topology spec v1: load, validate and generate clusters, and the GPU-pair path model.

`load_topology(data)` takes a parsed spec (full or `generate:` form) and returns an immutable
`Topology`; `topology_to_spec(topo)` gives the full form back. GPUs are numbered 0..n_gpus-1
node by node in file order ("gid"); `Topology.path(g, h)` is O(1) after an O(GPUs) index.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

LEVELS = ("nvlink", "leaf", "spine", "core")
LEVEL_RANK = {name: i for i, name in enumerate(LEVELS)}
TIERS = ("leaf", "spine", "core")
SHAPES = ("leaf-spine", "rail-optimized")


class SpecError(ValueError):
    """A spec that breaks the rules; `errors` lists (field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = list(errors)
        super().__init__("; ".join(f"{path}: {msg}" if path else msg for path, msg in self.errors))

    def as_dict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for path, msg in self.errors:
            out.setdefault(path or "non_field_errors", []).append(msg)
        return out


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    peak_tflops: float


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    tier: str


@dataclass(frozen=True, slots=True)
class Link:
    a: str
    b: str
    bw_GBps: float
    latency_us: float


@dataclass(frozen=True, slots=True)
class Nic:
    name: str
    gpus: tuple[int, ...]
    leaf: str
    bw_GBps: float
    latency_us: float


@dataclass(frozen=True, slots=True)
class NvlinkDomain:
    name: str
    bw_GBps: float
    latency_us: float
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_model: str
    gpus: int
    domain: str
    nics: tuple[Nic, ...]
    dcgm_url: str | None = None
    standalone: bool = False


@dataclass(frozen=True, slots=True)
class Path:
    bw_GBps: float
    latency_us: float
    level: str


@dataclass(frozen=True, eq=False)
class Topology:
    """An immutable cluster with per-GPU index arrays (all indexed by gid)."""

    name: str
    gpu_models: Mapping[str, GpuModel]
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    nodes: tuple[Node, ...]
    domains: Mapping[str, NvlinkDomain]
    # Per-GPU arrays, length n_gpus.
    gpu_node: np.ndarray = field(repr=False)  # node index
    gpu_index: np.ndarray = field(repr=False)  # index on its node
    gpu_domain: np.ndarray = field(repr=False)  # NVLink domain index
    gpu_leaf: np.ndarray = field(repr=False)  # leaf index of its NIC, -1 if standalone
    gpu_pod: np.ndarray = field(repr=False)  # spine group ("pod") index of its leaf, -1
    gpu_plane: np.ndarray = field(repr=False)  # core-connected group index, -1
    gpu_nic_bw: np.ndarray = field(repr=False)  # GB/s of its NIC, 0 if standalone
    gpu_nic_latency: np.ndarray = field(repr=False)
    gpu_rail: np.ndarray = field(repr=False)  # index of its NIC on the node
    # Per-domain, per-leaf, per-pod arrays.
    domain_names: tuple[str, ...] = field(repr=False)
    domain_bw: np.ndarray = field(repr=False)
    domain_latency: np.ndarray = field(repr=False)
    leaf_names: tuple[str, ...] = field(repr=False)
    leaf_spine_bw: np.ndarray = field(repr=False)  # what one flow can use leaf->spine, GB/s
    leaf_spine_latency: np.ndarray = field(repr=False)
    leaf_uplink_total_bw: np.ndarray = field(repr=False)  # sum of all leaf->spine links, GB/s
    leaf_pod: np.ndarray = field(repr=False)
    pod_core_bw: np.ndarray = field(repr=False)
    pod_core_latency: np.ndarray = field(repr=False)
    # Per-node arrays.
    node_first_gid: np.ndarray = field(repr=False)
    node_gpu_count: np.ndarray = field(repr=False)
    node_domain: np.ndarray = field(repr=False)
    node_leaf: np.ndarray = field(repr=False)  # leaf of the node's first NIC, -1 standalone
    node_peak_tflops: np.ndarray = field(repr=False)

    @property
    def n_gpus(self) -> int:
        return int(self.gpu_node.shape[0])

    @cached_property
    def node_by_name(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def leaf_by_name(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.leaf_names)}

    def gid(self, node: str, index: int) -> int:
        """Global GPU id of GPU `index` on `node`; KeyError if there is none."""
        i = self.node_by_name[node]
        if not 0 <= index < int(self.node_gpu_count[i]):
            raise KeyError(f"{node} has no GPU {index}")
        return int(self.node_first_gid[i]) + index

    def gpu_key(self, gid: int) -> tuple[str, int]:
        """(node name, GPU index) of a gid."""
        return self.nodes[int(self.gpu_node[gid])].name, int(self.gpu_index[gid])

    def peak_tflops(self, gid: int) -> float:
        return float(self.node_peak_tflops[int(self.gpu_node[gid])])

    def free_mask(self, busy: list[tuple[str, int]] | None = None) -> np.ndarray:
        """Boolean array, True for free GPUs, from (node, index) pairs that are busy."""
        mask = np.ones(self.n_gpus, dtype=bool)
        for node, index in busy or ():
            mask[self.gid(node, index)] = False
        return mask

    def level(self, g: int, h: int) -> str:
        return self.path(g, h).level

    def path(self, g: int, h: int) -> Path:
        """Bandwidth (GB/s), latency (us) and level of the path between GPUs g and h."""
        dg, dh = self.gpu_domain[g], self.gpu_domain[h]
        if dg == dh:
            return Path(float(self.domain_bw[dg]), float(self.domain_latency[dg]), "nvlink")
        lg, lh = self.gpu_leaf[g], self.gpu_leaf[h]
        if lg < 0 or lh < 0:
            return Path(0.0, math.inf, "core")
        bw = min(self.gpu_nic_bw[g], self.gpu_nic_bw[h])
        lat = self.gpu_nic_latency[g] + self.gpu_nic_latency[h]
        if lg == lh:
            return Path(float(bw), float(lat), "leaf")
        bw = min(bw, self.leaf_spine_bw[lg], self.leaf_spine_bw[lh])
        lat += self.leaf_spine_latency[lg] + self.leaf_spine_latency[lh]
        pg, ph = self.leaf_pod[lg], self.leaf_pod[lh]
        if pg == ph:
            return Path(float(bw), float(lat), "spine")
        bw = min(bw, self.pod_core_bw[pg], self.pod_core_bw[ph])
        lat += self.pod_core_latency[pg] + self.pod_core_latency[ph]
        return Path(float(bw), float(lat), "core")

    def group_path(self, gids) -> Path:
        """The bottleneck path of a group, in O(len(gids)) from the hierarchy: the bandwidth
        (GB/s) and level of its slowest member pair, exactly; the latency (us) sums the slowest
        components it crosses (two NICs, uplinks), an upper bound on its slowest pair's latency that
        is exact when each tier's latencies are uniform."""
        g = np.asarray(gids, dtype=np.int64)
        if g.size < 2:
            d = self.gpu_domain[g[0]] if g.size else 0
            return Path(float(self.domain_bw[d]), 0.0, "nvlink")
        doms = self.gpu_domain[g]
        if (doms == doms[0]).all():
            d = doms[0]
            return Path(float(self.domain_bw[d]), float(self.domain_latency[d]), "nvlink")
        leaves = self.gpu_leaf[g]
        if (leaves < 0).any():
            return Path(0.0, math.inf, "core")
        # Every member has a partner in another domain, so every member's NIC is on some path.
        bw = float(self.gpu_nic_bw[g].min())
        nic_lat = np.sort(self.gpu_nic_latency[g])
        lat = float(nic_lat[-1] + nic_lat[-2])
        # Domains holding two or more members also carry an NVLink pair.
        ud, counts = np.unique(doms, return_counts=True)
        dom_lat = 0.0
        if (counts > 1).any():
            bw = min(bw, float(self.domain_bw[ud[counts > 1]].min()))
            dom_lat = float(self.domain_latency[ud[counts > 1]].max())
        ul = np.unique(leaves)
        if ul.size == 1:
            return Path(bw, max(lat, dom_lat), "leaf")
        bw = min(bw, float(self.leaf_spine_bw[ul].min()))
        lat += 2 * float(self.leaf_spine_latency[ul].max())
        pods = np.unique(self.leaf_pod[ul])
        if pods.size == 1:
            return Path(bw, max(lat, dom_lat), "spine")
        bw = min(bw, float(self.pod_core_bw[pods].min()))
        lat += 2 * float(self.pod_core_latency[pods].max())
        return Path(bw, max(lat, dom_lat), "core")


# --------------------------------------------------------------------------- validation helpers


class _Errors:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, msg: str) -> None:
        self.items.append((path, msg))

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)


def _check_keys(
    errs: _Errors, path: str, obj: Any, required: set[str], optional: set[str] = frozenset()
) -> bool:
    if not isinstance(obj, Mapping):
        errs.add(path, f"must be a mapping, got {type(obj).__name__}")
        return False
    for k in obj:
        if k not in required and k not in optional:
            errs.add(f"{path}.{k}" if path else str(k), "unknown field")
    ok = True
    for k in sorted(required):
        if k not in obj:
            errs.add(f"{path}.{k}" if path else k, "required field is missing")
            ok = False
    return ok


def _positive(errs: _Errors, path: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        errs.add(path, f"must be a number, got {value!r}")
        return 1.0
    if value < 0 or (value == 0 and not allow_zero):
        errs.add(path, f"must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
        return 1.0
    return float(value)


def _count(errs: _Errors, path: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(path, f"must be a whole number, got {value!r}")
        return minimum
    if value < minimum:
        errs.add(path, f"must be at least {minimum}, got {value}")
        return minimum
    return value


def _name(errs: _Errors, path: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        errs.add(path, f"must be a non-empty string, got {value!r}")
        return f"<invalid {path}>"
    return value


# --------------------------------------------------------------------------- generator

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
}


def generate_spec(name: str, gen: Any) -> dict:
    """Expand a `generate:` block into the full spec form (a plain dict)."""
    errs = _Errors()
    if not _check_keys(errs, "generate", gen, _GEN_REQUIRED, _GEN_OPTIONAL):
        errs.raise_if_any()
    shape = gen["shape"]
    if shape not in SHAPES:
        errs.add("generate.shape", f"must be one of {', '.join(SHAPES)}, got {shape!r}")
    spines = _count(errs, "generate.spines", gen["spines"])
    leaves = _count(errs, "generate.leaves", gen["leaves"])
    per_leaf = _count(errs, "generate.nodes_per_leaf", gen["nodes_per_leaf"])
    gpn = _count(errs, "generate.gpus_per_node", gen["gpus_per_node"])
    model = _name(errs, "generate.gpu_model", gen["gpu_model"])
    peak = _positive(errs, "generate.peak_tflops", gen["peak_tflops"])
    nvbw = _positive(errs, "generate.nvlink_bw_GBps", gen["nvlink_bw_GBps"])
    nicbw = _positive(errs, "generate.nic_bw_GBps", gen["nic_bw_GBps"])
    nics = _count(errs, "generate.nics_per_node", gen["nics_per_node"])
    upbw = _positive(errs, "generate.uplink_bw_GBps", gen["uplink_bw_GBps"])
    pods = _count(errs, "generate.pods", gen.get("pods", 1))
    cores = _count(errs, "generate.cores", gen.get("cores", 0), minimum=0)
    core_bw = _positive(errs, "generate.core_uplink_bw_GBps", gen.get("core_uplink_bw_GBps", upbw))
    dom_nodes = _count(errs, "generate.nvlink_domain_nodes", gen.get("nvlink_domain_nodes", 1))
    nvlat = _positive(errs, "generate.nvlink_latency_us", gen.get("nvlink_latency_us", 2.0))
    niclat = _positive(errs, "generate.nic_latency_us", gen.get("nic_latency_us", 1.5))
    uplat = _positive(errs, "generate.uplink_latency_us", gen.get("uplink_latency_us", 1.0))
    corelat = _positive(errs, "generate.core_uplink_latency_us", gen.get("core_uplink_latency_us", 1.0))
    if gpn % nics:
        errs.add("generate.nics_per_node", f"must divide gpus_per_node ({gpn}), got {nics}")
    if shape == "rail-optimized" and leaves % nics:
        errs.add("generate.leaves", f"must be a multiple of nics_per_node ({nics}) for rail-optimized")
    if pods > 1 and cores == 0:
        errs.add("generate.cores", "must be at least 1 when pods > 1")
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
                        },
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


# --------------------------------------------------------------------------- loader


def load_topology(data: Any) -> Topology:
    """Validate a parsed spec v1 (full or `generate:` form) and build the Topology.

    Raises SpecError naming every offending entry and field.
    """
    errs = _Errors()
    if not isinstance(data, Mapping):
        raise SpecError([("", f"a topology spec must be a mapping, got {type(data).__name__}")])
    if "generate" in data:
        _check_keys(errs, "", data, {"version", "name", "generate"})
        _check_version(errs, data)
        errs.raise_if_any()
        data = generate_spec(_name(errs, "name", data["name"]), data["generate"])
    _check_keys(errs, "", data, {"version", "name", "gpu_models", "switches", "nodes"}, {"links"})
    errs.raise_if_any()
    _check_version(errs, data)
    name = _name(errs, "name", data["name"])

    gpu_models: dict[str, GpuModel] = {}
    if not isinstance(data["gpu_models"], Mapping):
        errs.add("gpu_models", "must be a mapping of model name to {peak_tflops}")
    else:
        for mname, m in data["gpu_models"].items():
            p = f"gpu_models.{mname}"
            if _check_keys(errs, p, m, {"peak_tflops"}):
                gpu_models[str(mname)] = GpuModel(
                    str(mname), _positive(errs, f"{p}.peak_tflops", m["peak_tflops"])
                )

    switches: list[Switch] = []
    tier_of: dict[str, str] = {}
    for i, s in enumerate(_list(errs, "switches", data["switches"])):
        p = f"switches[{i}]"
        if not _check_keys(errs, p, s, {"name", "tier"}):
            continue
        sname = _name(errs, f"{p}.name", s["name"])
        if not isinstance(s["tier"], str) or s["tier"] not in TIERS:
            errs.add(f"{p}.tier", f"must be one of {', '.join(TIERS)}, got {s['tier']!r}")
        if sname in tier_of:
            errs.add(f"{p}.name", f"duplicate switch name {sname!r}")
            continue
        tier_of[sname] = s["tier"]
        switches.append(Switch(sname, s["tier"]))

    links: list[Link] = []
    for i, lk in enumerate(_list(errs, "links", data.get("links") or [])):
        p = f"links[{i}]"
        if not _check_keys(errs, p, lk, {"a", "b", "bw_GBps", "latency_us"}):
            continue
        a, b = _name(errs, f"{p}.a", lk["a"]), _name(errs, f"{p}.b", lk["b"])
        for end, sw in (("a", a), ("b", b)):
            if sw not in tier_of:
                errs.add(f"{p}.{end}", f"unknown switch {sw!r}")
        if a == b:
            errs.add(f"{p}.b", "a link must join two different switches")
        elif tier_of.get(a) in TIERS and tier_of.get(b) in TIERS:
            ta, tb = TIERS.index(tier_of[a]), TIERS.index(tier_of[b])
            if abs(ta - tb) != 1:
                errs.add(
                    p, f"links join adjacent tiers (leaf-spine or spine-core), not {tier_of[a]}-{tier_of[b]}"
                )
        links.append(
            Link(
                a,
                b,
                _positive(errs, f"{p}.bw_GBps", lk["bw_GBps"]),
                _positive(errs, f"{p}.latency_us", lk["latency_us"]),
            )
        )

    nodes: list[Node] = []
    domains: dict[str, dict] = {}
    node_names: set[str] = set()
    for i, n in enumerate(_list(errs, "nodes", data["nodes"])):
        node = _load_node(errs, f"nodes[{i}]", n, gpu_models, tier_of, domains)
        if node is None:
            continue
        if node.name in node_names:
            errs.add(f"nodes[{i}].name", f"duplicate node name {node.name!r}")
            continue
        node_names.add(node.name)
        nodes.append(node)
    if not nodes and not errs.items:
        errs.add("nodes", "a cluster needs at least one node")
    errs.raise_if_any()
    return _build(name, gpu_models, switches, links, nodes, domains, errs)


def _check_version(errs: _Errors, data: Mapping) -> None:
    if data.get("version") != 1:
        errs.add("version", f"must be 1, got {data.get('version')!r}")


def _list(errs: _Errors, path: str, value: Any) -> list:
    if not isinstance(value, list):
        errs.add(path, f"must be a list, got {type(value).__name__}")
        return []
    return value


def _load_node(errs, p, n, gpu_models, tier_of, domains) -> Node | None:
    if not _check_keys(
        errs, p, n, {"name", "gpu_model", "gpus", "nvlink"}, {"nics", "dcgm_url", "standalone"}
    ):
        return None
    nname = _name(errs, f"{p}.name", n["name"])
    if not isinstance(n["gpu_model"], str) or n["gpu_model"] not in gpu_models:
        errs.add(f"{p}.gpu_model", f"unknown GPU model {n['gpu_model']!r}")
    gpus = _count(errs, f"{p}.gpus", n["gpus"])
    standalone = n.get("standalone", False)
    if not isinstance(standalone, bool):
        errs.add(f"{p}.standalone", "must be true or false")
        standalone = False
    dcgm = n.get("dcgm_url")
    if dcgm is not None and (not isinstance(dcgm, str) or not dcgm.startswith(("http://", "https://"))):
        errs.add(f"{p}.dcgm_url", f"must be an http(s) URL, got {dcgm!r}")
    nv = n["nvlink"]
    domain = nname
    if _check_keys(errs, f"{p}.nvlink", nv, {"domain", "bw_GBps", "latency_us"}):
        domain = _name(errs, f"{p}.nvlink.domain", nv["domain"])
        bw = _positive(errs, f"{p}.nvlink.bw_GBps", nv["bw_GBps"])
        lat = _positive(errs, f"{p}.nvlink.latency_us", nv["latency_us"])
        d = domains.setdefault(domain, {"bw": bw, "lat": lat, "nodes": []})
        if (d["bw"], d["lat"]) != (bw, lat):
            errs.add(
                f"{p}.nvlink",
                f"domain {domain!r} already has bw_GBps {d['bw']} and latency_us {d['lat']}; a domain's GPUs share one value",
            )
        d["nodes"].append(nname)
    nics: list[Nic] = []
    served: dict[int, str] = {}
    nic_names: set[str] = set()
    for k, c in enumerate(_list(errs, f"{p}.nics", n.get("nics") or [])):
        q = f"{p}.nics[{k}]"
        if not _check_keys(errs, q, c, {"name", "gpus", "leaf", "bw_GBps", "latency_us"}):
            continue
        cname = _name(errs, f"{q}.name", c["name"])
        if cname in nic_names:
            errs.add(f"{q}.name", f"duplicate NIC name {cname!r} on node {nname!r}")
        nic_names.add(cname)
        if not isinstance(c["leaf"], str) or tier_of.get(c["leaf"]) != "leaf":
            errs.add(f"{q}.leaf", f"unknown leaf switch {c['leaf']!r}")
        idx = c["gpus"]
        if not isinstance(idx, list) or not idx:
            errs.add(f"{q}.gpus", "must be a non-empty list of GPU indices")
            idx = []
        for g in idx:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < gpus:
                errs.add(f"{q}.gpus", f"GPU index {g!r} is not on this node (0..{gpus - 1})")
            elif g in served:
                errs.add(f"{q}.gpus", f"GPU {g} is already served by NIC {served[g]!r}; one NIC per GPU")
            else:
                served[g] = cname
        nics.append(
            Nic(
                cname,
                tuple(int(g) for g in idx if isinstance(g, int)),
                c["leaf"],
                _positive(errs, f"{q}.bw_GBps", c["bw_GBps"]),
                _positive(errs, f"{q}.latency_us", c["latency_us"]),
            )
        )
    if not standalone:
        missing = [g for g in range(gpus) if g not in served]
        if missing:
            errs.add(
                f"{p}.nics",
                f"GPUs {missing} of node {nname!r} have no NIC (mark the node standalone: true if intended)",
            )
    elif nics:
        errs.add(f"{p}.standalone", "a standalone node has no NICs")
    return Node(
        nname,
        str(n["gpu_model"]),
        gpus,
        domain,
        tuple(nics),
        dcgm if isinstance(dcgm, str) else None,
        standalone,
    )


def _build(name, gpu_models, switches, links, nodes, domains, errs) -> Topology:
    tier_of = {s.name: s.tier for s in switches}
    leaf_names = tuple(s.name for s in switches if s.tier == "leaf")
    leaf_idx = {n: i for i, n in enumerate(leaf_names)}
    # Parallel cables between the same two switches add up.
    cap: dict[tuple[str, str], list[float]] = {}
    for lk in links:
        lo, hi = (lk.a, lk.b) if TIERS.index(tier_of[lk.a]) < TIERS.index(tier_of[lk.b]) else (lk.b, lk.a)
        c = cap.setdefault((lo, hi), [0.0, 0.0, 0])
        c[0] += lk.bw_GBps
        c[1] += lk.latency_us
        c[2] += 1
    up: dict[str, dict[str, tuple[float, float]]] = {}
    for (lo, hi), (bw, lat, k) in cap.items():
        up.setdefault(lo, {})[hi] = (bw, lat / k)

    nl = len(leaf_names)
    leaf_spine_bw = np.full(nl, math.inf)
    leaf_spine_lat = np.zeros(nl)
    leaf_total = np.zeros(nl)
    for i, lf in enumerate(leaf_names):
        ups = up.get(lf, {})
        if ups:
            leaf_spine_bw[i] = min(bw for bw, _ in ups.values())
            leaf_spine_lat[i] = max(lat for _, lat in ups.values())
            leaf_total[i] = sum(bw for bw, _ in ups.values())

    # Pods: leaves joined through shared spines; planes: pods joined through shared cores.
    parent = list(range(nl))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    by_spine: dict[str, list[int]] = {}
    for i, lf in enumerate(leaf_names):
        for sp in up.get(lf, {}):
            by_spine.setdefault(sp, []).append(i)
    for members in by_spine.values():
        for m in members[1:]:
            parent[find(m)] = find(members[0])
    roots = sorted({find(i) for i in range(nl)})
    pod_of_root = {r: k for k, r in enumerate(roots)}
    leaf_pod = np.array([pod_of_root[find(i)] for i in range(nl)], dtype=np.int32)
    n_pods = len(roots)
    pod_core_bw = np.full(n_pods, math.inf)
    pod_core_lat = np.zeros(n_pods)
    pod_cores: list[set[str]] = [set() for _ in range(n_pods)]
    for sp, members in by_spine.items():
        pod = leaf_pod[members[0]]
        for core, (bw, lat) in up.get(sp, {}).items():
            pod_cores[pod].add(core)
            pod_core_bw[pod] = min(pod_core_bw[pod], bw)
            pod_core_lat[pod] = max(pod_core_lat[pod], lat)
    pparent = list(range(n_pods))

    def pfind(x: int) -> int:
        while pparent[x] != x:
            pparent[x] = pparent[pparent[x]]
            x = pparent[x]
        return x

    by_core: dict[str, list[int]] = {}
    for pod, cs in enumerate(pod_cores):
        for c in cs:
            by_core.setdefault(c, []).append(pod)
    for members in by_core.values():
        for m in members[1:]:
            pparent[pfind(m)] = pfind(members[0])
    pod_plane = [pfind(p) for p in range(n_pods)]

    # Every leaf that serves a NIC must reach every other such leaf.
    used_leaves = sorted({leaf_idx[c.leaf] for n in nodes for c in n.nics})
    if used_leaves:
        planes = {pod_plane[leaf_pod[i]] for i in used_leaves}
        if len(planes) > 1:
            first = leaf_names[used_leaves[0]]
            for i in used_leaves:
                if pod_plane[leaf_pod[i]] != pod_plane[leaf_pod[used_leaves[0]]]:
                    errs.add(
                        "links",
                        f"leaf {leaf_names[i]!r} has no path to leaf {first!r} through spines and cores",
                    )
                    break
    errs.raise_if_any()

    dom_names = tuple(domains)
    dom_idx = {d: i for i, d in enumerate(dom_names)}
    n_gpus = sum(n.gpus for n in nodes)
    gpu_node = np.empty(n_gpus, dtype=np.int32)
    gpu_index = np.empty(n_gpus, dtype=np.int32)
    gpu_domain = np.empty(n_gpus, dtype=np.int32)
    gpu_leaf = np.full(n_gpus, -1, dtype=np.int32)
    gpu_rail = np.full(n_gpus, -1, dtype=np.int32)
    gpu_nic_bw = np.zeros(n_gpus)
    gpu_nic_lat = np.zeros(n_gpus)
    node_first = np.empty(len(nodes), dtype=np.int64)
    node_count = np.empty(len(nodes), dtype=np.int32)
    node_domain = np.empty(len(nodes), dtype=np.int32)
    node_leaf = np.full(len(nodes), -1, dtype=np.int32)
    node_peak = np.empty(len(nodes))
    gid = 0
    for ni, n in enumerate(nodes):
        node_first[ni], node_count[ni] = gid, n.gpus
        node_domain[ni] = dom_idx[n.domain]
        node_peak[ni] = gpu_models[n.gpu_model].peak_tflops
        sl = slice(gid, gid + n.gpus)
        gpu_node[sl] = ni
        gpu_index[sl] = np.arange(n.gpus)
        gpu_domain[sl] = dom_idx[n.domain]
        if n.nics:
            node_leaf[ni] = leaf_idx[n.nics[0].leaf]
        for k, c in enumerate(n.nics):
            ids = np.asarray(c.gpus, dtype=np.int64) + gid
            gpu_leaf[ids] = leaf_idx[c.leaf]
            gpu_rail[ids] = k
            gpu_nic_bw[ids] = c.bw_GBps
            gpu_nic_lat[ids] = c.latency_us
        gid += n.gpus
    gpu_pod = np.where(gpu_leaf >= 0, leaf_pod[np.maximum(gpu_leaf, 0)] if nl else -1, -1).astype(np.int32)
    plane_arr = np.asarray(pod_plane, dtype=np.int32)
    gpu_plane = np.where(gpu_pod >= 0, plane_arr[np.maximum(gpu_pod, 0)] if n_pods else -1, -1).astype(
        np.int32
    )
    return Topology(
        name=name,
        gpu_models=dict(gpu_models),
        switches=tuple(switches),
        links=tuple(links),
        nodes=tuple(nodes),
        domains={d: NvlinkDomain(d, v["bw"], v["lat"], tuple(v["nodes"])) for d, v in domains.items()},
        gpu_node=gpu_node,
        gpu_index=gpu_index,
        gpu_domain=gpu_domain,
        gpu_leaf=gpu_leaf,
        gpu_pod=gpu_pod,
        gpu_plane=gpu_plane,
        gpu_nic_bw=gpu_nic_bw,
        gpu_nic_latency=gpu_nic_lat,
        gpu_rail=gpu_rail,
        domain_names=dom_names,
        domain_bw=np.array([domains[d]["bw"] for d in dom_names], dtype=float),
        domain_latency=np.array([domains[d]["lat"] for d in dom_names], dtype=float),
        leaf_names=leaf_names,
        leaf_spine_bw=leaf_spine_bw,
        leaf_spine_latency=leaf_spine_lat,
        leaf_uplink_total_bw=leaf_total,
        leaf_pod=leaf_pod,
        pod_core_bw=pod_core_bw,
        pod_core_latency=pod_core_lat,
        node_first_gid=node_first,
        node_gpu_count=node_count,
        node_domain=node_domain,
        node_leaf=node_leaf,
        node_peak_tflops=node_peak,
    )


def topology_to_spec(topo: Topology) -> dict:
    """The full spec v1 form of a topology (what `load_topology` reads back identically)."""
    nodes = []
    for n in topo.nodes:
        d = topo.domains[n.domain]
        entry: dict[str, Any] = {
            "name": n.name,
            "gpu_model": n.gpu_model,
            "gpus": n.gpus,
            "nvlink": {"domain": d.name, "bw_GBps": d.bw_GBps, "latency_us": d.latency_us},
        }
        if n.dcgm_url:
            entry["dcgm_url"] = n.dcgm_url
        if n.standalone:
            entry["standalone"] = True
        else:
            entry["nics"] = [
                {
                    "name": c.name,
                    "gpus": list(c.gpus),
                    "leaf": c.leaf,
                    "bw_GBps": c.bw_GBps,
                    "latency_us": c.latency_us,
                }
                for c in n.nics
            ]
        nodes.append(entry)
    return {
        "version": 1,
        "name": topo.name,
        "gpu_models": {m.name: {"peak_tflops": m.peak_tflops} for m in topo.gpu_models.values()},
        "switches": [{"name": s.name, "tier": s.tier} for s in topo.switches],
        "links": [
            {"a": lk.a, "b": lk.b, "bw_GBps": lk.bw_GBps, "latency_us": lk.latency_us} for lk in topo.links
        ],
        "nodes": nodes,
    }


def load_topology_file(path: str) -> Topology:
    """Read a YAML or JSON spec file (YAML is a superset of JSON) and load it."""
    return load_topology(read_spec_file(path))


def read_spec_file(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return parse_spec_text(fh.read())


_FLOAT_RE = (
    r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)"
    r"|\.(?:nan|NaN|NAN))$"
)


@lru_cache(maxsize=1)
def _spec_yaml_loader():
    """A safe YAML loader that reads `1.2e9` as a float (YAML 1.2 / JSON), not as a string."""
    import yaml

    class SpecLoader(yaml.SafeLoader):
        pass

    SpecLoader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT_RE), list("-+0123456789."))
    return SpecLoader


def parse_spec_text(text: str) -> Any:
    """Parse YAML or JSON text; a syntax error becomes a SpecError."""
    import yaml

    try:
        return yaml.load(text, Loader=_spec_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError([("", f"not valid YAML or JSON: {exc}")]) from exc
