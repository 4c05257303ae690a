"""Lower bound on a job's communication per step, joint over its group kinds, on the empty cluster.

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
the bound is still defined for a job larger than the cluster, though no placement exists).

Pricing, and why it is low enough. An entry costs its slowest group. Under the placement's own
assignment every group of K at `nvlink` sits in one domain holding whole blocks of the nvlink kinds
(priced over the domains that large: best bandwidth, lowest latency), and some group of K at a
higher level lies outside every region of the level below: at `leaf` it spans domains (best NIC,
two NIC latencies); at `spine` it also crosses leaves without being rail-aligned (a rail-aligned
group's domains share a leaf, so they lie in one leaf region): the best uplink and two uplink
latencies join in; at `core` it crosses pods: the best core uplink joins in. An allreduce spanning
m domains is hierarchical with at least ceil(n/m) members in its fullest domain and at most
floor(n/m) rails; each domain holds whole blocks of the nvlink kinds (B0 ranks), each meeting the
group in c ranks (the product of their shared dimensions), so at most c*floor(cap(nvlink)/B0)
members share a domain; it is priced at the best such m. `costmodel.evaluate` can only match or
exceed each term (other jobs' flows only lower bandwidth), so no placement's comm time is below.

The job's own flows. Let S1 be the kinds at or below leaf (blocks of B1 ranks). When S1 and K
together span a block larger than cap(leaf), no group of K fits in one leaf region: the S1 blocks a
K group meets make up one such block, and each S1 block lies in one region. Each S1 block then
meets B1/c1 distinct groups of K (c1: the product of the dimensions K shares with S1), each
leaving the block's region and so putting a flow on one of its leaves (lambda at most): a ring on
every leaf it spans, a p2p chain on its hop out of the region, an alltoall or volume group one per
member GPU (B1 of them). Some leaf thus carries q = ceil(flows / lambda) of the entry's flows, and
a group there gets at most T/q GB/s (T: the largest leaf's total uplinks), per rail T/(q*rails)
for the allreduce with the fewest rails there. K at `spine` is priced at that share; K at `core` at
the worse of its pod-crossing group (uncongested) and the congested one. Kinds that overflow a leaf
region only together (PP and DP both leaving it) are priced without their own flows.

gap = predicted comm_ms / bound comm_ms, 1.0 when both are 0 (`gap`).
"""

from __future__ import annotations

import itertools
import math
import weakref
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
    """What the empty cluster offers per level: region sizes (GPUs), best bandwidth (GB/s), latency (us)."""

    domain_gpus: np.ndarray  # GPUs per NVLink domain
    region_gpus: tuple[int, int, int]  # largest region at nvlink, leaf, spine
    region_leaves: int  # most leaves serving one leaf region's GPUs
    uplink_total: float  # largest leaf's total uplinks (GB/s), inf where a leaf has none
    max_domain_rails: int  # most distinct NICs in one domain
    intra_bw: float  # best domain holding 2+ GPUs, inf if none
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


_CAPACITY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Memo sizes per topology (entries); a full memo is cleared, as jobs come and go. Bounds hold
# every group of a job, so fewer of them are kept.
_MEMO_SIZE = 4096
_BOUNDS_SIZE = 256


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


