"""`topo`: topology-aware placement.

1. Which GPUs: the smallest domain that holds the job - one NVLink domain, else one unit (a leaf,
   or a rail-optimized scalable unit), else one spine pod, else the whole cluster - chosen by best
   fit (fewest GPUs left over) with a fragmentation penalty for every node left partly used.
   Below the chosen block, children are taken best-fit first (`best_fit_cover`), every NVLink
   domain in whole chunks (TP*EP or TP GPUs, so no such group straddles domains) and every unit in
   whole PP stages, DP replicas or TP groups; when the free set cannot supply aligned pieces the
   pieces shrink (`chunk_ladder`), and a looser alignment is kept only if it fits lower.
2. Which rank where: rank blocks nested by group (`mapping.py`).
3. On irregular free sets, swaps against the cost model (`refine.py`).
The few best candidate sets and mappings are priced by the cost model and the cheapest is kept.
The lowest free GPU ids are always one of the candidates, so topo never prices above first_fit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np

from ..costmodel import evaluate, load_array
from ..jobs import JobSpec
from ..topology import Topology
from .base import HierarchyIndex, NoFit, Placement, hierarchy, shortage
from .cover import best_fit_cover
from .mapping import candidate_mappings
from .refine import refine

# Blocks priced per level and chunk size: the best few by fit, so large clusters stay fast.
BLOCKS_PRICED = 3
BLOCKS_PLANNED = 8
PLANNED_GPUS = 4096
# Candidate sets whose other mappings are priced too.
SETS_REMAPPED = 2
# Jobs up to this many GPUs get swap refinement on irregular free sets.
REFINE_MAX_GPUS = 64


class _Free:
    """Free GPUs counted at every level of the hierarchy for one call."""

    def __init__(self, idx: HierarchyIndex, free: np.ndarray, leaf_load: np.ndarray):
        self.ids = np.flatnonzero(free)
        self.node = np.bincount(idx.gpu_node[self.ids], minlength=idx.n_nodes)
        self.domain = np.bincount(idx.node_domain, weights=self.node, minlength=idx.n_domains).astype(
            np.int64
        )
        self.cell = np.bincount(idx.node_cell, weights=self.node, minlength=idx.n_cells).astype(np.int64)
        unit_load = (
            np.bincount(idx.leaf_unit, weights=leaf_load, minlength=idx.n_units) if leaf_load.size else None
        )
        self.unit_load = np.zeros(idx.n_units) if unit_load is None else unit_load
        self.pod_load = np.bincount(idx.unit_pod, weights=self.unit_load, minlength=idx.n_pods)
        self.plane_load = np.bincount(idx.pod_plane, weights=self.pod_load, minlength=idx.n_planes)

    def node_gpus(self, idx: HierarchyIndex, node: int, k: int) -> np.ndarray:
        """The k lowest free gids of a node."""
        lo = int(idx.node_first_gid[node])
        start = int(np.searchsorted(self.ids, lo))
        return self.ids[start : start + k]


def solve(topology: Topology, free: np.ndarray, link_load: Mapping[str, float], job: JobSpec):
    """Place `job` by the topo policy; Placement with its prediction, or NoFit with the reason."""
    missing = shortage(job, free)
    if missing is not None:
        return missing
    idx = hierarchy(topology)
    leaf_load = load_array(topology, link_load)
    counts = _Free(idx, free, leaf_load)
    plans = _candidate_sets(idx, counts, job)
    if not plans:
        networked = int(np.count_nonzero(idx.networked[counts.ids]))
        return NoFit(
            f"needs {job.gpus} GPUs joined by a network or one NVLink domain: {networked} networked GPUs "
            f"free, the largest free NVLink domain has {int(counts.domain.max())}"
        )
    # Stage 1 prices every candidate set in its first mapping; stage 2 tries the other mappings
    # of the best few sets only, since the cost model is the expensive part.
    first: list[tuple[tuple[float, float], int, np.ndarray]] = []
    for k, (gset, fit, _) in enumerate(plans):
        gids = next(candidate_mappings(idx, job, gset))
        first.append((_key(topology, job, gids, leaf_load, fit), k, gids))
    first.sort(key=lambda item: (item[0], item[1]))
    best_key, best_k, best_gids = first[0]
    for _, k, _ in first[:SETS_REMAPPED]:
        gset, fit, _ = plans[k]
        for gids in itertools.islice(candidate_mappings(idx, job, gset), 1, None):
            key = _key(topology, job, gids, leaf_load, fit)
            if key < best_key:
                best_key, best_k, best_gids = key, k, gids
    gids, regular = best_gids, plans[best_k][2]
    if not regular and job.gpus <= REFINE_MAX_GPUS:
        gids = refine(topology, idx, job, gids, free, leaf_load)
    prediction = evaluate(topology, job, gids, leaf_load)
    return Placement("topo", tuple(int(g) for g in gids), prediction)


def _key(topology: Topology, job: JobSpec, gids: np.ndarray, leaf_load: np.ndarray, fit: float):
    """Sort key of a candidate: predicted comm ms (to 1e-9), then the fit score."""
    return (round(evaluate(topology, job, gids, leaf_load, detail=False).comm_ms, 9), fit)


def chunk_ladder(idx: HierarchyIndex, job: JobSpec) -> list[tuple[int, int]]:
    """(chunk, unit alignment) pairs to try, strictest first.

    A chunk is how many GPUs every NVLink domain supplies a multiple of: TP*EP and TP (so those
    groups stay inside a domain), then powers of two down to 1 - the larger the pieces a group
    spans domains in, the more rails its hierarchical allreduce runs on. A unit supplies whole
    PP stages (tp*dp GPUs) or whole DP replicas (tp*pp) when it can, else whole TP groups, so that
    a job spanning units crosses between them along one kind of group only. Last comes no
    alignment at all, which always fits."""
    sizes = [job.tp * job.ep, job.tp]
    c = 1
    while c * 2 <= idx.max_domain_gpus and job.gpus % (c * 2) == 0:
        c *= 2
    while c >= 1:
        sizes.append(c)
        c //= 2
    blocks = sorted({job.tp * job.dp, job.tp * job.pp}, reverse=True)
    out: list[tuple[int, int]] = []
    for c in sorted(set(sizes), reverse=True):
        if c > idx.max_domain_gpus or job.gpus % c:
            continue
        for g in [b for b in blocks if b < job.gpus and b % c == 0] + [math.lcm(c, job.tp)]:
            if job.gpus % g == 0 and (c, g) not in out:
                out.append((c, g))
    if (1, 1) not in out:
        out.append((1, 1))
    return out


def _candidate_sets(idx: HierarchyIndex, counts: _Free, job: JobSpec) -> list[tuple[np.ndarray, float, bool]]:
    """Candidate GPU sets as (gids in canonical order, fit score, regular?)."""
    n = job.gpus
    fits = np.flatnonzero(counts.domain >= n)
    if fits.size:
        # One NVLink domain holds the job: every group rides NVLink, so only fit matters.
        leftover = counts.domain[fits] - n
        domain = int(fits[np.lexsort((fits, leftover))[0]])
        members, off = idx.nodes_of_domain
        nodes = members[off[domain] : off[domain + 1]]
        gset = _take_nodes(idx, counts, nodes, n)
        return _with_lowest_ids(counts, n, [(_canonical(idx, gset), float(leftover.min()), True)])
    plans: list[tuple[np.ndarray, float, bool]] = []
    seen: set[bytes] = set()
    ladder = chunk_ladder(idx, job)
    lowest_level = len(_LEVELS)
    for c, g in ladder:
        if lowest_level == 0:
            break
        cap_cell = counts.cell // c * c
        cap_unit = np.bincount(idx.cell_unit, weights=cap_cell, minlength=idx.n_units).astype(np.int64)
        # A unit supplies whole stages, replicas or TP groups: fewer kinds of group cross units.
        cap_unit = cap_unit // g * g
        cap_pod = np.bincount(idx.unit_pod, weights=cap_unit, minlength=idx.n_pods).astype(np.int64)
        cap_plane = np.bincount(idx.pod_plane, weights=cap_pod, minlength=idx.n_planes).astype(np.int64)
        caps = {"cell": cap_cell, "unit": cap_unit, "pod": cap_pod, "plane": cap_plane}
        for rank, (level, cap, load) in enumerate(
            (
                ("unit", cap_unit, counts.unit_load),
                ("pod", cap_pod, counts.pod_load),
                ("plane", cap_plane, counts.plane_load),
            )
        ):
            blocks = np.flatnonzero(cap >= n)
            if not blocks.size:
                continue
            # A looser alignment is only worth it if it lets the job sit lower in the hierarchy.
            if rank >= lowest_level:
                break
            lowest_level = rank
            leftover = _raw_free(idx, counts, level, blocks) - n
            # Building a plan costs O(job), so big jobs plan fewer blocks.
            planned = max(2, min(BLOCKS_PLANNED, PLANNED_GPUS // n))
            order = np.lexsort((blocks, load[blocks], leftover))[:planned]
            scored = []
            for k in order:
                gset = _take(idx, counts, caps, level, int(blocks[k]), n)
                scored.append(
                    (float(leftover[k]) + _fragmentation(idx, counts, gset), float(load[blocks[k]]), gset)
                )
            scored.sort(key=lambda s: (s[0], s[1]))
            for fit, _, gset in scored[:BLOCKS_PRICED]:
                key = np.sort(gset).tobytes()
                if key not in seen:
                    seen.add(key)
                    regular = c == ladder[0][0] and _whole_chunks(idx, gset, job.tp)
                    plans.append((_canonical(idx, gset), fit, regular))
            break
    return _with_lowest_ids(counts, n, plans) if plans else plans


def _with_lowest_ids(counts: _Free, n: int, plans: list) -> list[tuple[np.ndarray, float, bool]]:
    """`plans` plus the lowest free ids (first_fit's set), ranked last on fit, if not already in."""
    lowest = counts.ids[:n]
    if all(np.sort(gset).tobytes() != lowest.tobytes() for gset, _, _ in plans):
        plans.append((lowest, math.inf, False))
    return plans


def _raw_free(idx: HierarchyIndex, counts: _Free, level: str, blocks: np.ndarray) -> np.ndarray:
    """Free GPUs (unaligned) in each block of a level."""
    unit = np.bincount(idx.cell_unit, weights=counts.cell, minlength=idx.n_units)
    if level == "unit":
        return unit[blocks].astype(np.int64)
    pod = np.bincount(idx.unit_pod, weights=unit, minlength=idx.n_pods)
    if level == "pod":
        return pod[blocks].astype(np.int64)
    plane = np.bincount(idx.pod_plane, weights=pod, minlength=idx.n_planes)
    return plane[blocks].astype(np.int64)


_LEVELS = ("unit", "pod", "plane")
_CHILD_LEVEL = {"plane": "pod", "pod": "unit", "unit": "cell"}


def _take(idx: HierarchyIndex, counts: _Free, caps: dict, level: str, block: int, need: int) -> np.ndarray:
    """`need` GPUs from one block, children best-fit first, down to nodes and GPUs."""
    if level == "cell":
        members, off = idx.nodes_of_cell
        return _take_nodes(idx, counts, members[off[block] : off[block + 1]], need)
    child_level = _CHILD_LEVEL[level]
    members, off = {
        "plane": idx.pods_of_plane,
        "pod": idx.units_of_pod,
        "unit": idx.cells_of_unit,
    }[level]
    children = members[off[block] : off[block + 1]]
    load = None
    if child_level == "pod":
        load = counts.pod_load[children]
    elif child_level == "unit":
        load = counts.unit_load[children]
    plan = best_fit_cover(caps[child_level][children], need, load)
    parts = [_take(idx, counts, caps, child_level, int(children[k]), take) for k, take in plan]
    return np.concatenate(parts)


def _take_nodes(idx: HierarchyIndex, counts: _Free, nodes: np.ndarray, need: int) -> np.ndarray:
    """`need` free GPUs from these nodes: best-fit nodes, each node's lowest free GPUs."""
    if nodes.size == 1:
        return counts.node_gpus(idx, int(nodes[0]), need)
    plan = best_fit_cover(counts.node[nodes], need)
    return np.concatenate([counts.node_gpus(idx, int(nodes[k]), take) for k, take in plan])


def _fragmentation(idx: HierarchyIndex, counts: _Free, gset: np.ndarray) -> float:
    """Penalty in GPUs: half a node for every node the set leaves partly free."""
    nodes, used = np.unique(idx.gpu_node[gset], return_counts=True)
    broken = int(np.count_nonzero(counts.node[nodes] > used))
    return broken * idx.max_node_gpus / 2


def _whole_chunks(idx: HierarchyIndex, gset: np.ndarray, tp: int) -> bool:
    """True when every NVLink domain holds a multiple of tp of the set's GPUs."""
    _, per_domain = np.unique(idx.gpu_domain[gset], return_counts=True)
    return bool((per_domain % tp == 0).all())


def _canonical(idx: HierarchyIndex, gset: np.ndarray) -> np.ndarray:
    """The set in hierarchy order: plane, pod, unit, then the unit's cells fullest first (so TP
    groups line up with whole domains and split ones pair up), node, GPU index."""
    cell = idx.gpu_cell[gset]
    _, inverse, per_cell = np.unique(cell, return_inverse=True, return_counts=True)
    order = np.lexsort(
        (
            idx.gpu_index[gset],
            idx.gpu_node[gset],
            cell,
            -per_cell[inverse],
            idx.gpu_unit[gset],
            idx.gpu_pod[gset],
            idx.gpu_plane[gset],
        )
    )
    return gset[order]
