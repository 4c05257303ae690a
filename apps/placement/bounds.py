"""Lower bound on a job's communication per step, joint over its group kinds, on the empty cluster
or on a given set of free GPUs.

Regions. At each level the cluster's GPUs are partitioned into regions, each nested in one region
of the next level: `nvlink`, the NVLink domains; `leaf`, domains joined whenever GPUs of theirs have
NICs on a common leaf switch (one leaf in a leaf-spine cluster, a whole scalable unit in a
rail-optimised one); `spine`, leaf regions joined through the spines of their leaves (a pod);
`core`, the whole cluster. cap(L) is the GPU count of the largest region at level L.

The bound gives each group kind K that communicates (tp, pp, dp, ep with a non-empty comm entry and
groups of 2+ ranks) a level l(K), keeps the assignments that are feasible and takes the cheapest:
the sum of its comm entries, each priced at its kind's level (below). At most 4^4 assignments.

Feasibility, and why it is necessary. Take any placement and let l(K) be the lowest level at which
every group of K lies inside one region. Fix a level L and let S be the kinds with l(K) <= L. Link
two ranks when they share a group of a kind in S; each link joins two ranks in one L-region and the
regions are disjoint, so every connected set of linked ranks lies inside one L-region. On the
Megatron grid a group of K is the set of ranks that agree on every coordinate outside K's dimensions
(tp: tp; pp: pp; ep: the expert index; dp: the expert index and dp_index), so a connected set is the
set of ranks that agree outside the union of S's dimensions: a block of the product of those
dimensions' sizes (an EP group lies inside its DP group, so ep adds nothing once dp is in S). Hence
every placement's own assignment satisfies block(S) <= cap(L) at every level L below core (at core
the bound is still defined for a job larger than the cluster, though no placement exists). More: the
job's ranks split into gpus/block(S) such blocks, disjoint, each inside one L-region, and a region
of g GPUs holds at most floor(g/block(S)) of them, so the sum of floor(g/block(S)) over L's regions
is at least gpus/block(S) (`_Capacity.room`; for a job larger than the cluster, block(S) <= cap(L)).

Pricing, and why it is low enough. An entry costs its slowest group. Under the placement's own
assignment every group of K at `nvlink` sits in one domain holding whole blocks of the nvlink kinds
(priced over the domains that large: best bandwidth, lowest latency), and some group of K at a
higher level lies outside every region of the level below: at `leaf` it spans domains (best NIC,
two NIC latencies); at `spine` it also crosses leaves without being rail-aligned (a rail-aligned
group's domains share a leaf, so they lie in one leaf region): the best uplink and two uplink
latencies join in; at `core` it crosses pods: the best core uplink joins in. An allreduce spanning
m domains is hierarchical: its fullest domain's k members reduce-scatter and allgather, a ring
joins the m domains over its fewest rails r (S/r each); the time rises with k and m and falls with
r. Each domain holds whole blocks of the nvlink kinds (B0 ranks), each meeting the group in c ranks
(the product of their shared dimensions), so domain d holds at most a_d = min(n, c*floor(g_d/B0))
members (g_d its GPUs). Free splits: with the a_d largest first, m domains hold the n members only
if the m largest sum to n or more; their fullest then holds at least the least k with
sum(min(a_(i), k), i <= m) >= n, since no m domains hold more than the m largest at k each (the
greedy cover by count is the best cover); and r is at most floor(n/m), a_(m) and the m-th most NICs
in one domain (the smallest of any m domains' values is at most the m-th largest). So each m's
price is at most every m-domain placement's, and the allreduce is priced at the best m.
`costmodel.evaluate` can only match or exceed each term (other jobs' flows only lower bandwidth),
so no placement's comm time is below.

The job's own flows. Let S1 be the kinds at or below leaf (blocks of B1 ranks; each S1 block lies
in one leaf region). The groups of K meeting an S1 block all meet the same S1 blocks (those that
agree with it outside S1's and K's dimensions: K's coset, or line, through the block), so when K
is at `spine` or above, some line's groups all leave a region: the B1/c1 distinct groups of K
through each of its blocks (c1: the product of the dimensions K shares with S1) each put a flow on
one of that block's region's leaves (lambda at most): a ring on every leaf it spans, a p2p chain
on its hop out of the region, an alltoall or volume group one per member GPU (B1 per block). A
region meeting x such crossing lines thus has q = ceil(x * flows / lambda) of the entry's flows
on one leaf, and a group there gets at most T/q GB/s (T: the largest leaf's total uplinks), per
rail T/(q*rails) for the allreduce with the fewest rails there. K at `spine` is priced at that
share (x = 1 at least); K at `core` at the worse of its pod-crossing group (uncongested) and the
congested one.

Two kinds crossing together. When exactly two kinds K1, K2 are at spine/core, with dimensions
outside S1 disjoint and together with S1 spanning the whole job, the job's S1 blocks form one
n1 x n2 grid (K1's lines: n2 of n1 blocks; K2's: n1 of n2), larger than any leaf region. A region
holding h blocks that meets a K1 lines (f1 of them whole, x1 = a - f1 crossing) and b K2 lines
(f2 whole, x2 crossing) has h <= a*b, h <= f1*n1 + x1*min(b, n1-1) (a part line holds at most
n1-1 blocks, each in another K2 line), the same with the roles swapped, and
f1*n1 + f2*n2 - f1*f2 <= h; a whole K1 line meets every K2 line (f1 > 0: b = n1), and conversely.
So a region with room for c whole blocks holds at most M_c(X1, X2) of them when it meets at most
X1 crossing K1 lines and X2 crossing K2 lines (`_most_cells`). Let X1, X2 be the most that any of
a placement's regions meets: the sum of M_c over the regions reaches n1*n2, and K1's entries are
priced at the q of x = X1 (the region meeting X1), K2's at that of X2; the pair is priced at the
cheapest (X1, X2 >= 1) that passes (grids past _GRID_CELLS blocks keep x = 1). A
region's c counts whole S1 blocks of whole nvlink blocks (B0 ranks, B1/B0 of them per S1 block):
floor(sum over its domains of floor(g_d / B0) / (B1/B0)), since each nvlink block lies in one of
its domains.

Free GPUs (`lower_bound(..., free=mask)`). Every placement on a fragmented cluster uses free GPUs
only, so a block confined to one region uses at most that region's free GPUs: every argument above
holds with each size read as a free count. g becomes each region's free GPUs and cap(L) the most
in one region at L; "domains that large" (nvlink pricing, and the best domain holding 2+ members)
the domains with that many free GPUs; g_d and a domain's NICs (free splits), its free GPUs and the
distinct NICs among them; lambda, the leaves serving one leaf region's free GPUs; c, from each
region's domains' free GPUs. Each only
shrinks, so the free-set bound is at least the empty-cluster one, and `gap` against it measures the
placement rather than the fragmentation. A mask with fewer free GPUs than the job needs raises
ValueError: there is no placement to bound. A free set's capacities are memoised on those counts
(how many regions hold how many free GPUs, per level; how many domains have how many free NICs;
how many leaf regions have domains this free), not on the mask, so free sets alike share their prices and bounds.

gap = predicted comm_ms / bound comm_ms, 1.0 when both are 0 (`gap`).
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from .costmodel import (
    FLAT_FORMS,
    GroupCost,
    Prediction,
    hierarchical_allreduce_ms,
    mfu,
    p2p_ms,
    step_ms,
    volume_ms,
)
from .costmodel.paths import nic_ids
from .groups import group_arrays
from .jobs import GROUP_KINDS, JobSpec
from .topology import LEVELS, Topology

# Grid dimensions as bits (ep is the expert index, dpo the dp_index) and each kind's dimensions.
_DIM_BITS = {"tp": 1, "pp": 2, "ep": 4, "dpo": 8}
_KIND_DIMS = {"tp": 1, "pp": 2, "ep": 4, "dp": 4 | 8}


@dataclass(frozen=True)
class _Capacity:
    """What the free GPUs (all, on the empty cluster) offer per level: region sizes (GPUs), best
    bandwidth (GB/s), latency (us)."""

    fit_gpus: np.ndarray  # per domain class: the most free GPUs in one of its domains
    fit_bw: np.ndarray  # per domain class: its NVLink bandwidth (GB/s)
    fit_lat: np.ndarray  # per domain class: its NVLink latency (us)
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
    fits: dict = field(default_factory=dict)  # block GPUs -> best (GB/s, us) of domains that large
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
# Largest grid of leaf blocks two kinds crossing together are counted over (blocks); beyond, 1 line.
_GRID_CELLS = 1024


def _regions(n_domains: int, dom: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Region index of each domain: domains joined by sharing an `other` vertex (a leaf or a pod)."""
    parent = list(range(n_domains + int(other.max(initial=-1)) + 1))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for d, o in np.unique(np.stack([dom, other + n_domains]), axis=1).T.tolist():
        parent[find(d)] = find(o)
    return np.array([find(d) for d in range(n_domains)], dtype=np.int64)


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of each (a, b) pair among the distinct pairs, each distinct pair's a)."""
    if not a.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(np.stack([a, b]), axis=1, return_inverse=True)
    return inverse.ravel().astype(np.int64), uniq[0]


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
        np.stack([topo.domain_bw.astype(float), topo.domain_latency.astype(float)]),
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
        "uplink_total": float(totals.max()) if totals.size and (totals > 0).all() else math.inf,
        "nic_bw": float(topo.gpu_nic_bw[net].max(initial=0.0)),
        "nic_lat": float(topo.gpu_nic_latency[net].min(initial=math.inf)),
        "uplink_bw": float(topo.leaf_spine_bw[finite_up].max()) if finite_up.any() else math.inf,
        "uplink_lat": float(topo.leaf_spine_latency[finite_up].min()) if finite_up.any() else 0.0,
        "core_bw": float(finite_core.max()) if finite_core.size else math.inf,
        "core_lat": float(topo.pod_core_latency.min()) if topo.pod_core_latency.size else 0.0,
        "min_peak_tflops": float(topo.node_peak_tflops.min()),
    }
    layout = _Layout(
        dom_class=dom_class.ravel().astype(np.int64),
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
    )


