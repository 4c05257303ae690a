"""Equal domain chunks of any size: the job cut into m pieces of c GPUs, one per NVLink domain,
for every divisor c of its GPU count (not only powers of two), where NVLink domains span several
nodes (NVL72 racks, domains straddling leaves).

A hierarchical collective across domains runs its inter-domain phase once per rail of the
smallest piece, so 4 x 12 over four domains can beat 19 + 19 + 10 over three, and a domain of 24
free GPUs gives 24 + 8 or 3 x 16 only if those sizes are tried. For each divisor c (largest
first, a multiple of the TP group so none straddles domains), the m = n / c domains with room
for c, a window of m consecutive ones in hierarchy order that spans the fewest units; c GPUs
from each (best-fit nodes). The caller prices them with the cost model.
"""

from __future__ import annotations

import numpy as np

from ..jobs import JobSpec
from .base import HierarchyIndex
from .blocks import Free, canonical, take_nodes

# Chunk sizes tried per job, largest first.
CHUNKS_TRIED = 3


def domain_chunk_sets(idx: HierarchyIndex, counts: Free, job: JobSpec) -> list[np.ndarray]:
    """GPU sets (canonical order) of the job in equal pieces over NVLink domains; none on
    clusters whose domains are single nodes (best fit's node chunks cover those)."""
    n = job.gpus
    if idx.max_domain_gpus <= idx.max_node_gpus:
        return []
    group = job.tp * job.cp
    members, off = idx.nodes_of_domain
    # Each domain's first free GPU's place in hierarchy order and its unit.
    first_free = np.full(idx.n_domains, -1, dtype=np.int64)
    doms = idx.gpu_domain[counts.ids]
    order = np.argsort(idx.position[counts.ids], kind="stable")
    first_free[doms[order][::-1]] = counts.ids[order][::-1]
    out: list[np.ndarray] = []
    for c in range(min(n // 2, int(counts.domain.max())), 1, -1):
        if len(out) >= CHUNKS_TRIED:
            break
        if n % c or c % group:
            continue
        m = n // c
        ok = np.flatnonzero(counts.domain >= c)
        if ok.size < m:
            continue
        ok = ok[np.argsort(idx.position[first_free[ok]], kind="stable")]
        units = idx.gpu_unit[first_free[ok]]
        spans = [np.unique(units[k : k + m]).size for k in range(ok.size - m + 1)]
        start = int(np.argmin(spans))
        parts = [take_nodes(idx, counts, members[off[d] : off[d + 1]], c) for d in ok[start : start + m]]
        out.append(canonical(idx, np.concatenate(parts)))
    return out


# Blocks (units, else one pod) whose cells a cover is sought in, the best by fit.
COVER_BLOCKS = 2
# Cells a cover may pick from per block, the largest free first: bounds the knapsack.
COVER_CELLS = 64


def cover_sets(idx: HierarchyIndex, counts: Free, job: JobSpec) -> list[np.ndarray]:
    """GPU sets (canonical order) that cover the job with the free GPUs of as few cells (an NVLink
    domain's part under one unit) as possible, in pieces of any size: a small knapsack over the
    cells' free counts (in whole TP*CP groups) of the best-fitting units, else of the best pod.

    Per block two covers: the fewest cells whose free GPUs sum to exactly the job (6 + 5 + 5 on
    three nodes, 24 + 8 on two domains: nothing left broken), and the fewest cells with at least
    the job, the smallest piece cut to fit. Best fit's equal chunks give neither 6 + 5 + 5 nor 24 + 8,
    nor TP6 groups from the nodes with 6 or 7 free; covers of whole nodes only are left to it."""
    n = job.gpus
    group = job.tp * job.cp
    cap_cell = counts.cell // group * group
    cap_unit = np.bincount(idx.cell_unit, weights=cap_cell, minlength=idx.n_units).astype(np.int64)
    blocks = np.flatnonzero(cap_unit >= n)
    if blocks.size:
        blocks = blocks[np.lexsort((blocks, counts.unit_load[blocks], cap_unit[blocks] - n))][:COVER_BLOCKS]
        members, off = idx.cells_of_unit
        cell_lists = [members[off[b] : off[b + 1]] for b in blocks]
    else:
        cap_pod = np.bincount(idx.unit_pod, weights=cap_unit, minlength=idx.n_pods).astype(np.int64)
        pods = np.flatnonzero(cap_pod >= n)
        if not pods.size:
            return []
        pod = int(pods[np.lexsort((pods, counts.pod_load[pods], cap_pod[pods] - n))[0]])
        units = np.flatnonzero(idx.unit_pod == pod)
        cell_lists = [np.flatnonzero(np.isin(idx.cell_unit, units))]
    out: list[np.ndarray] = []
    members, off = idx.nodes_of_cell
    for cells in cell_lists:
        cells = cells[cap_cell[cells] > 0]
        cells = cells[np.argsort(-cap_cell[cells], kind="stable")][:COVER_CELLS]
        for plan in _covers(cap_cell[cells], n):
            if {piece for _, piece in plan} == {idx.max_node_gpus}:
                # Whole nodes only: best fit gives those.
                continue
            parts = [
                take_nodes(idx, counts, members[off[cells[k]] : off[cells[k] + 1]], piece)
                for k, piece in plan
            ]
            out.append(canonical(idx, np.concatenate(parts)))
    return out


def _covers(cap: np.ndarray, n: int) -> list[list[tuple[int, int]]]:
    """(item, amount) plans: the fewest items summing to exactly n, and the fewest with at least n
    (the smallest piece cut by the excess); items taken whole, larger ones first among equals."""
    if not cap.size or int(cap.sum()) < n:
        return []
    top = n + int(cap.max())
    inf = np.iinfo(np.int64).max // 2
    fewest = np.full(top + 1, inf, dtype=np.int64)
    fewest[0] = 0
    took = np.zeros((cap.size, top + 1), dtype=bool)
    for i, c in enumerate(cap.tolist()):
        trial = np.full(top + 1, inf, dtype=np.int64)
        trial[c:] = fewest[: top + 1 - c] + 1
        # Only sums below n grow further: a cover past n needs no more items.
        trial[c:][np.arange(c, top + 1) - c >= n] = inf
        better = trial < fewest
        took[i] = better
        fewest = np.where(better, trial, fewest)
    plans: list[list[tuple[int, int]]] = []
    targets = [n] if fewest[n] < inf else []
    reach = np.flatnonzero(fewest[n:] < inf)
    if reach.size:
        over = n + int(reach[np.argmin(fewest[n:][reach])])
        if over not in targets:
            targets.append(over)
    for s in targets:
        items: list[int] = []
        i = cap.size - 1
        while s > 0:
            while not took[i, s]:
                i -= 1
            items.append(i)
            s -= int(cap[i])
            i -= 1
        excess = int(cap[items].sum()) - n
        plan = [(k, int(cap[k])) for k in sorted(items)]
        if excess:
            k, piece = plan[-1]
            plan[-1] = (k, piece - excess)
        plans.append(plan)
    return plans
