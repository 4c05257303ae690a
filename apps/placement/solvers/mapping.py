"""Rank-to-GPU mappings of a chosen GPU set, nested by group.

Slots are the set's GPUs in hierarchy order (pod, unit, NVLink domain, node, GPU index). Ranks are
laid on the slots sorted by their coordinates, one dimension nested inside the next. The first
nesting follows the job's declared traffic (`traffic_nesting`: the kind moving the most bytes per
rank innermost, so its groups fill consecutive slots of one domain; a long pipeline with large
activations and small TP keeps its stages inside a node and splits TP across same-rail nodes).
Then the rank order, and TP fastest followed by EP, DP and PP in either order (PP outermost
keeps stages adjacent and DP groups rail-aligned; DP outermost suits pipeline-heavy jobs); the
search's regroup pass and topo's last check also try the second-heaviest kind innermost (stages
inside a node, TP split over two nodes of a leaf) and the declared traffic reversed (the lighter
kinds sharing a node, the heaviest across nodes one GPU per node). A second slot
order walks TP-sized chunks rail by rail across the nodes of a unit, so that DP groups of
TP-sharded jobs that leave part of each node free still meet on one rail's leaf; where NVLink
domains straddle leaves, one walks each domain leaf by leaf (`domain_major`); the last is plain
GPU id order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..jobs import JobSpec
from .base import HierarchyIndex, rank_coordinates

# Context parallelism nests right after TP: its ring attention moves the most bytes after TP's.
NESTINGS = (("tp", "cp", "ep", "dp", "pp"), ("tp", "cp", "ep", "pp", "dp"))


def _sizes(job: JobSpec) -> dict[str, int]:
    return {"tp": job.tp, "cp": job.cp, "ep": job.ep, "dp": job.dp // job.ep, "pp": job.pp}


# Bytes a rank moves per byte of payload, by collective (ring allreduce twice, the others once).
TRAFFIC_FACTOR = {
    "allreduce": 2.0,
    "allgather": 1.0,
    "reducescatter": 1.0,
    "alltoall": 1.0,
    "p2p": 1.0,
    "volume": 1.0,
}


def declared_traffic(job: JobSpec) -> dict[str, float]:
    """Bytes each rank moves per step in each group kind where compute does not hide them, from
    the job's comm entries (payload x count x the collective's factor x (1 - the entry's
    overlap)); 0 for a kind without entries or of size 1. A cp p2p entry is a ring pass: cp - 1
    sends per rank."""
    sizes = _sizes(job)
    sizes["dp"] = job.dp
    out = dict.fromkeys(("tp", "cp", "ep", "dp", "pp"), 0.0)
    for c in job.comm:
        if sizes[c.group] > 1:
            steps = sizes["cp"] - 1 if c.group == "cp" and c.collective == "p2p" else 1
            out[c.group] += (
                c.bytes * c.count * steps * TRAFFIC_FACTOR[c.collective] * (1.0 - job.entry_overlap(c))
            )
    return out


def traffic_nesting(job: JobSpec) -> tuple[str, ...]:
    """Dimensions nested by declared traffic: the heaviest kind innermost (fastest), so its groups
    take consecutive slots of one NVLink domain; ties keep the rank order."""
    traffic = declared_traffic(job)
    # An EP group lies inside its DP group, so ep never nests outside dp.
    traffic["ep"] = max(traffic["ep"], traffic["dp"])
    dims = _all_dims(job)
    order = {d: i for i, d in enumerate(dims)}
    return tuple(sorted(dims, key=lambda d: (-traffic[d], order[d])))


def _all_dims(job: JobSpec) -> tuple[str, ...]:
    """The rank order's dimensions with cp in it (right after tp while the order leaves it out)."""
    dims = list(job.dims)
    if "cp" not in dims:
        dims.insert(dims.index("tp") + 1, "cp")
    return tuple(dims)


def nestings(job: JobSpec, wider: bool = False) -> list[tuple[str, ...]]:
    """Distinct dimension nestings (fastest first) to try, by declared traffic first; size-1
    dimensions do not count. `wider` adds the second-heaviest kind innermost, then the declared
    traffic reversed."""
    sizes = _sizes(job)
    out: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    by_traffic = traffic_nesting(job)
    extra = []
    if wider:
        traffic = declared_traffic(job)
        if sizes[by_traffic[1]] > 1 and traffic[by_traffic[1]] > 0:
            # The second-heaviest kind innermost too: a pipeline kept inside a node that splits
            # TP over two nodes of one leaf can beat whole TP groups whose stages cross the spine.
            extra.append((by_traffic[1], by_traffic[0], *by_traffic[2:]))
        # The lightest kind innermost and the heaviest outermost: where the heaviest kind alone
        # would fill a node, the lighter kinds together may move more (cp, ep and pp of a
        # long-context MoE job against its tp), and the heaviest kind's groups then take one GPU
        # per node, each rank on its own NIC.
        extra.append(by_traffic[::-1])
    for nest in (by_traffic, _all_dims(job), *NESTINGS, *extra):
        effective = tuple(d for d in nest if sizes[d] > 1)
        if effective not in seen:
            seen.add(effective)
            out.append(tuple(nest))
    return out


