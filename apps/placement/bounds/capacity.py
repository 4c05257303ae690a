"""What a cluster, or a set of its free GPUs, offers the bound at each level: regions, their
free-GPU capacities, the best links between them, and the keys those capacities are memoised on.

Regions. At each level the cluster's GPUs are partitioned into regions, each nested in one region
of the next level: `nvlink`, the NVLink domains; `leaf`, domains joined whenever GPUs of theirs have
NICs on a common leaf switch (one leaf in a leaf-spine cluster, a whole scalable unit in a
rail-optimised one); `spine`, leaf regions joined through the spines of their leaves (a pod);
`core`, the whole cluster. cap(L) is the GPU count of the largest region at level L.

Free GPUs (`lower_bound(..., free=mask)`). Every placement on a fragmented cluster uses free GPUs
only, so a block confined to one region uses at most that region's free GPUs: every argument of
the bound (the package docstring and `prices`) holds with each size read as a free count. g becomes
each region's free GPUs and cap(L) the most in one region at L; "domains that large" (nvlink pricing, and the best domain holding 2+ members)
the domains with that many free GPUs; g_d and a domain's NICs (free splits), its free GPUs and the
distinct NICs among them; lambda, the leaves serving one leaf region's free GPUs; c, from each
region's domains' free GPUs. Each only
shrinks, so the free-set bound is at least the empty-cluster one, and `gap` against it measures the
placement rather than the fragmentation. A mask with fewer free GPUs than the job needs raises
ValueError: there is no placement to bound. A free set's capacities are memoised on those counts
(how many regions hold how many free GPUs, per level; how many domains have how many free NICs;
how many leaf regions have domains this free), not on the mask, so free sets alike share their prices and bounds.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..costmodel.paths import nic_ids
from ..topology import LEVELS, Topology


@dataclass(frozen=True)
class _Capacity:
    """What the free GPUs (all, on the empty cluster) offer per level: region sizes (GPUs), best
    bandwidth (GB/s), latency (us)."""

    fit_gpus: np.ndarray  # per domain class: the most free GPUs in one of its domains
    fit_bw: np.ndarray  # per domain class: its NVLink bandwidth (GB/s)
    fit_lat: np.ndarray  # per domain class: its NVLink latency (us)
    fit_nvls: np.ndarray  # per domain class: its switches' NVLS efficiency, 0 without NVLS
    region_gpus: tuple[int, int, int]  # largest region at nvlink, leaf, spine (free GPUs)
    region_counts: tuple[tuple, tuple, tuple]  # per level: ((free GPUs, regions with that many), ...)
    total_gpus: int  # free GPUs in all
    region_leaves: int  # most leaves serving one leaf region's (free) GPUs
    region_fills: tuple  # ((a leaf region's domains' free GPUs, largest first), regions like it), ...
    uplink_total: float  # largest leaf's total uplinks (GB/s), inf where a leaf has none
    max_domain_rails: int  # most distinct NICs among one domain's (free) GPUs
    domain_free: np.ndarray  # (free) GPUs of each domain with any, largest first
    domain_rails: np.ndarray  # distinct NICs among each domain's (free) GPUs, those with any, largest first
    intra_bw: float  # best domain holding 2+ (free) GPUs, inf if none
    intra_lat: float
    nic_bw: float
    nic_lat: float
    uplink_bw: float
    uplink_lat: float
    core_bw: float
    core_lat: float
    min_peak_tflops: float
    # per domain class and block size k: best bandwidth of k GPUs in one of its domains (GB/s);
    # below fit_bw only for classes of nodes with intra links (`topology/intra.py`); None if none
    fit_bw_by_size: np.ndarray | None = None
    # ((domain class, free GPUs, fastest NIC among them in GB/s or 0, domains like that), ...)
    domain_kinds: tuple = ()
    fits: dict = field(default_factory=dict)  # (block, group GPUs) -> best (GB/s, us) in domains that large
    prices: dict = field(default_factory=dict)  # (collective, n, bytes, context) -> [(ms, GB/s)] by level
    bounds: dict = field(default_factory=dict)  # JobSpec -> its Prediction
    holds: dict = field(default_factory=dict)  # (level, block GPUs) -> disjoint blocks that fit

    def room(self, level: int, block: int, gpus: int) -> bool:
        """Whether the regions at LEVELS[level] hold gpus/block disjoint blocks of `block` (free)
        GPUs, each inside one region; a job larger than every free GPU needs just one block."""
        n = self.holds.get((level, block))
        if n is None:
            n = self.holds[(level, block)] = sum(f // block * m for f, m in self.region_counts[level])
        return n * block >= (gpus if gpus <= self.total_gpus else block)


@dataclass
class _Layout:
    """A topology's fixed structure the capacities are counted over, and its capacities by key."""

    dom_class: np.ndarray  # per domain: index of its (bw, latency) class
    leaf_region: np.ndarray  # per domain: its leaf region
    pod_region: np.ndarray  # per domain: its pod region
    net: np.ndarray  # bool per gid: has a NIC
    dom_nic: np.ndarray  # per networked GPU: index of its (domain, NIC) pair
    rate_values: np.ndarray  # the distinct NIC rates (GB/s), ascending
    rate_index: np.ndarray  # per networked GPU: index of its NIC's rate in rate_values
    net_domain: np.ndarray  # per networked GPU: its domain
    pair_dom: np.ndarray  # per (domain, NIC) pair: the domain
    region_leaf: np.ndarray  # per networked GPU: index of its (leaf region, leaf) pair
    pair_region: np.ndarray  # per (leaf region, leaf) pair: the region
    constants: dict  # the _Capacity fields no free set changes
    empty_key: tuple = ()
    empty: _Capacity | None = None
    variants: dict = field(default_factory=dict)  # capacity key -> _Capacity of a free set


_LAYOUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Memo sizes per topology (entries); a full memo is cleared, as jobs come and go. Bounds hold
# every group of a job, so fewer of them are kept; each free-set capacity has its own memos.
_MEMO_SIZE = 4096
_BOUNDS_SIZE = 256
_VARIANTS_SIZE = 32


def _regions(n_domains: int, dom: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Region index of each domain: domains joined by sharing an `other` vertex (a leaf or a pod)."""
    parent = list(range(n_domains + int(other.max(initial=-1)) + 1))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for d, o in _distinct_pairs(dom, other + n_domains)[0].T.tolist():
        parent[find(d)] = find(o)
    return np.array([find(d) for d in range(n_domains)], dtype=np.int64)


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of each (a, b) pair among the distinct pairs, each distinct pair's a)."""
    if not a.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    uniq, inverse = _distinct_pairs(a, b)
    return inverse, uniq[0]


def _distinct_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs of two arrays of non-negative ints as a (2, pairs) array in
    (a, b) order, and the index of each input pair among them: `np.unique(..., axis=1)` over one
    int64 key, an order of magnitude faster than its row sort on 100,000 GPUs."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    width = int(b.max(initial=0)) + 1
    keys, inverse = np.unique(a * width + b, return_inverse=True)
    return np.stack([keys // width, keys % width]), inverse.ravel().astype(np.int64)


def _layout(topo: Topology) -> _Layout:
    layout = _LAYOUT.get(topo)
    if layout is not None:
        return layout
    n_dom = len(topo.domain_names)
    net = topo.gpu_leaf >= 0
    dom_net = topo.gpu_domain[net].astype(np.int64)
    leaf_net = topo.gpu_leaf[net].astype(np.int64)
    ids, _ = nic_ids(topo)
    leaf_region = _regions(n_dom, dom_net, leaf_net)
    dom_nic, pair_dom = _pairs(dom_net, ids[net])
    region_leaf, pair_region = _pairs(leaf_region[dom_net], leaf_net)
    classes, dom_class = np.unique(
        np.stack([topo.domain_bw.astype(float), topo.domain_latency.astype(float), topo.domain_nvls]),
        axis=1,
        return_inverse=True,
    )
    used = np.unique(topo.gpu_leaf[net])
    totals = topo.leaf_uplink_total_bw[used]
    finite_up = np.isfinite(topo.leaf_spine_bw)
    finite_core = topo.pod_core_bw[np.isfinite(topo.pod_core_bw)]
    constants = {
        "fit_bw": classes[0],
        "fit_lat": classes[1],
        "fit_nvls": classes[2],
        "uplink_total": float(totals.max()) if totals.size and (totals > 0).all() else math.inf,
        "nic_bw": float(topo.gpu_nic_bw[net].max(initial=0.0)),
        "nic_lat": float(topo.gpu_nic_latency[net].min(initial=math.inf)),
        "uplink_bw": float(topo.leaf_spine_bw[finite_up].max()) if finite_up.any() else math.inf,
        "uplink_lat": float(topo.leaf_spine_latency[finite_up].min()) if finite_up.any() else 0.0,
        "core_bw": float(finite_core.max()) if finite_core.size else math.inf,
        "core_lat": float(topo.pod_core_latency.min()) if topo.pod_core_latency.size else 0.0,
        "min_peak_tflops": float(topo.node_peak_tflops.min()),
        "fit_bw_by_size": _fit_bw_by_size(topo, dom_class.ravel(), classes[0]),
    }
    rate_values, rate_index = np.unique(topo.gpu_nic_bw[net].astype(float), return_inverse=True)
    layout = _Layout(
        dom_class=dom_class.ravel().astype(np.int64),
        rate_values=rate_values,
        rate_index=rate_index.ravel().astype(np.int64),
        net_domain=dom_net,
        leaf_region=leaf_region,
        pod_region=_regions(n_dom, dom_net, topo.gpu_pod[net].astype(np.int64)),
        net=net,
        dom_nic=dom_nic,
        pair_dom=pair_dom,
        region_leaf=region_leaf,
        pair_region=pair_region,
        constants=constants,
    )
    layout.empty_key = _capacity_key(topo, layout, np.ones(topo.n_gpus, dtype=bool))
    layout.empty = _build(constants, layout.empty_key)
    _LAYOUT[topo] = layout
    return layout


def _counts(per_region: np.ndarray) -> tuple:
    """((free GPUs, regions with that many), ...) of the regions with any, by count."""
    values, mult = np.unique(per_region[per_region > 0].astype(np.int64), return_counts=True)
    return tuple(zip(values.tolist(), mult.tolist(), strict=True))


def _fit_bw_by_size(topo: Topology, dom_class: np.ndarray, class_bw: np.ndarray) -> np.ndarray | None:
    """Per domain class and block size: the best bandwidth a block that large reaches in one of
    its domains. A class of nodes with intra links only gets their best k-subsets (any GPUs, so
    also an upper bound on free ones); others keep their uniform bandwidth."""
    if not topo.node_intra:
        return None
    width = int(topo.node_gpu_count.max()) + 1
    out = np.repeat(class_bw.astype(float)[:, None], width, axis=1)
    intra_dom = {int(topo.node_domain[ni]): intra for ni, intra in topo.node_intra.items()}
    for c in range(class_bw.size):
        members = np.flatnonzero(dom_class == c)
        if not all(int(d) in intra_dom for d in members):
            continue
        best = np.zeros(width)
        for d in members:
            sub = intra_dom[int(d)].best_subset_bw()
            best[: sub.size] = np.maximum(best[: sub.size], sub)
        out[c] = np.minimum(out[c], best)
    return out


def _capacity_key(topo: Topology, layout: _Layout, free: np.ndarray) -> tuple:
    """What a free set's capacities depend on: per domain class the most free GPUs in a domain;
    per level how many regions have how many free GPUs; most leaves under one region's free GPUs;
    most NICs among one domain's free GPUs; how many domains have how many NICs among them."""
    dom_free = np.bincount(topo.gpu_domain[free], minlength=len(topo.domain_names))
    fit = np.zeros(int(layout.dom_class.max(initial=-1)) + 1, dtype=np.int64)
    np.maximum.at(fit, layout.dom_class, dom_free)

    def most(index: np.ndarray, weights: np.ndarray) -> int:
        return max(int(np.bincount(index, weights=weights).max(initial=0)), 1) if index.size else 1

    free_net = free[layout.net]
    nics = np.bincount(layout.dom_nic[free_net], minlength=layout.pair_dom.size) > 0
    leaves = np.bincount(layout.region_leaf[free_net], minlength=layout.pair_region.size) > 0
    dom_rails = np.bincount(layout.pair_dom, weights=nics) if layout.pair_dom.size else np.zeros(0)
    # Each leaf region's domains by free GPUs, largest first: how many whole blocks it holds.
    held = dom_free > 0
    order = np.lexsort((-dom_free[held], layout.leaf_region[held]))
    regions, starts = np.unique(layout.leaf_region[held][order], return_index=True)
    fills = np.split(dom_free[held][order], starts[1:]) if regions.size else []
    region_fills = tuple(sorted(Counter(tuple(f.tolist()) for f in fills).items()))
    # Domains by (class, free GPUs, fastest NIC among their free GPUs).
    fastest = np.zeros(dom_free.size, dtype=np.int64)
    free_rate, free_dom = layout.rate_index[free_net], layout.net_domain[free_net]
    for i in range(layout.rate_values.size):
        # Ascending rates: a domain ends with its fastest (index + 1; 0 for none).
        fastest[free_dom[free_rate == i]] = i + 1
    width, n_rates = int(dom_free.max(initial=0)) + 1, layout.rate_values.size + 1
    codes = (layout.dom_class[held] * width + dom_free[held]) * n_rates + fastest[held]
    kinds, mult = np.unique(codes, return_counts=True)
    rates = np.concatenate([[0.0], layout.rate_values])
    domain_kinds = tuple(
        (int(k // n_rates // width), int(k // n_rates % width), float(rates[k % n_rates]), int(m))
        for k, m in zip(kinds.tolist(), mult.tolist(), strict=True)
    )
    return (
        tuple(fit.tolist()),
        (
            _counts(dom_free),
            _counts(np.bincount(layout.leaf_region, weights=dom_free)),
            _counts(np.bincount(layout.pod_region, weights=dom_free)),
        ),
        most(layout.pair_region, leaves),
        most(layout.pair_dom, nics),
        _counts(dom_rails),
        region_fills,
        domain_kinds,
    )


def _descending(counts: tuple) -> np.ndarray:
    """The values of ((value, multiplicity), ...) counts, one per region, largest first."""
    values = [v for v, _ in counts]
    return np.repeat(np.array(values, dtype=np.int64), [m for _, m in counts])[::-1].copy()


def _build(constants: dict, key: tuple) -> _Capacity:
    fit_tuple, counts, region_leaves, rails, rail_counts, region_fills, domain_kinds = key
    fit = np.array(fit_tuple, dtype=np.int64)
    big = fit >= 2
    return _Capacity(
        fit_gpus=fit,
        region_gpus=tuple(level[-1][0] if level else 0 for level in counts),
        region_counts=counts,
        total_gpus=sum(f * m for f, m in counts[0]),
        region_leaves=region_leaves,
        region_fills=region_fills,
        max_domain_rails=rails,
        domain_free=_descending(counts[0]),
        domain_rails=_descending(rail_counts),
        intra_bw=float(constants["fit_bw"][big].max()) if big.any() else math.inf,
        intra_lat=float(constants["fit_lat"][big].min()) if big.any() else 0.0,
        domain_kinds=domain_kinds,
        **constants,
    )


def free_array(topology: Topology, free) -> np.ndarray:
    """`free` checked as a bool array with one entry per gid (True: the GPU is free)."""
    mask = np.asarray(free)
    if mask.dtype != bool or mask.shape != (topology.n_gpus,):
        raise ValueError(
            f"free: expected a bool array of {topology.n_gpus} GPUs, got {mask.dtype} of shape {mask.shape}"
        )
    return mask


def _capacity(topo: Topology, free: np.ndarray | None = None) -> _Capacity:
    """The capacities of the empty cluster (free=None) or of a checked free mask, memoised on
    what they depend on rather than on the mask."""
    layout = _layout(topo)
    if free is None:
        return layout.empty
    key = _capacity_key(topo, layout, free)
    if key == layout.empty_key:
        return layout.empty
    cap = layout.variants.get(key)
    if cap is None:
        if len(layout.variants) >= _VARIANTS_SIZE:
            layout.variants.clear()
        cap = layout.variants[key] = _build(layout.constants, key)
    return cap


def region_gpus(topo: Topology, *, free: np.ndarray | None = None) -> dict[str, int]:
    """cap(L) per level, in GPUs: the largest NVLink domain, leaf region, pod, and the whole
    cluster; with `free` (bool per gid), the most free GPUs in one of each."""
    if free is None:
        caps, total = _capacity(topo).region_gpus, topo.n_gpus
    else:
        mask = free_array(topo, free)
        caps, total = _capacity(topo, mask).region_gpus, int(mask.sum())
    return {"nvlink": caps[0], "leaf": caps[1], "spine": caps[2], "core": total}


def _smallest(cap: _Capacity, n: int) -> str:
    for level, size in zip(LEVELS, cap.region_gpus, strict=False):
        if size >= n:
            return level
    return "core"


def smallest_level(topo: Topology, n: int) -> str:
    """The lowest level whose largest region has >= n GPUs: nvlink, leaf, spine or core."""
    return _smallest(_capacity(topo), n)
