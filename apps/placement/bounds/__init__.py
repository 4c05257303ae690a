"""Lower bound on a job's communication per step, joint over its group kinds, on the empty cluster
or on a given set of free GPUs.

Regions, cap(L) and free GPUs: `capacity`. Pricing, the job's own flows and two kinds crossing
together: `prices`.

The bound gives each group kind K that communicates (tp, pp, dp, ep, cp with a non-empty comm entry and
groups of 2+ ranks) a level l(K), keeps the assignments that are feasible and takes the cheapest:
the sum of its comm entries, each priced at its kind's level (`prices`). At most 4^5 assignments.

Feasibility, and why it is necessary. Take any placement and let l(K) be the lowest level at which
every group of K lies inside one region. Fix a level L and let S be the kinds with l(K) <= L. Link
two ranks when they share a group of a kind in S; each link joins two ranks in one L-region and the
regions are disjoint, so every connected set of linked ranks lies inside one L-region. On the
Megatron grid a group of K is the set of ranks that agree on every coordinate outside K's dimensions
(tp: tp; pp: pp; cp: cp; ep: the expert index; dp: the expert index and dp_index), so a connected set is the
set of ranks that agree outside the union of S's dimensions: a block of the product of those
dimensions' sizes (an EP group lies inside its DP group, so ep adds nothing once dp is in S). Hence
every placement's own assignment satisfies block(S) <= cap(L) at every level L below core (at core
the bound is still defined for a job larger than the cluster, though no placement exists). More: the
job's ranks split into gpus/block(S) such blocks, disjoint, each inside one L-region, and a region
of g GPUs holds at most floor(g/block(S)) of them, so the sum of floor(g/block(S)) over L's regions
is at least gpus/block(S) (`_Capacity.room`; for a job larger than the cluster, block(S) <= cap(L)).

gap = predicted comm_ms / bound comm_ms, 1.0 when both are 0 (`gap`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from ..costmodel import GroupCost, Prediction, mfu, most_hidden_share, pipeline_compute_ms, step_ms
from ..costmodel.speed import allowed, at_rate, reference_rate
from ..groups import group_arrays
from ..jobs import GROUP_KINDS, JobSpec
from ..topology import LEVELS, Topology
from .capacity import (
    _BOUNDS_SIZE,
    _Capacity,
    _capacity,
    _smallest,
    free_array,
    region_gpus,
    smallest_level,
)
from .prices import _GRID_CELLS, _KIND_DIMS, _grid_blocks, _most_cells, _Prices

__all__ = [
    "free_array",
    "gap",
    "lower_bound",
    "region_gpus",
    "smallest_level",
    # What the bound's tests inspect: the capacities and the grid cut.
    "_capacity",
    "_most_cells",
]


def gap(predicted_comm_ms: float, bound_comm_ms: float) -> float:
    """How far a placement is from the bound: predicted comm_ms / bound comm_ms (a ratio >= 1 for
    a valid bound); 1.0 when both are 0, inf when only the bound is 0."""
    if bound_comm_ms > 0:
        return predicted_comm_ms / bound_comm_ms
    return 1.0 if predicted_comm_ms == 0 else math.inf


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
    mask = None
    if free is None:
        cap = _capacity(topology)
    else:
        mask = free_array(topology, free)
        n_free = int(mask.sum())
        if job.gpus > n_free:
            raise ValueError(f"free: job {job.name!r} needs {job.gpus} GPUs, {n_free} are free")
        cap = _capacity(topology, mask)
    job = _at_fastest(topology, job, mask)
    hit = cap.bounds.get(job)
    if hit is None:
        if len(cap.bounds) > _BOUNDS_SIZE:
            cap.bounds.clear()
        hit = cap.bounds[job] = _lower_bound(topology, cap, job)
    # A fresh flows dict, so that no caller can alter the memoised Prediction.
    return replace(hit, flows={})


def _at_fastest(topology: Topology, job: JobSpec, mask: np.ndarray | None) -> JobSpec:
    """`job` with its compute time on the fastest GPU it may run on (among `mask`'s): no placement
    computes faster (`costmodel.speed`)."""
    if len(topology.model_rates) == 1 and job.reference_model is None:
        return job
    ok = allowed(topology, job)
    if mask is not None:
        ok = mask if ok is None else ok & mask
    rates = topology.node_rate[topology.gpu_node] if ok is None else topology.node_rate[topology.gpu_node[ok]]
    return at_rate(topology, job, float(rates.max()) if rates.size else reference_rate(topology, job))


def _lower_bound(topology: Topology, cap: _Capacity, job: JobSpec) -> Prediction:
    arrays = group_arrays(job)
    sizes = {k: int(arrays[k].shape[1]) for k in GROUP_KINDS}
    chosen, per_entry = _best_assignment(topology, cap, job, sizes)
    entry_ms = [per_entry.get(i, 0.0) for i in range(len(job.comm))]
    kind_time: dict[str, float] = {}
    for i, entry in enumerate(job.comm):
        kind_time[entry.group] = kind_time.get(entry.group, 0.0) + entry_ms[i]
    comm = float(sum(entry_ms))
    # Entries overlap compute by their own shares, and the cheapest assignment of comm need not be
    # the cheapest of the exposed part: the most any entry hides bounds what all of it can.
    # Under 1F1B a pipeline entry hides all but its sends on the fill and drain.
    most_hidden = max((most_hidden_share(job, e) for e in job.comm), default=job.overlap)
    step = step_ms(pipeline_compute_ms(job), most_hidden, comm)
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