def _descending(counts: tuple) -> np.ndarray:
    """The values of ((value, multiplicity), ...) counts, one per region, largest first."""
    values = [v for v, _ in counts]
    return np.repeat(np.array(values, dtype=np.int64), [m for _, m in counts])[::-1].copy()


def _build(constants: dict, key: tuple) -> _Capacity:
    fit_tuple, counts, region_leaves, rails, rail_counts, region_fills = key
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


def gap(predicted_comm_ms: float, bound_comm_ms: float) -> float:
    """How far a placement is from the bound: predicted comm_ms / bound comm_ms (a ratio >= 1 for
    a valid bound); 1.0 when both are 0, inf when only the bound is 0."""
    if bound_comm_ms > 0:
        return predicted_comm_ms / bound_comm_ms
    return 1.0 if predicted_comm_ms == 0 else math.inf


def _network(cap: _Capacity, level: str) -> tuple[float, float]:
    # Best bandwidth (GB/s) and latency (us) between two domains whose path crosses `level`.
    bw, lat = cap.nic_bw, 2 * cap.nic_lat
    if level in ("spine", "core"):
        bw, lat = min(bw, cap.uplink_bw), lat + 2 * cap.uplink_lat
    if level == "core":
        bw, lat = min(bw, cap.core_bw), lat + 2 * cap.core_lat
    return bw, lat


