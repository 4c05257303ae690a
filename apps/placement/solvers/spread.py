"""Spread candidates: a job that must span units of a pod, cut into equal parts, one per unit.

Packing the fewest units (best fit) puts all of the job's cross-unit flows on the uplinks of few
leaves. Spreading it evenly over k units shares them among more uplinks, and lets the (pp, dp)
grid of TP blocks be cut into sub-grids (`mapping.split_layout`): pipeline stages by replicas
(cut inside EP groups too, so a job whose EP group is its whole DP group spreads as well),
so PP and DP both cross units with fewer flows per leaf (2 x 2 squares of a tp8-pp4-dp4 job on four
leaves meet the joint lower bound, where two packed leaves do not). The cost model decides.
"""

from __future__ import annotations

import numpy as np

from ..jobs import JobSpec
from .base import HierarchyIndex
from .blocks import Free, canonical, fragmentation, take
from .mapping import split_mappings, splits

# Part counts tried per pod, fewest first: each costs O(job) to build and a few evaluations.
PARTS_TRIED = 3


def part_counts(job: JobSpec, fewest: int, units: int) -> list[int]:
    """Numbers of equal parts to cut the job in: a*b with a | pp and b | dp, between `fewest`
    (at least 2) and `units`, the smallest PARTS_TRIED of them."""
    out = [k for k in range(max(2, fewest), units + 1) if job.gpus % k == 0 and splits(job, k)]
    return out[:PARTS_TRIED]


def spread_candidates(
    idx: HierarchyIndex, counts: Free, job: JobSpec, pod: int, chunk: int, fewest: int
) -> list[tuple[np.ndarray, float]]:
    """Mappings (rank -> gid) of the job spread evenly over k units of `pod`, for each part count
    k from `fewest` units up, each unit giving n/k GPUs in whole `chunk`s per NVLink domain; with
    each its fit score in GPUs (the pod's leftover plus the fragmentation penalty)."""
    n = job.gpus
    members, off = idx.units_of_pod
    units = members[off[pod] : off[pod + 1]]
    cap_cell = counts.cell // chunk * chunk
    caps = {"cell": cap_cell}
    unit_cap = np.bincount(idx.cell_unit, weights=cap_cell, minlength=idx.n_units).astype(np.int64)[units]
    pod_free = int(np.bincount(idx.cell_unit, weights=counts.cell, minlength=idx.n_units)[units].sum())
    out: list[tuple[np.ndarray, float]] = []
    for parts in part_counts(job, fewest, units.size):
        per = n // parts
        if per % chunk:
            continue
        ok = np.flatnonzero(unit_cap >= per)
        if ok.size < parts:
            continue
        # Quietest uplinks first, then the units the part fits best, then the lowest id.
        pick = ok[np.lexsort((units[ok], unit_cap[ok] - per, counts.unit_load[units[ok]]))[:parts]]
        chosen = np.sort(units[pick])
        slots = np.concatenate([canonical(idx, take(idx, counts, caps, "unit", int(u), per)) for u in chosen])
        fit = float(pod_free - n) + fragmentation(idx, counts, slots)
        out.extend((gids, fit) for gids in split_mappings(job, slots, parts))
    return out