def rail_major(idx: HierarchyIndex, slots: np.ndarray, chunk: int) -> np.ndarray:
    """Slots reordered so that chunk k of every node of a unit comes before chunk k+1 of any."""
    node = idx.gpu_node[slots]
    # Slots arrive node by node; a slot's place among its node's slots gives its chunk.
    starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
    local = np.arange(slots.size) - np.repeat(starts, np.diff(np.r_[starts, slots.size]))
    chunk_no = local // chunk
    order = np.lexsort(
        (np.arange(slots.size), chunk_no, idx.gpu_unit[slots], idx.gpu_pod[slots], idx.gpu_plane[slots])
    )
    return slots[order]


def domain_major(idx: HierarchyIndex, slots: np.ndarray) -> np.ndarray | None:
    """Slots NVLink domain by domain, each domain's slots leaf (unit) by leaf, when some domain of
    the set straddles units; else None. Groups nested inside a domain stay whole, and the k-th
    slot of every domain sits under the same-ranked leaf of its domain, so groups across domains
    (DP over pipelines kept inside domains) span as few leaves as the domains allow."""
    dom, unit = idx.gpu_domain[slots], idx.gpu_unit[slots]
    key = np.unique(dom * idx.n_units + unit)
    if np.unique(key // idx.n_units).size == key.size:
        return None
    order = np.lexsort(
        (idx.gpu_index[slots], idx.gpu_node[slots], unit, dom, idx.gpu_pod[slots], idx.gpu_plane[slots])
    )
    return slots[order]


def lay_out(job: JobSpec, slots: np.ndarray, nest: tuple[str, ...]) -> np.ndarray:
    """gids (rank -> GPU) that put ranks, sorted by `nest` (fastest first), on consecutive slots."""
    coords = rank_coordinates(job)
    # lexsort takes its last key as the primary one, so the slowest dimension goes last.
    seq = np.lexsort(tuple(coords[d] for d in nest))
    gids = np.empty(job.gpus, dtype=np.int64)
    gids[seq] = slots
    return gids


def candidate_mappings(
    idx: HierarchyIndex, job: JobSpec, slots: np.ndarray, wider: bool = False
) -> Iterator[np.ndarray]:
    """Distinct nested mappings of `slots` (a GPU set in hierarchy order), best guesses first;
    `wider` adds the second-heaviest kind innermost (`nestings`)."""
    return (gids for _, _, gids in candidate_layouts(idx, job, slots, wider))


def candidate_layouts(
    idx: HierarchyIndex, job: JobSpec, slots: np.ndarray, wider: bool = False
) -> Iterator[tuple[np.ndarray, tuple[str, ...], np.ndarray]]:
    """`candidate_mappings` as (slot order, nesting, gids), so a caller can vary the nesting of
    the best (`transposed`)."""
    slot_orders = [slots]
    if 1 < job.tp < slots.size:
        slot_orders.append(rail_major(idx, slots, job.tp))
    straddling = domain_major(idx, slots)
    if straddling is not None:
        slot_orders.append(straddling)
    # Plain id order keeps NVLink domains that straddle units in one piece.
    slot_orders.append(np.sort(slots))
    seen: set[bytes] = set()
    for order in slot_orders:
        for nest in nestings(job, wider):
            gids = lay_out(job, order, nest)
            key = gids.tobytes()
            if key not in seen:
                seen.add(key)
                yield order, nest, gids


def transposed(job: JobSpec, nest: tuple[str, ...]) -> list[tuple[str, ...]]:
    """`nest` with two of its dimensions of size above 1 exchanged, every such pair, inner pairs
    first: the neighbours a climb over nestings steps to. The fixed nestings (`nestings`) miss
    orders such as cp and pp of a long-context job sharing a node while tp spans two nodes of a
    leaf and ep the leaves (cp, pp, tp, ep: 124.2 ms where the best fixed one prices 150.0)."""
    sizes = _sizes(job)
    at = [k for k, d in enumerate(nest) if sizes[d] > 1]
    out = []
    for i, j in itertools.combinations(at, 2):
        swapped = list(nest)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        out.append(tuple(swapped))
    return out


def splits(job: JobSpec, parts: int) -> list[tuple[int, int]]:
    """(a, b) with a * b == parts, a dividing pp and b dividing dp: the ways to cut the job's
    (pp, dp) grid of TP blocks into `parts` equal sub-grids of pp/a stages by dp/b replicas (b
    need not divide dp/ep: an EP group then spans parts, as a DP group does)."""
    sizes = _sizes(job)
    return [
        (a, parts // a)
        for a in range(1, parts + 1)
        if parts % a == 0 and sizes["pp"] % a == 0 and job.dp % (parts // a) == 0
    ]


def split_layout(job: JobSpec, slots: np.ndarray, a: int, b: int, nest: tuple[str, ...]) -> np.ndarray:
    """gids (rank -> GPU) giving sub-grid p of the (pp, dp) grid - stages [p // b * pp/a, ...) by
    replicas [p % b * dp/b, ...), a replica's number its EP rank within its EP group's - the p-th
    a*b-th of `slots`, ranks inside a part ordered by `nest` (fastest first). PP crosses parts
    a - 1 times per pipeline, each DP group (and an EP group b > dp/ep cuts) spans b parts."""
    sizes = _sizes(job)
    coords = rank_coordinates(job)
    replica = coords["dp"] * sizes["ep"] + coords["ep"]
    part = coords["pp"] // (sizes["pp"] // a) * b + replica // (job.dp // b)
    seq = np.lexsort((*(coords[d] for d in nest), part))
    gids = np.empty(job.gpus, dtype=np.int64)
    gids[seq] = slots
    return gids


def split_mappings(job: JobSpec, slots: np.ndarray, parts: int) -> Iterator[np.ndarray]:
    """Every split layout of `slots` (`parts` equal pieces in a row, one per unit) by every
    (a, b) cut of the grid and every nesting inside a part."""
    seen: set[bytes] = set()
    for a, b in splits(job, parts):
        for nest in nestings(job):
            gids = split_layout(job, slots, a, b, nest)
            key = gids.tobytes()
            if key not in seen:
                seen.add(key)
                yield gids


def island_order(idx: HierarchyIndex, slots: np.ndarray, chunk: int) -> np.ndarray | None:
    """`slots` re-ordered so that every `chunk` consecutive slots avoid the slow pairs of nodes
    with intra links (`Node.intra`): each such node's GPUs are cut greedily into islands of
    chunk/2 whose slowest pair is fastest, what is left into islands of chunk/4, and so on down to
    single GPUs; every other node's GPUs into whole chunks and one remainder. Groups of `chunk`
    slots are then packed from these pieces, largest first, each piece from a node the group does
    not hold yet where one fits: a group joins the best islands of two or more such nodes over the
    network rather than a whole node over its slowest pair (a cube mesh's SYS link, a PCIe
    node's other socket). None when the set has no such node or the chunk is under 4."""
    if not idx.node_intra or chunk < 4:
        return None
    node = idx.gpu_node[slots]
    mixed = ~idx.domain_uniform[idx.gpu_domain[slots]]
    if not mixed.any():
        return None
    pieces: list[tuple[int, np.ndarray]] = []
    for n in dict.fromkeys(node.tolist()):
        gids = slots[node == n]
        if n not in idx.node_intra or idx.domain_uniform[idx.gpu_domain[gids[0]]]:
            whole = gids.size // chunk * chunk
            pieces += [(n, gids[k : k + chunk]) for k in range(0, whole, chunk)]
            if whole < gids.size:
                pieces.append((n, gids[whole:]))
            continue
        bw, first = idx.node_intra[n].bw, int(idx.node_first_gid[n])
        local = (gids - first).tolist()
        size = chunk // 2
        while local:
            while len(local) >= size:
                best = max(itertools.combinations(local, size), key=lambda s: _island_score(bw, s))
                pieces.append((n, np.asarray(best, dtype=np.int64) + first))
                local = [g for g in local if g not in best]
            size = max(size // 2, 1)
    # Largest first; among equals, the nodes in turn.
    turn: dict[int, int] = {}
    ranked = []
    for k, (n, gids) in enumerate(pieces):
        turn[n] = turn.get(n, -1) + 1
        ranked.append((-gids.size, turn[n], k))
    queue = [pieces[k] for _, _, k in sorted(ranked)]
    out: list[np.ndarray] = []
    while queue:
        room, held = chunk, set()
        while room and queue:
            fits = [k for k, (n, g) in enumerate(queue) if g.size <= room]
            if not fits:
                # A piece larger than the room left (a uniform node's remainder) spills over.
                fits = [0]
            pick = next((k for k in fits if queue[k][0] not in held), fits[0])
            n, gids = queue.pop(pick)
            out.append(gids)
            held.add(n)
            room = max(room - gids.size, 0)
    return np.concatenate(out)


def _island_score(bw: np.ndarray, gpus: tuple[int, ...]) -> tuple[float, float]:
    if len(gpus) < 2:
        return 0.0, 0.0
    sub = bw[np.ix_(gpus, gpus)]
    off = ~np.eye(len(gpus), dtype=bool)
    return float(sub[off].min()), float(sub[off].sum())