def _domain_fit(cap: _Capacity, block: int) -> tuple[float, float]:
    """Best bandwidth (GB/s) and lowest latency (us) among the domains with >= `block` (free) GPUs."""
    hit = cap.fits.get(block)
    if hit is None:
        fits = cap.fit_gpus >= block
        hit = cap.fits[block] = (float(cap.fit_bw[fits].max()), float(cap.fit_lat[fits].min()))
    return hit


def _flat(collective: str, n: int, nbytes: float, bw, lat):
    """Time (ms) of a collective whose every member pair has at least `bw` GB/s and `lat` us
    (scalars, or arrays priced element by element)."""
    if collective == "volume":
        return volume_ms(nbytes, bw)
    if collective == "p2p":
        return p2p_ms(nbytes, bw, lat)
    return FLAT_FORMS[collective](n, nbytes, bw, lat)


def _splits(cap: _Capacity, n: int, block0: int, shared0: int):
    """(m, k, rails) int arrays: each count m of domains an n-member allreduce could span, the
    fewest members its fullest domain can hold and the most rails it can have, when each domain
    holds whole nvlink blocks of `block0` ranks meeting the group in `shared0` (module docstring,
    free splits)."""
    room = np.minimum(n, shared0 * (cap.domain_free // block0))
    room = room[room > 0]
    rails = cap.domain_rails
    if room.sum() < n or room.size < 2:
        # No placement spans domains so (a job larger than the cluster): add domains like the largest.
        top = min(n, shared0 * max(cap.region_gpus[0] // block0, 1))
        room = np.concatenate([room, np.full(n, top, dtype=np.int64)])
        rails = np.concatenate([rails, np.full(n, cap.max_domain_rails, dtype=np.int64)])
    total = np.concatenate([[0], np.cumsum(room)])
    m = np.arange(max(2, int(np.searchsorted(total, n))), min(n, room.size) + 1)
    # Water-filling the m roomiest domains: the least fullest-domain count k that holds n.
    ks = np.arange(1, int(room[0]) + 1)
    at_least = np.searchsorted(-room, -ks, side="right")
    top_m = np.minimum(at_least[None, :], m[:, None])
    held = ks[None, :] * top_m + total[m][:, None] - total[top_m]
    k = ks[np.argmax(held >= n, axis=1)]
    rails_m = np.zeros(m.size, dtype=np.int64)
    has = m <= rails.size
    rails_m[has] = rails[m[has] - 1]
    return m, k, np.clip(np.minimum(np.minimum(n // m, room[m - 1]), rails_m), 1, None)


def _spanning(cap: _Capacity, collective: str, n: int, nbytes: float, split: tuple, flows: int):
    """[(time ms, GB/s)] at leaf, spine and core of an n-rank group spread over NVLink domains
    (an allreduce's `split`: its nvlink block and the ranks each block shares with it), with
    `flows` of its kind's flows on one leaf (0: unknown). An allreduce takes its best split over
    the free domains (`_splits`)."""
    nets = [_network(cap, level) for level in ("leaf", "spine", "core", "spine")]
    bw = np.array([b for b, _ in nets])[:, None]
    lat = np.array([a for _, a in nets])[:, None]
    if collective == "allreduce":
        m, k, rails = _splits(cap, n, *split)
        bw = np.broadcast_to(bw, (4, m.size)).copy()
        if flows:
            # Row 3: the congested group's fair share of its leaf's uplinks, per rail.
            bw[3] = np.minimum(bw[3], cap.uplink_total / (flows * rails))
        t = np.asarray(
            hierarchical_allreduce_ms(k, m, nbytes, cap.intra_bw, cap.intra_lat, bw, lat, rails=rails)
        )
        best = np.argmin(t, axis=1).tolist()
        rows = [
            (float(t[j, i]), min(float(bw[j, i]), cap.intra_bw if k[i] > 1 else math.inf))
            for j, i in enumerate(best)
        ]
    else:
        bw = bw[:, 0]
        if flows:
            bw[3] = min(bw[3], cap.uplink_total / flows)
        t = np.broadcast_to(_flat(collective, n, nbytes, bw, lat[:, 0]), bw.shape)
        rows = [(float(x), float(b)) for x, b in zip(t.tolist(), bw.tolist(), strict=True)]
    # At core the worst group is at least the pod-crossing one and at least the congested one.
    return [rows[0], rows[3], (max(rows[2][0], rows[3][0]), min(rows[2][1], rows[3][1]))]


def _grid_blocks(job: JobSpec) -> list[int]:
    """Ranks in the block spanned by each set of grid dimensions (index: a bit mask of _DIM_BITS)."""
    sizes = {"tp": job.tp, "pp": job.pp, "ep": job.ep, "dpo": job.dp // job.ep}
    return [math.prod(size for dim, size in sizes.items() if mask & _DIM_BITS[dim]) for mask in range(16)]


@functools.lru_cache(maxsize=64)
def _most_cells(n1: int, n2: int, room: int) -> np.ndarray:
    """[X1, X2] -> the most blocks a leaf region with room for `room` blocks can hold of an
    n1 x n2 grid of leaf-kind blocks (K1's cosets: n2 lines of n1 blocks; K2's: n1 lines of n2)
    while meeting at most X1 K1 lines and X2 K2 lines it does not contain (module docstring, two
    kinds crossing together)."""
    f1 = np.arange(n2 + 1)[:, None]  # K1 lines held whole
    f2 = np.arange(n1 + 1)[None, :]  # K2 lines held whole
    out = np.zeros((n2 + 1, n1 + 1), dtype=np.int64)
    for x1_max in range(n2 + 1):
        x1 = np.minimum(x1_max, n2 - f1)
        for x2_max in range(n1 + 1):
            x2 = np.minimum(x2_max, n1 - f2)
            a, b = x1 + f1, x2 + f2
            # A whole K1 line meets every K2 line, and a whole K2 line every K1 line.
            ok = ((f1 == 0) | (b == n1)) & ((f2 == 0) | (a == n2))
            # The whole lines alone must fit the region.
            ok &= f1 * n1 + f2 * n2 - f1 * f2 <= room
            cells = np.minimum(
                a * b, np.minimum(f1 * n1 + x1 * np.minimum(b, n1 - 1), f2 * n2 + x2 * np.minimum(a, n2 - 1))
            )
            out[x1_max, x2_max] = min(int(cells[ok].max(initial=0)), room)
    return out


class _Prices:
    """Prices of a job's comm entries; one collective's price is memoised per topology on what it
    depends on: the level, the nvlink block (in-domain; an allreduce's also when it spans domains),
    and the flows on one leaf."""

    def __init__(self, topo: Topology, cap: _Capacity, job: JobSpec, sizes: dict[str, int]):
        self.topo, self.cap, self.sizes = topo, cap, sizes
        self.entries = {
            k: [(i, e) for i, e in enumerate(job.comm) if e.group == k and e.bytes > 0] for k in GROUP_KINDS
        }
        self.kinds: dict[tuple, float] = {}

    def entry(
        self, e, level: int, block0: int, shared0: int, block1: int = 0, shared1: int = 1, lines: int = 1
    ):
        """(ms with count, bottleneck GB/s) of comm entry e at LEVELS[level]. The nvlink kinds span
        blocks of `block0` ranks meeting each of its groups in `shared0`; at spine and core the
        leaf kinds' blocks of `block1` ranks meet each group in `shared1`, and `lines` crossing
        cosets of such blocks meet one leaf region (module docstring, own flows)."""
        cap, n = self.cap, self.sizes[e.group]
        if level == 0:
            key = (e.collective, n, e.bytes, _domain_fit(cap, block0))
        else:
            flows = 0
            if level >= 2 and block1 and math.isfinite(cap.uplink_total):
                per_block = block1 if e.collective in ("alltoall", "volume") else block1 // shared1
                flows = -(-per_block * lines // cap.region_leaves)
            split = (block0, shared0) if e.collective == "allreduce" else ()
            key = (e.collective, n, e.bytes, split, flows)
        hit = cap.prices.get(key)
        if hit is None:
            if len(cap.prices) > _MEMO_SIZE:
                cap.prices.clear()
            if level == 0:
                bw, lat = key[3]
                hit = [(float(_flat(e.collective, n, e.bytes, bw, lat)), bw)]
            elif cap.nic_bw <= 0:
                # Standalone nodes only: a group that leaves its domain cannot communicate at all.
                hit = [(math.inf, 0.0)] * 3
            else:
                hit = _spanning(cap, e.collective, n, e.bytes, key[3], key[4])
            cap.prices[key] = hit
        t, bw = hit[max(level - 1, 0)]
        return t * e.count, bw

    def kind(self, k: str, level: int, *context: int) -> float:
        """Total ms of kind k's entries at LEVELS[level] (context as for `entry`)."""
        key = (k, level, context)
        total = self.kinds.get(key)
        if total is None:
            total = self.kinds[key] = sum(self.entry(e, level, *context)[0] for _, e in self.entries[k])
        return total


def _best_assignment(topo: Topology, cap: _Capacity, job: JobSpec, sizes: dict[str, int]):
    """({kind: (level, bottleneck GB/s)}, {entry index: ms}) of the cheapest feasible assignment."""
    prices = _Prices(topo, cap, job, sizes)
    kinds = [k for k in GROUP_KINDS if sizes[k] > 1 and prices.entries[k]]
    r = len(kinds)
    blocks = _grid_blocks(job)
    bits = [_KIND_DIMS[k] for k in kinds]
    caps = cap.region_gpus

    def mask_of(subset: int) -> int:
        out = 0
        for j in range(r):
            out |= bits[j] if subset >> j & 1 else 0
        return out

    def context(j: int, level: int, mask0: int, mask1: int, lines: int = 1) -> tuple[int, ...]:
        # What kind j's price depends on: the nvlink block, and at spine/core the leaf block.
        ctx = (blocks[mask0], blocks[bits[j] & mask0])
        if level >= 2:
            ctx += (blocks[mask1], blocks[bits[j] & mask1], lines)
        return ctx

    def together(rest: list[int], levels: tuple, mask0: int, mask1: int):
        # (ms, {kind: lines}) of two kinds crossing leaf regions only together; None: no grid.
        if len(rest) != 2 or not math.isfinite(cap.uplink_total) or cap.nic_bw <= 0:
            return None
        (j1, j2), block1 = rest, blocks[mask1]
        d1, d2 = bits[j1] & ~mask1, bits[j2] & ~mask1
        if not d1 or not d2 or d1 & d2 or blocks[mask1 | d1 | d2] != job.gpus:
            return None
        n1, n2 = blocks[mask1 | d1] // block1, blocks[mask1 | d2] // block1
        if n1 * n2 > _GRID_CELLS or n1 * n2 * block1 <= caps[1]:
            return None
        # A region holds whole leaf blocks made of whole nvlink blocks, each in one of its domains.
        block0 = blocks[mask0]
        per = block1 // block0
        held = [(sum(f // block0 for f in fill) // per, m) for fill, m in cap.region_fills]
        room = [(_most_cells(n1, n2, c), m) for c, m in held if c > 0]
        p1 = [
            prices.kind(kinds[j1], levels[0], *context(j1, levels[0], mask0, mask1, x)) for x in range(n2 + 1)
        ]
        p2 = [
            prices.kind(kinds[j2], levels[1], *context(j2, levels[1], mask0, mask1, x)) for x in range(n1 + 1)
        ]
        out = None
        for x1 in range(1, n2 + 1):
            for x2 in range(1, n1 + 1):
                t = p1[x1] + p2[x2]
                if (out is None or t < out[0]) and sum(most[x1, x2] * m for most, m in room) >= n1 * n2:
                    out = (t, {j1: x1, j2: x2})
        return out

    best, best_levels, best_lines = math.inf, (3,) * r, {}
    # Kinds inside NVLink domains (s0), then inside leaf regions (s1), the rest at spine or core.
    for s0 in range(1 << r):
        mask0 = mask_of(s0)
        if not cap.room(0, blocks[mask0], job.gpus):
            continue
        cost0 = sum(prices.kind(kinds[j], 0, *context(j, 0, mask0, 0)) for j in range(r) if s0 >> j & 1)
        for s1 in range(1 << r):
            if s1 & s0 or cost0 >= best:
                continue
            mask1 = mask0 | mask_of(s1)
            if not cap.room(1, blocks[mask1], job.gpus):
                continue
            cost1 = cost0 + sum(
                prices.kind(kinds[j], 1, *context(j, 1, mask0, mask1)) for j in range(r) if s1 >> j & 1
            )
            rest = [j for j in range(r) if not (s0 | s1) >> j & 1]
            at = {
                j: [prices.kind(kinds[j], lv, *context(j, lv, mask0, mask1)) for lv in (2, 3)] for j in rest
            }
            for levels in itertools.product((2, 3), repeat=len(rest)):
                cost, mask2, lines = cost1, mask1, {}
                for j, lv in zip(rest, levels, strict=True):
                    cost += at[j][lv - 2]
                    mask2 |= bits[j] if lv == 2 else 0
                if cost >= best or not cap.room(2, blocks[mask2], job.gpus):
                    continue
                pair = together(rest, levels, mask0, mask1)
                if pair is not None:
                    cost, lines = cost1 + pair[0], pair[1]
                if cost < best:
                    best, best_lines = cost, lines
                    chosen = dict(zip(rest, levels, strict=True))
                    best_levels = tuple(
                        0 if s0 >> j & 1 else 1 if s1 >> j & 1 else chosen[j] for j in range(r)
                    )
    mask0 = mask_of(sum(1 << j for j in range(r) if best_levels[j] == 0))
    mask1 = mask0 | mask_of(sum(1 << j for j in range(r) if best_levels[j] == 1))
    levels_bw: dict[str, tuple[str, float]] = {}
    per_entry: dict[int, float] = {}
    for j, (k, lv) in enumerate(zip(kinds, best_levels, strict=True)):
        bw_min = math.inf
        for i, e in prices.entries[k]:
            per_entry[i], bw = prices.entry(e, lv, *context(j, lv, mask0, mask1, best_lines.get(j, 1)))
            bw_min = min(bw_min, bw)
        levels_bw[k] = (LEVELS[lv], bw_min)
    return levels_bw, per_entry


def lower_bound(topology: Topology, job: JobSpec, *, free: np.ndarray | None = None) -> Prediction:
    """A Prediction no placement of `job` on `topology` can beat, with no other job's flows: every
    communicating kind priced at its level in the cheapest feasible joint assignment (module
    docstring). `free` (bool per gid, True: free) bounds the placements on those GPUs only, with
    every region's capacity its free GPU count; None means the empty cluster. Times in ms;
    `entry_ms` per comm entry (count included); `groups` gives each group its kind's level and
    bottleneck (GB/s); MFU uses the cluster's lowest peak, so it is an upper bound.
    Raises ValueError (naming `free`) for a mask of the wrong shape or dtype, or one with fewer
    free GPUs than the job needs: no placement exists to bound."""
    if free is None:
        cap = _capacity(topology)
    else:
        mask = free_array(topology, free)
        n_free = int(mask.sum())
        if job.gpus > n_free:
            raise ValueError(f"free: job {job.name!r} needs {job.gpus} GPUs, {n_free} are free")
        cap = _capacity(topology, mask)
    hit = cap.bounds.get(job)
    if hit is None:
        if len(cap.bounds) > _BOUNDS_SIZE:
            cap.bounds.clear()
        hit = cap.bounds[job] = _lower_bound(topology, cap, job)
    # A fresh flows dict, so that no caller can alter the memoised Prediction.
    return replace(hit, flows={})


def _lower_bound(topology: Topology, cap: _Capacity, job: JobSpec) -> Prediction:
    arrays = group_arrays(job)
    sizes = {k: int(arrays[k].shape[1]) for k in GROUP_KINDS}
    chosen, per_entry = _best_assignment(topology, cap, job, sizes)
    entry_ms = [per_entry.get(i, 0.0) for i in range(len(job.comm))]
    kind_time: dict[str, float] = {}
    for i, entry in enumerate(job.comm):
        kind_time[entry.group] = kind_time.get(entry.group, 0.0) + entry_ms[i]
    comm = float(sum(entry_ms))
    step = step_ms(job.compute_ms, job.overlap, comm)
    top_bw = float(topology.domain_bw.max())
    groups = []
    for kind, t in kind_time.items():
        # A kind that does not communicate is shown where it would fit alone.
        level, bw = chosen.get(kind) or (_smallest(cap, sizes[kind]), top_bw)
        groups.extend(GroupCost(kind, tuple(r), level, bw, t) for r in arrays[kind].tolist())
    return Prediction(
        comm_ms=comm,
        step_ms=step,
        mfu=mfu(job.flops_per_step, step, job.gpus * cap.min_peak_tflops),
        groups=tuple(groups),
        flows={},
        entry_ms=tuple(entry_ms),
    )