def _capacity(topo: Topology) -> _Capacity:
    cap = _CAPACITY.get(topo)
    if cap is not None:
        return cap
    n_dom = len(topo.domain_names)
    dom_gpus = np.bincount(topo.gpu_domain, minlength=n_dom)
    net = topo.gpu_leaf >= 0
    dom_net = topo.gpu_domain[net].astype(np.int64)
    ids, _ = nic_ids(topo)
    dom_nic = np.unique(np.stack([dom_net, ids[net]]), axis=1)
    big = dom_gpus >= 2
    leaf_region = _regions(n_dom, dom_net, topo.gpu_leaf[net].astype(np.int64))
    pod_region = _regions(n_dom, dom_net, topo.gpu_pod[net].astype(np.int64))
    region_leaf = np.unique(np.stack([leaf_region[dom_net], topo.gpu_leaf[net].astype(np.int64)]), axis=1)
    used = np.unique(topo.gpu_leaf[net])
    totals = topo.leaf_uplink_total_bw[used]
    finite_up = np.isfinite(topo.leaf_spine_bw)
    finite_core = topo.pod_core_bw[np.isfinite(topo.pod_core_bw)]
    cap = _Capacity(
        domain_gpus=dom_gpus,
        region_gpus=(
            int(dom_gpus.max(initial=0)),
            int(np.bincount(leaf_region[topo.gpu_domain]).max(initial=0)),
            int(np.bincount(pod_region[topo.gpu_domain]).max(initial=0)),
        ),
        region_leaves=int(np.bincount(region_leaf[0]).max(initial=1)) if region_leaf.size else 1,
        uplink_total=float(totals.max()) if totals.size and (totals > 0).all() else math.inf,
        max_domain_rails=int(np.bincount(dom_nic[0]).max(initial=1)) if dom_nic.size else 1,
        intra_bw=float(topo.domain_bw[big].max()) if big.any() else math.inf,
        intra_lat=float(topo.domain_latency[big].min()) if big.any() else 0.0,
        nic_bw=float(topo.gpu_nic_bw[net].max(initial=0.0)),
        nic_lat=float(topo.gpu_nic_latency[net].min(initial=math.inf)),
        uplink_bw=float(topo.leaf_spine_bw[finite_up].max()) if finite_up.any() else math.inf,
        uplink_lat=float(topo.leaf_spine_latency[finite_up].min()) if finite_up.any() else 0.0,
        core_bw=float(finite_core.max()) if finite_core.size else math.inf,
        core_lat=float(topo.pod_core_latency.min()) if topo.pod_core_latency.size else 0.0,
        min_peak_tflops=float(topo.node_peak_tflops.min()),
    )
    _CAPACITY[topo] = cap
    return cap


def region_gpus(topo: Topology) -> dict[str, int]:
    """cap(L) per level, in GPUs: the largest NVLink domain, leaf region, pod, and the whole cluster."""
    caps = _capacity(topo).region_gpus
    return {"nvlink": caps[0], "leaf": caps[1], "spine": caps[2], "core": topo.n_gpus}


def smallest_level(topo: Topology, n: int) -> str:
    """The lowest level whose largest region has >= n GPUs: nvlink, leaf, spine or core."""
    for level, size in zip(LEVELS, _capacity(topo).region_gpus, strict=False):
        if size >= n:
            return level
    return "core"


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


def _domain_fit(topo: Topology, cap: _Capacity, block: int) -> tuple[float, float]:
    """Best bandwidth (GB/s) and lowest latency (us) among the domains with >= `block` GPUs."""
    hit = cap.fits.get(block)
    if hit is None:
        fits = cap.domain_gpus >= block
        hit = cap.fits[block] = (float(topo.domain_bw[fits].max()), float(topo.domain_latency[fits].min()))
    return hit


def _flat(collective: str, n: int, nbytes: float, bw, lat):
    """Time (ms) of a collective whose every member pair has at least `bw` GB/s and `lat` us
    (scalars, or arrays priced element by element)."""
    if collective == "volume":
        return volume_ms(nbytes, bw)
    if collective == "p2p":
        return p2p_ms(nbytes, bw, lat)
    return FLAT_FORMS[collective](n, nbytes, bw, lat)


