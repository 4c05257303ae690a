"""The cluster model: spec-v1 constants, the error type, the immutable Topology and its path model.

GPUs are numbered 0..n_gpus-1 node by node in file order ("gid"); `Topology.path(g, h)` is O(1)
after an O(GPUs) index.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .intra import IntraLinks

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
    """A GPU type: its dense peak (TFLOPS, for MFU) and, when the operator measured it, its
    `speed` relative to the cluster's other models (any unit; only ratios count). A job's compute
    time scales by the ratio of speeds, the peaks' ratio when no speed is set."""

    name: str
    peak_tflops: float
    speed: float | None = None

    @property
    def rate(self) -> float:
        """How fast this model computes, relative to the others: `speed`, else `peak_tflops`."""
        return self.peak_tflops if self.speed is None else self.speed


# GPU families whose baseboards or racks switch NVLink with NVLS-capable NVSwitches (gen 3 on
# Hopper HGX boards, gen 4 in Blackwell's NVL racks and HGX boards).
_HOPPER = re.compile(r"(?<![0-9])H(100|200|800|20)(?![0-9])")
_BLACKWELL = re.compile(r"(?<![0-9])B(100|200|300)(?![0-9])")
# Fewest GPUs on one NVSwitch fabric: HGX boards of 4 join their GPUs directly, with no switch.
NVLS_MIN_GPUS = 8


def nvls_efficiency(models) -> float:
    """NCCL's nvlsEfficiency for a domain of these GPU models: Blackwell's (0.74) when any is a
    Blackwell, else Hopper's (0.85); NCCL 2.30.7 src/graph/tuning.cc."""
    if any(_BLACKWELL.search(m.upper()) for m in models):
        return 0.74
    return 0.85


def nvls_default(models, gpus: int, intra: bool) -> bool:
    """Whether a domain the spec says nothing about runs NVLS: every GPU a Hopper (H100, H200, H800,
    H20) or Blackwell (B100, B200, B300, GB200, GB300) not on PCIe, at least NVLS_MIN_GPUS of them
    on one NVSwitch fabric, and no node priced by pair links (`Node.intra`: not a switch)."""
    if intra or gpus < NVLS_MIN_GPUS or not models:
        return False
    names = [m.upper() for m in models]
    return all(
        "PCIE" not in m and (_HOPPER.search(m) is not None or _BLACKWELL.search(m) is not None) for m in names
    )


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
    # Whether its switches run NVLS (NVLink SHARP); None: the spec is silent (`nvls_default`).
    nvls: bool | None = None


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_model: str
    gpus: int
    domain: str
    nics: tuple[Nic, ...]
    dcgm_url: str | None = None
    standalone: bool = False
    intra: IntraLinks | None = None  # GPU-pair links when not one uniform NVLink domain


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
    node_rate: np.ndarray = field(repr=False)  # the node's GPU model's `GpuModel.rate`
    # Nodes with intra-node links (`Node.intra`) by node index; their domain is theirs alone.
    node_intra: Mapping[int, IntraLinks] = field(default_factory=dict, repr=False)

    @cached_property
    def domain_nvls(self) -> np.ndarray:
        """Per domain: the NVLS efficiency of its switches (NCCL's nvlsEfficiency), 0 where they do
        not run NVLS. The spec's `nvlink.nvls` when given, else `nvls_default`."""
        out = np.zeros(len(self.domain_names))
        intra_domains = {int(self.node_domain[i]) for i in self.node_intra}
        for d, name in enumerate(self.domain_names):
            dom = self.domains[name]
            members = [self.nodes[self.node_by_name[n]] for n in dom.nodes]
            models = {n.gpu_model for n in members}
            gpus = sum(n.gpus for n in members)
            on = dom.nvls if dom.nvls is not None else nvls_default(models, gpus, d in intra_domains)
            out[d] = nvls_efficiency(models) if on else 0.0
        return out

    @cached_property
    def any_nvls(self) -> bool:
        """Whether some domain's switches run NVLS (`domain_nvls`)."""
        return bool(self.domain_nvls.any())

    @property
    def n_gpus(self) -> int:
        return int(self.gpu_node.shape[0])

    @cached_property
    def node_by_name(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def model_rates(self) -> dict[str, float]:
        """`GpuModel.rate` of each model some node has, fastest first."""
        used = {n.gpu_model for n in self.nodes}
        rates = {m: self.gpu_models[m].rate for m in used}
        return dict(sorted(rates.items(), key=lambda kv: (-kv[1], kv[0])))

    @cached_property
    def node_model(self) -> np.ndarray:
        """Per node, the index of its GPU model in `model_rates`."""
        order = {m: i for i, m in enumerate(self.model_rates)}
        return np.array([order[n.gpu_model] for n in self.nodes], dtype=np.int32)

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
            intra = self.node_intra.get(int(self.gpu_node[g])) if self.node_intra else None
            if intra is not None:
                i, j = self.gpu_index[g], self.gpu_index[h]
                return Path(float(intra.bw[i, j]), float(intra.latency[i, j]), "nvlink")
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

    def intra_pairs(self, gids) -> tuple[float, float]:
        """Slowest pair bandwidth (GB/s) and latency (us) among GPUs of one node with intra links."""
        g = np.asarray(gids, dtype=np.int64)
        intra = self.node_intra[int(self.gpu_node[g[0]])]
        i = self.gpu_index[g]
        bw = intra.bw[np.ix_(i, i)]
        off = ~np.eye(i.size, dtype=bool)
        return float(bw[off].min()), float(intra.latency[np.ix_(i, i)][off].max())

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
            if self.node_intra and int(self.gpu_node[g[0]]) in self.node_intra:
                bw, lat = self.intra_pairs(g)
                return Path(bw, lat, "nvlink")
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
            if self.node_intra:
                for d in ud[counts > 1]:
                    sub = g[doms == d]
                    if int(self.gpu_node[sub[0]]) in self.node_intra:
                        ibw, ilat = self.intra_pairs(sub)
                        bw, dom_lat = min(bw, ibw), max(dom_lat, ilat)
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
