"""Prices of comm entries at each level (nvlink, leaf, spine, core), and the grid cut of two kinds
crossing leaf regions together.

Pricing, and why it is low enough. An entry costs its slowest group. Under the placement's own
assignment every group of K at `nvlink` sits in one domain holding whole blocks of the nvlink kinds
(priced over the domains that large: best bandwidth, lowest latency, best NVLS efficiency, as NCCL
runs it there: `costmodel.domain_ms`, which falls as each of the three improves), and some group of K at a
higher level lies outside every region of the level below: at `leaf` it spans domains (best NIC,
two NIC latencies); at `spine` it also crosses leaves without being rail-aligned (a rail-aligned
group's domains share a leaf, so they lie in one leaf region): the best uplink and two uplink
latencies join in; at `core` it crosses pods: the best core uplink joins in. An allreduce,
allgather or reduce-scatter spanning m domains costs the lesser of its hierarchical form (its
fullest domain's k members work inside the domain, a ring joins the m domains over its fewest
rails r, S/r each) and the pipelined one (B = min(NVLink, r x NIC), a tree's depth over m for
allreduce; no NVLink stage when k = 1); each rises with k and m and falls with r. Each domain holds whole blocks of the nvlink kinds (B0 ranks), each meeting the group in c ranks
(the product of their shared dimensions), so domain d holds at most a_d = min(n, c*floor(g_d/B0))
members (g_d its GPUs). Free splits: with the a_d largest first, m domains hold the n members only
if the m largest sum to n or more; their fullest then holds at least the least k with
sum(min(a_(i), k), i <= m) >= n, since no m domains hold more than the m largest at k each (the
greedy cover by count is the best cover); and r is at most floor(n/m), a_(m) and the m-th most NICs
in one domain (the smallest of any m domains' values is at most the m-th largest). So each m's
price is at most every m-domain placement's, and the collective is priced at the best m. An
alltoall spanning m domains has a member with at most n // m peers in its domain, so it sends at
least (n - n // m) / n of S through its NIC: priced at the fewest domains that can hold the group.
`costmodel.evaluate` can only match or exceed each term (other jobs' flows only lower bandwidth),
so no placement's comm time is below.

Capacity (`_Prices.floor`). The prices above take the best domain and the fastest NIC for every
group, though an entry costs its slowest group and the fast domains may not hold them all (PCIe or
cube-mesh nodes beside NVLink nodes, slow NICs beside fast ones). So each entry is also priced at
the least price P such that the free GPUs usable by groups of at most P hold the job. A group of
K whole in a domain costs at least the flat collective at the domain class's best n-subset rate
(p_in); a group of a hierarchical collective (allreduce, allgather, reduce-scatter) across domains
runs its network phase at its slowest member's NIC rate or less, and a member x in domain d has
either another member in d (the NVLink stage at d's class's best pair rate or less) or none (the
group's fewest rails per domain is 1), so the group costs at least sigma(x), the lesser of the
spanning prices under those caps with x's NIC rate. If no group costs more than P, domain d gives
the job at most all its free GPUs when sigma(its fastest free NIC) <= P (sigma falls as the rate
rises), else floor(g_d/n)*n when p_in <= P (whole groups only), else none; at nvlink only whole
blocks of B0 ranks in domains with p_in <= P. The job's GPUs must fit, so the least such P among
the finitely many p_in and sigma values is at most every placement's slowest group.

The job's own flows. Let S1 be the kinds at or below leaf (blocks of B1 ranks; each S1 block lies
in one leaf region). The groups of K meeting an S1 block all meet the same S1 blocks (those that
agree with it outside S1's and K's dimensions: K's coset, or line, through the block), so when K
is at `spine` or above, some line's groups all leave a region: the B1/c1 distinct groups of K
through each of its blocks (c1: the product of the dimensions K shares with S1) each put a flow on
one of that block's region's leaves (lambda at most): a ring on every leaf it spans, a p2p chain
on its hop out of the region, an alltoall or volume group one per member GPU (B1 per block). A
region meeting x such crossing lines thus has q = ceil(x * flows / lambda) of the entry's flows
on one leaf, and a group there gets at most T/q GB/s (T: the largest leaf's total uplinks), per
rail T/(q*rails) for the hierarchical collective with the fewest rails there. K at `spine` is priced at that
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
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..costmodel import (
    FLAT_FORMS,
    HIERARCHICAL_FORMS,
    alltoall_spanning_ms,
    domain_ms,
    p2p_ms,
    spanning_ms,
    volume_ms,
)
from ..jobs import GROUP_KINDS, JobSpec
from ..topology import Topology
from .capacity import _MEMO_SIZE, _Capacity

# Grid dimensions as bits (ep is the expert index, dpo the dp_index) and each kind's dimensions.
_DIM_BITS = {"tp": 1, "pp": 2, "ep": 4, "dpo": 8, "cp": 16}
_KIND_DIMS = {"tp": 1, "pp": 2, "ep": 4, "dp": 4 | 8, "cp": 16}
# Largest grid of leaf blocks two kinds crossing together are counted over (blocks); beyond, 1 line.
_GRID_CELLS = 1024


def _network(cap: _Capacity, level: str, nic_bw: float | None = None) -> tuple[float, float]:
    # Best bandwidth (GB/s) and latency (us) between two domains whose path crosses `level`
    # (through NICs of at most `nic_bw`, default the fastest).
    bw, lat = cap.nic_bw if nic_bw is None else min(nic_bw, cap.nic_bw), 2 * cap.nic_lat
    if level in ("spine", "core"):
        bw, lat = min(bw, cap.uplink_bw), lat + 2 * cap.uplink_lat
    if level == "core":
        bw, lat = min(bw, cap.core_bw), lat + 2 * cap.core_lat
    return bw, lat


def _domain_fit(cap: _Capacity, block: int, group: int) -> tuple[float, float, float]:
    """Best bandwidth (GB/s), lowest latency (us) and best NVLS efficiency (0: none) a group of
    `group` GPUs reaches inside a block of `block` (free) GPUs of one domain, over the domains with
    room for the block (each the best of any such domain: `domain_ms` only falls as they improve). On a
    node with intra links that is its best `group`-subset, not its best `block`-subset: the group
    pays only its own pairs (two TP pairs of a 4-GPU block may both be faster than the block's
    slowest pair)."""
    key = (block, group)
    hit = cap.fits.get(key)
    if hit is None:
        fits = cap.fit_gpus >= block
        by_size = cap.fit_bw_by_size
        k = min(group, block)
        bw = by_size[fits, k] if by_size is not None and k < by_size.shape[1] else cap.fit_bw[fits]
        hit = cap.fits[key] = (
            float(bw.max()),
            float(cap.fit_lat[fits].min()),
            float(cap.fit_nvls[fits].max()),
        )
    return hit


def _flat(collective: str, n: int, nbytes: float, bw, lat, nvls: float = 0.0):
    """Time (ms) of a collective whose every member pair has at least `bw` GB/s and `lat` us
    (scalars, or arrays priced element by element); inside one domain (`nvls` its switches' NVLS
    efficiency, 0 without) as NCCL runs it there (`domain_ms`)."""
    if collective == "volume":
        return volume_ms(nbytes, bw)
    if collective == "p2p":
        return p2p_ms(nbytes, bw, lat)
    if nvls > 0:
        return domain_ms(collective, n, nbytes, bw, lat, nvls)
    return FLAT_FORMS[collective](n, nbytes, bw, lat)


def _splits(cap: _Capacity, n: int, block0: int, shared0: int):
    """(m, k, rails) int arrays: each count m of domains an n-member hierarchical collective could span, the
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


