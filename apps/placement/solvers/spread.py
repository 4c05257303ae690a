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


def node_spreads(
    idx: HierarchyIndex, counts: Free, job: JobSpec, gids: np.ndarray, pod: int, fewest: int
) -> list[tuple[np.ndarray, float]]:
    """The map `gids` with its nodes moved onto more units of `pod`, keeping every rank's place
    within its node: the job's nodes in the order of their first ranks, cut into k groups of as
    many GPUs (k from `part_counts`, more units than the map uses; consecutive nodes, or each
    unit's nodes in pieces, `_node_groups`), each group onto
    its own unit (the units the map uses first, then the quietest), each node onto the unit's
    node with the fewest free GPUs that hold its part. A map the nestings pack into two leaves
    keeps its groups' shapes and shares the uplinks of four (a tp4 x cp2 x pp2 x dp4 job at 4:1,
    32 + 32 to 16 a leaf: 70.47 to 60.98 ms, its DP all-reduce halved), where the split layouts
    re-nest it. With each its fit score, as `spread_candidates`'."""
    n = job.gpus
    gids = np.asarray(gids, dtype=np.int64)
    node = idx.gpu_node[gids]
    _, first = np.unique(node, return_index=True)
    order = node[np.sort(first)]
    held = np.bincount(node, minlength=idx.n_nodes)
    node_unit = idx.gpu_unit[idx.node_first_gid]
    members, off = idx.units_of_pod
    units = members[off[pod] : off[pod + 1]]
    in_pod = set(units.tolist())
    mine = [u for u in dict.fromkeys(node_unit[order].tolist()) if u in in_pod]
    others = [u for u in units[np.lexsort((units, counts.unit_load[units]))].tolist() if u not in mine]
    pod_free = int(counts.node[np.isin(node_unit, units)].sum())
    out: list[tuple[np.ndarray, float]] = []
    now = np.unique(node_unit[order]).size
    for parts in part_counts(job, max(fewest, now + 1), units.size):
        for groups in _node_groups(order, node_unit, held, parts, now):
            target: dict[int, int] = {}
            free_units = mine + others
            for group in groups:
                for u in free_units:
                    placed = _host(counts, np.flatnonzero(node_unit == u), group, held)
                    if placed is not None:
                        target.update(placed)
                        free_units = [x for x in free_units if x != u]
                        break
                else:
                    break
            if len(target) != order.size:
                continue
            moved = np.empty_like(gids)
            for v, t in target.items():
                at = np.flatnonzero(node == v)
                start = int(np.searchsorted(counts.ids, idx.node_first_gid[t]))
                dest = counts.ids[start : start + held[v]]
                moved[at] = dest[np.argsort(np.argsort(gids[at]))]
            out.append((moved, float(pod_free - n) + fragmentation(idx, counts, np.sort(moved))))
    return out


def _node_groups(
    order: np.ndarray, node_unit: np.ndarray, held: np.ndarray, parts: int, now: int
) -> list[list[np.ndarray]]:
    """Ways to cut the job's nodes (`order`, by first rank) into `parts` groups of as many of its
    GPUs (`held`), one unit each: consecutive nodes together; and, when `parts` is a multiple of
    the `now` units the map uses, each unit's own nodes cut in parts / now consecutive pieces, the
    first piece of every unit listed first (so it stays on its unit). The first keeps whole the
    blocks of ranks the nestings laid on consecutive nodes; the second keeps every group that
    crossed units crossing the same way and halves (or more) the flows on each leaf's uplinks: a
    tp2 x pp8 x dp4 job whose TP pairs each cross two leaves (32 + 32 GPUs at 4:1) then shares
    the uplinks of four (13.91 to 13.60 ms, the free-set bound), where consecutive pairs of nodes
    put each TP pair in one leaf and every DP group over four (19.40)."""
    out: list[list[np.ndarray]] = []
    if order.size % parts == 0:
        cut = order.reshape(parts, -1)
        if np.unique(held[cut].sum(axis=1)).size == 1:
            out.append(list(cut))
    per = parts // now
    if parts % now or per < 2:
        return out
    pieces: list[list[np.ndarray]] = []
    for u in dict.fromkeys(node_unit[order].tolist()):
        on_unit = order[node_unit[order] == u]
        if on_unit.size % per:
            return out
        pieces.append(list(on_unit.reshape(per, -1)))
    refined = [unit_pieces[i] for i in range(per) for unit_pieces in pieces]
    if len({int(held[g].sum()) for g in refined}) == 1:
        out.append(refined)
    return out


def _host(counts: Free, nodes: np.ndarray, group: np.ndarray, held: np.ndarray) -> dict[int, int] | None:
    """The group's nodes (the largest parts first) onto distinct `nodes`, each the one with the
    fewest free GPUs that hold its part (then the lowest id); None when they do not fit."""
    left = nodes[np.lexsort((nodes, counts.node[nodes]))].tolist()
    out: dict[int, int] = {}
    for v in sorted(group.tolist(), key=lambda x: -held[x]):
        t = next((t for t in left if counts.node[t] >= held[v]), None)
        if t is None:
            return None
        out[v] = t
        left.remove(t)
    return out