def _spanning(cap: _Capacity, collective: str, n: int, nbytes: float, per_domain: int, flows: int):
    """[(time ms, GB/s)] at leaf, spine and core of an n-rank group spread over NVLink domains, at
    most `per_domain` members in one, with `flows` of its kind's flows on one leaf (0: unknown).
    An allreduce takes its best split: m domains, ceil(n/m) in the fullest, floor(n/m) rails."""
    nets = [_network(cap, level) for level in ("leaf", "spine", "core", "spine")]
    bw = np.array([b for b, _ in nets])[:, None]
    lat = np.array([a for _, a in nets])[:, None]
    if collective == "allreduce":
        m = np.arange(max(2, -(-n // per_domain)), n + 1)
        k = -(-n // m)
        rails = np.clip(np.minimum(n // m, cap.max_domain_rails), 1, None)
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


class _Prices:
    """Prices of a job's comm entries; one collective's price is memoised per topology on what it
    depends on: the level, the nvlink block (in-domain) or the most members a domain holds, and the
    flows on one leaf."""

    def __init__(self, topo: Topology, cap: _Capacity, job: JobSpec, sizes: dict[str, int]):
        self.topo, self.cap, self.sizes = topo, cap, sizes
        self.entries = {
            k: [(i, e) for i, e in enumerate(job.comm) if e.group == k and e.bytes > 0] for k in GROUP_KINDS
        }
        self.kinds: dict[tuple, float] = {}

    def entry(self, e, level: int, block0: int, shared0: int, block1: int = 0, shared1: int = 1):
        """(ms with count, bottleneck GB/s) of comm entry e at LEVELS[level]. The nvlink kinds span
        blocks of `block0` ranks meeting each of its groups in `shared0`; at spine and core,
        `block1` > 0 says no group fits a leaf region, whose kinds' blocks of `block1` ranks meet
        each group in `shared1` (module docstring, own flows)."""
        cap, n = self.cap, self.sizes[e.group]
        if level == 0:
            key = (e.collective, n, e.bytes, _domain_fit(self.topo, cap, block0))
        else:
            per_domain = min(n, cap.region_gpus[0], shared0 * max(cap.region_gpus[0] // block0, 1))
            flows = 0
            if level >= 2 and block1 and math.isfinite(cap.uplink_total):
                per_block = block1 if e.collective in ("alltoall", "volume") else block1 // shared1
                flows = -(-per_block // cap.region_leaves)
            key = (e.collective, n, e.bytes, per_domain if e.collective == "allreduce" else 0, flows)
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


def _best_assignment(topo: Topology, job: JobSpec, sizes: dict[str, int]):
    """({kind: (level, bottleneck GB/s)}, {entry index: ms}) of the cheapest feasible assignment."""
    cap = _capacity(topo)
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

    def context(j: int, level: int, mask0: int, mask1: int) -> tuple[int, ...]:
        # What kind j's price depends on: the nvlink block, and at spine/core the leaf block.
        ctx = (blocks[mask0], blocks[bits[j] & mask0])
        if level >= 2 and blocks[mask1 | bits[j]] > caps[1]:
            ctx += (blocks[mask1], blocks[bits[j] & mask1])
        return ctx

    best, best_levels = math.inf, (3,) * r
    # Kinds inside NVLink domains (s0), then inside leaf regions (s1), the rest at spine or core.
    for s0 in range(1 << r):
        mask0 = mask_of(s0)
        if blocks[mask0] > caps[0]:
            continue
        cost0 = sum(prices.kind(kinds[j], 0, *context(j, 0, mask0, 0)) for j in range(r) if s0 >> j & 1)
        for s1 in range(1 << r):
            if s1 & s0 or cost0 >= best:
                continue
            mask1 = mask0 | mask_of(s1)
            if blocks[mask1] > caps[1]:
                continue
            cost1 = cost0 + sum(
                prices.kind(kinds[j], 1, *context(j, 1, mask0, mask1)) for j in range(r) if s1 >> j & 1
            )
            rest = [j for j in range(r) if not (s0 | s1) >> j & 1]
            at = {
                j: [prices.kind(kinds[j], lv, *context(j, lv, mask0, mask1)) for lv in (2, 3)] for j in rest
            }
            for levels in itertools.product((2, 3), repeat=len(rest)):
                cost, mask2 = cost1, mask1
                for j, lv in zip(rest, levels, strict=True):
                    cost += at[j][lv - 2]
                    mask2 |= bits[j] if lv == 2 else 0
                if cost < best and blocks[mask2] <= caps[2]:
                    best = cost
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
            per_entry[i], bw = prices.entry(e, lv, *context(j, lv, mask0, mask1))
            bw_min = min(bw_min, bw)
        levels_bw[k] = (LEVELS[lv], bw_min)
    return levels_bw, per_entry


def lower_bound(topology: Topology, job: JobSpec) -> Prediction:
    """A Prediction no placement of `job` on `topology` can beat, on the empty cluster (no other
    job's flows): every communicating kind priced at its level in the cheapest feasible joint
    assignment (module docstring). Times in ms; `entry_ms` per comm entry (count included); `groups`
    gives each group its kind's level and bottleneck (GB/s); MFU uses the cluster's lowest peak, so
    it is an upper bound."""
    cap = _capacity(topology)
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
    chosen, per_entry = _best_assignment(topology, job, sizes)
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
        level, bw = chosen.get(kind) or (smallest_level(topology, sizes[kind]), top_bw)
        groups.extend(GroupCost(kind, tuple(r), level, bw, t) for r in arrays[kind].tolist())
    return Prediction(
        comm_ms=comm,
        step_ms=step,
        mfu=mfu(job.flops_per_step, step, job.gpus * cap.min_peak_tflops),
        groups=tuple(groups),
        flows={},
        entry_ms=tuple(entry_ms),
    )