def _spanning(
    cap: _Capacity,
    collective: str,
    n: int,
    nbytes: float,
    split: tuple,
    flows: int,
    nic_bw: float | None = None,
    intra_bw: float = math.inf,
    rails: int | None = None,
):
    """[(time ms, GB/s)] at leaf, spine and core of an n-rank group spread over NVLink domains
    (a hierarchical collective's `split`: its nvlink block and the ranks each block shares with it),
    with `flows` of its kind's flows on one leaf (0: unknown), through NICs of at most `nic_bw`
    GB/s (default the fastest), an NVLink stage of at most `intra_bw` and at most `rails` rails
    (default: what the free domains allow). It takes its best split over the free domains
    (`_splits`)."""
    nets = [_network(cap, level, nic_bw) for level in ("leaf", "spine", "core", "spine")]
    bw = np.array([b for b, _ in nets])[:, None]
    lat = np.array([a for _, a in nets])[:, None]
    if collective in HIERARCHICAL_FORMS:
        m, k, most = _splits(cap, n, *split)
        rails = most if rails is None else np.minimum(most, rails)
        bw = np.broadcast_to(bw, (4, m.size)).copy()
        if flows:
            # Row 3: the congested group's fair share of its leaf's uplinks, per rail.
            bw[3] = np.minimum(bw[3], cap.uplink_total / (flows * rails))
        # A split whose fullest domain holds one member has no NVLink stage at all.
        stage = min(cap.intra_bw, intra_bw)
        intra = np.where(k > 1, stage, math.inf)
        t = np.asarray(spanning_ms(collective, n, k, m, nbytes, intra, cap.intra_lat, bw, lat, rails))
        best = np.argmin(t, axis=1).tolist()
        rows = [
            (float(t[j, i]), min(float(bw[j, i]), stage if k[i] > 1 else math.inf))
            for j, i in enumerate(best)
        ]
    else:
        bw = bw[:, 0]
        if flows:
            bw[3] = min(bw[3], cap.uplink_total / flows)
        if collective == "alltoall":
            # Over m >= m_min domains some member has at most n // m_min peers in its domain, so it
            # sends at least (n - n // m_min) / n of S through its NIC; every pair is at latency.
            m_min = int(_splits(cap, n, *split)[0].min())
            t = alltoall_spanning_ms(n, n - n // m_min, nbytes, bw, lat[:, 0])
        else:
            t = np.broadcast_to(_flat(collective, n, nbytes, bw, lat[:, 0]), bw.shape)
        rows = [(float(x), float(b)) for x, b in zip(t.tolist(), bw.tolist(), strict=True)]
    # At core the worst group is at least the pod-crossing one and at least the congested one.
    return [rows[0], rows[3], (max(rows[2][0], rows[3][0]), min(rows[2][1], rows[3][1]))]


def _grid_blocks(job: JobSpec) -> list[int]:
    """Ranks in the block spanned by each set of grid dimensions (index: a bit mask of _DIM_BITS)."""
    sizes = {"tp": job.tp, "pp": job.pp, "ep": job.ep, "dpo": job.dp // job.ep, "cp": job.cp}
    return [math.prod(size for dim, size in sizes.items() if mask & _DIM_BITS[dim]) for mask in range(32)]


@functools.lru_cache(maxsize=1024)
def _most_cells(n1: int, n2: int, room: int) -> np.ndarray:
    """[X1, X2] -> the most blocks a leaf region with room for `room` blocks can hold of an
    n1 x n2 grid of leaf-kind blocks (K1's cosets: n2 lines of n1 blocks; K2's: n1 lines of n2)
    while meeting at most X1 K1 lines and X2 K2 lines it does not contain (module docstring, two
    kinds crossing together)."""
    # Axes: [X1, X2, K1 lines held whole, K2 lines held whole], all at once.
    x1_max = np.arange(n2 + 1)[:, None, None, None]
    x2_max = np.arange(n1 + 1)[None, :, None, None]
    f1 = np.arange(n2 + 1)[None, None, :, None]  # K1 lines held whole
    f2 = np.arange(n1 + 1)[None, None, None, :]  # K2 lines held whole
    x1 = np.minimum(x1_max, n2 - f1)
    x2 = np.minimum(x2_max, n1 - f2)
    a, b = x1 + f1, x2 + f2
    # A whole K1 line meets every K2 line, and a whole K2 line every K1 line.
    ok = ((f1 == 0) | (b == n1)) & ((f2 == 0) | (a == n2))
    # The whole lines alone must fit the region.
    ok &= f1 * n1 + f2 * n2 - f1 * f2 <= room
    cells = np.minimum(
        a * b, np.minimum(f1 * n1 + x1 * np.minimum(b, n1 - 1), f2 * n2 + x2 * np.minimum(a, n2 - 1))
    )
    best = np.where(ok, cells, 0).max(axis=(2, 3))
    return np.minimum(best, room).astype(np.int64)


class _Prices:
    """Prices of a job's comm entries; one collective's price is memoised per topology on what it
    depends on: the level, the nvlink block (in-domain; a hierarchical one's also when it spans domains),
    and the flows on one leaf."""

    def __init__(self, topo: Topology, cap: _Capacity, job: JobSpec, sizes: dict[str, int]):
        self.topo, self.cap, self.sizes, self.gpus = topo, cap, sizes, job.gpus
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
            key = (e.collective, n, e.bytes, _domain_fit(cap, block0, n))
        else:
            flows = 0
            if level >= 2 and block1 and math.isfinite(cap.uplink_total):
                per_block = block1 if e.collective in ("alltoall", "volume") else block1 // shared1
                flows = -(-per_block * lines // cap.region_leaves)
            split = (
                (block0, shared0) if e.collective in HIERARCHICAL_FORMS or e.collective == "alltoall" else ()
            )
            key = (e.collective, n, e.bytes, split, flows)
        hit = cap.prices.get(key)
        if hit is None:
            if len(cap.prices) > _MEMO_SIZE:
                cap.prices.clear()
            if level == 0:
                bw, lat, nvls = key[3]
                hit = [(float(_flat(e.collective, n, e.bytes, bw, lat, nvls)), bw)]
            elif cap.nic_bw <= 0:
                # Standalone nodes only: a group that leaves its domain cannot communicate at all.
                hit = [(math.inf, 0.0)] * 3
            else:
                hit = _spanning(cap, e.collective, n, e.bytes, key[3], key[4])
            cap.prices[key] = hit
        t, bw = hit[max(level - 1, 0)]
        if level == 0 or e.collective in HIERARCHICAL_FORMS:
            t = max(t, self.floor(e, level, block0, shared0))
        # A cp p2p entry is a ring pass: n - 1 steps, each at least one send at this level's price.
        steps = n - 1 if e.group == "cp" and e.collective == "p2p" else 1
        return t * e.count * steps, bw

    def floor(self, e, level: int, block0: int, shared0: int) -> float:
        """The least time (ms, one op) of comm entry e's slowest group that the free GPUs' rates
        allow, when its kind sits at LEVELS[level] with nvlink blocks of `block0` ranks meeting each
        group in `shared0` (module docstring, capacity); 0 when no price fits the job."""
        cap, n = self.cap, self.sizes[e.group]
        spanning = level > 0
        key = ("floor", e.collective, n, e.bytes, spanning, block0, shared0 if spanning else 0, self.gpus)
        hit = cap.prices.get(key)
        if hit is not None:
            return hit
        # GPUs a domain can give the kind when no group may cost more than a price: at nvlink,
        # whole blocks of block0 ranks in domains whose best block0-subset prices it; above,
        # also any of its GPUs for groups across domains, when such a group with a member there
        # may price it.
        lat = float(cap.fit_lat.min())
        by_size = cap.fit_bw_by_size
        across = spanning and cap.nic_bw > 0 and e.collective in HIERARCHICAL_FORMS
        split = (block0, shared0)
        rows = []
        for c, free, rate, mult in cap.domain_kinds:
            whole = (free // (n if spanning else block0)) * (n if spanning else block0)
            bw = by_size[c, n] if by_size is not None and n < by_size.shape[1] else cap.fit_bw[c]
            inside = float(_flat(e.collective, n, e.bytes, bw, lat, cap.fit_nvls[c])) if whole else math.inf
            apart = math.inf
            if across and rate > 0:
                # A member there: with another member in its domain the NVLink stage runs at
                # most at the class's best pair; alone there, the group has one rail.
                pair = by_size[c, 2] if by_size is not None and by_size.shape[1] > 2 else cap.fit_bw[c]
                apart = min(
                    _spanning(cap, e.collective, n, e.bytes, split, 0, rate, intra_bw=pair)[0][0],
                    _spanning(cap, e.collective, n, e.bytes, split, 0, rate, rails=1)[0][0],
                )
            rows.append((inside, whole, float(apart), free, mult))
        out = 0.0
        for price in sorted(({r[0] for r in rows} | {r[2] for r in rows}) - {math.inf}):
            usable = sum(
                m * (free if apart <= price else whole if inside <= price else 0)
                for inside, whole, apart, free, m in rows
            )
            if usable >= self.gpus:
                out = price
                break
        cap.prices[key] = out
        return out

    def kind(self, k: str, level: int, *context: int) -> float:
        """Total ms of kind k's entries at LEVELS[level] (context as for `entry`)."""
        key = (k, level, context)
        total = self.kinds.get(key)
        if total is None:
            total = self.kinds[key] = sum(self.entry(e, level, *context)[0] for _, e in self.entries[k])
        return total
