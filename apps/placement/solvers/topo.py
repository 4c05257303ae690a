"""`topo`: topology-aware placement.

1. Which GPUs: the smallest domain that holds the job - one uniform NVLink domain (every GPU pair
   at the domain rate; a node with intra links is not one), else one unit (a leaf,
   or a rail-optimized scalable unit), else one spine pod, else the whole cluster - chosen by best
   fit (fewest GPUs left over) with a fragmentation penalty for every node left partly used.
   Below the chosen block, children are taken best-fit first (`best_fit_cover`), every NVLink
   domain in whole chunks (TP*EP or TP GPUs, so no such group straddles domains) and every unit in
   whole PP stages, DP replicas or TP groups; when the free set cannot supply aligned pieces the
   pieces shrink (`chunk_ladder`), and a looser alignment is kept only if it fits lower. Beside
   these, the job split evenly over the nodes with the fastest network per GPU (`fast.py`), so
   that link speed, not only GPU count, decides the set; and, when nodes with intra links have
   free GPUs, the same sets over the other nodes only. A job of up to 8 GPUs that lands in one
   uniform domain at the top rate is done here (nothing is cheaper; no bound, no search). A larger
   job one domain holds whose set there misses the bound also gets its equal pieces over several
   domains (`chunks.domain_chunk_sets`): a small allreduce's tree over two NVL72 racks, a chain of
   n/2 in each, takes fewer latency steps than one ring of n inside one.
2. Which rank where: rank blocks nested by group (`mapping.py`).
3. When the best of these misses the lower bound over the free GPUs (`bounds.lower_bound` with
   `free`): a job spanning units of a pod is also spread evenly over more units with its (pp, dp)
   grid cut into sub-grids (`spread.py`), a job larger than the uniform NVLink domains' free GPUs
   takes them all and the rest thinly from nodes with intra links, a GPU of each node a round
   (`intra.thin_sets`: a group's members on a PCIe node run at their slowest pair, a lone
   member at its NIC's rate), and every baseline's placement (and the baselines' GPU
   sets in the nested mappings) joins the candidates, so topo never prices above any baseline.
4. On irregular free sets, swaps against the cost model (`refine.py`); then, for any job still
   above the bound, a budgeted local search over node moves, group and rank swaps (`search.py`),
   and ranks moved off NICs they share onto free GPUs of the same node behind NICs the job does
   not use (`rails.py`); last, the nested mappings of the set the search ended on, so its answer
   is never dearer than the plain nestings of its own GPUs, and a climb from the cheapest of
   those over exchanges of two dimensions (`mapping.transposed`); then a climb over exchanges of
   the ranks of two of the job's nodes (`_node_exchanges`), and of three when no two improve:
   which node holds which pipeline stage of which replicas, an order the nestings take from the
   node ids alone; last, the map's nodes moved onto more units (`spread.node_spreads`).
Candidates are priced by the cost model with the current link loads; the cheapest is kept, ties
to the better fit.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from ..bounds import lower_bound
from ..costmodel import Prediction, evaluate, load_array
from ..jobs import JobSpec
from ..topology import Topology
from . import first_fit, naive, seeded_random, tree_best_fit
from .base import HierarchyIndex, NoFit, Placement, hierarchy, shortage
from .blocks import Free, canonical, fragmentation, take, take_nodes
from .chunks import cover_sets, domain_chunk_sets
from .fast import fast_sets, rail_balanced_sets, rate_filled_set
from .intra import intra_candidates, thin_sets
from .mapping import candidate_layouts, candidate_mappings, island_order, lay_out, nestings, transposed
from .rails import spread_rails
from .refine import refine
from .search import search
from .spread import node_spreads, spread_candidates

# Blocks priced per level and chunk size: the best few by fit, so large clusters stay fast.
BLOCKS_PRICED = 3
BLOCKS_PLANNED = 8
PLANNED_GPUS = 4096
# Candidate sets whose other mappings are priced too.
SETS_REMAPPED = 2
# Pods a job spanning units is also spread over (the best by fit).
PODS_SPREAD = 1
# Jobs up to this many GPUs get swap refinement on irregular free sets, and rail spreading on
# the best maps of RAIL_SETS more GPU sets (within RAIL_SET_EVALS prices each).
REFINE_MAX_GPUS = 64
RAIL_SETS, RAIL_SET_EVALS = 4, 16
# Prices the climb over nestings may spend after the search (`_nested_on_set`).
NEST_CLIMB_EVALS = 30
# Prices the climb over exchanges of two nodes' ranks may spend last (`_node_exchanges`); only
# for jobs whose search has at least as many moves (up to 512 GPUs): past that a price costs
# tens of ms and a few pairs in node order are a blind draw out of thousands.
NODE_EXCHANGE_EVALS = 40
# Prices the rotations of three nodes' ranks may spend once no exchange of two improves (at most
# half the search's moves: 20 for jobs of 65 to 512 GPUs).
NODE_CYCLE_EVALS = 60
# Local search after the constructive stage, when it missed the bound: (largest job in GPUs, moves)
# by job size. A move costs one cost-model call (about 2 ms, growing with the job past a few
# thousand GPUs), so bigger jobs get fewer; counted in moves, not seconds, so the answer does not
# depend on how busy the machine is.
SEARCH_EVALS = ((64, 120), (512, 40), (4096, 10), (math.inf, 2))
# Jobs up to this many GPUs get their best map's nodes moved onto more units (`spread.node_spreads`).
NODE_SPREAD_MAX_GPUS = 512
# Jobs up to this many GPUs placed in one uniform NVLink domain at the top rate skip the bound.
ONE_DOMAIN_MAX_GPUS = 8
# How far above the free-set bound a placement may be and still skip refinement and search.
SEARCH_TOLERANCE = 0.01
# Baselines whose placements are candidates; the GPU sets of the first two also get nested mappings.
BASELINES = (
    ("tree_best_fit", tree_best_fit.choose),
    ("naive", naive.choose),
    ("first_fit", first_fit.choose),
    ("random", seeded_random.choose),
)
BASELINES_REMAPPED = 2


def solve(topology: Topology, free: np.ndarray, link_load: Mapping[str, float], job: JobSpec, seed: int = 0):
    """Place `job` by the topo policy; Placement with its prediction, or NoFit with the reason.
    `seed` is the random baseline's, whose placement is one of the candidates."""
    missing = shortage(job, free)
    if missing is not None:
        return missing
    idx = hierarchy(topology)
    leaf_load = load_array(topology, link_load)
    counts = Free(idx, free, leaf_load)
    plans, spreads = _candidate_sets(idx, counts, job)
    best = _one_best_domain(topology, idx, counts, job, plans)
    if best is not None:
        # The job inside one uniform NVLink domain at the fastest rate any holding domain has:
        # nothing is cheaper, so neither the bound nor a search is needed.
        return Placement("topo", tuple(np.asarray(best).tolist()), evaluate(topology, job, best, leaf_load))
    mixed = ~idx.domain_uniform[idx.gpu_domain] & free
    if mixed.any() and int((free & ~mixed).sum()) >= job.gpus:
        # Sets that leave out the nodes whose GPU pairs differ (PCIe GPUs, partial NVLink meshes):
        # best fit counts such a node as one domain and would stop at it.
        for gset, fit, regular in _candidate_sets(idx, Free(idx, free & ~mixed, leaf_load), job)[0]:
            if all(np.sort(gset).tobytes() != np.sort(p[0]).tobytes() for p in plans):
                plans.append((gset, fit, regular))
    if not plans:
        networked = int(np.count_nonzero(idx.networked[counts.ids]))
        return NoFit(
            f"needs {job.gpus} GPUs joined by a network or one NVLink domain: {networked} networked GPUs "
            f"free, the largest free NVLink domain has {int(counts.domain.max())}"
        )
    # Built only when priced: none is once a set that fits better is at the bound.
    link_aware = _link_aware_sets(topology, idx, counts, job, plans)
    # One price per distinct map: the fast, rate-filled and best-fit sets often coincide.
    priced: dict[bytes, tuple[float, float]] = {}
    # The best-fit set's maps priced with every group: most often one of them is the answer,
    # which then needs no second cost-model call.
    whole: dict[bytes, Prediction] = {}
    # The empty cluster's bound (memoised per topology and job): no map prices below it, and the
    # free-set bound is at least it (capacities only shrink). A map at it on both exposed and all
    # comm can only be tied, so the sets after it that fit no better are not priced.
    floor = lower_bound(topology, job)
    floor_key = (floor.step_ms - job.compute_ms, floor.comm_ms)
    # Stage 1 prices every candidate set in its first mapping, and the best-fit set in all of
    # them when one is at the bound (which spares pricing the rest); stage 2 tries the other
    # mappings of the best few sets only, since the cost model is the expensive part.
    first: list[tuple[tuple[float, float, float], int, np.ndarray]] = []
    best: tuple[tuple[float, float, float], int, np.ndarray] | None = None

    def tied(fit: float) -> bool:
        # Nothing this set can be mapped to beats the best so far.
        return best is not None and fit >= best[0][2] and _at_bound(best[0], floor_key)

    k = -1
    while True:
        k += 1
        if k == len(plans):
            if best is not None and _at_bound(best[0], floor_key):
                break
            more = next(link_aware, None)
            if more is None:
                break
            plans.append(more)
        gset, fit, _ = plans[k]
        for gids in _first_mappings(idx, job, gset, functools.partial(tied, fit)):
            key = _key(topology, job, gids, leaf_load, fit, priced, whole if k == 0 else None)
            first.append((key, k, gids))
            if best is None or (key, k) < best[:2]:
                best = (key, k, gids)
        if k == 0 and not _at_bound(best[0], floor_key):
            # Kept only at the bound; else stage 2 compares them (priced once) as before.
            for gids in itertools.islice(candidate_mappings(idx, job, gset), 1, None):
                key = _key(topology, job, gids, leaf_load, fit, priced, whole)
                if key < best[0] and _at_bound(key, floor_key):
                    best = (key, k, gids)
                    break
    first.sort(key=lambda item: (item[0], item[1]))
    best_key, best_k, best_gids = best
    for _, k, _ in first[:SETS_REMAPPED]:
        gset, fit, _ = plans[k]
        if fit >= best_key[2] and _at_bound(best_key, floor_key):
            continue
        for gids in itertools.islice(candidate_mappings(idx, job, gset), 1, None):
            key = _key(topology, job, gids, leaf_load, fit, priced)
            if key < best_key:
                best_key, best_k, best_gids = key, k, gids
                if _at_bound(best_key, floor_key):
                    break
    regular = plans[best_k][2]
    # At the empty cluster's bound the free-set bound is reached too: neither the wider
    # candidates nor the search run, so it is not computed.
    if _at_bound(best_key, (math.inf, floor.comm_ms)):
        bound_ms = floor.comm_ms
    else:
        bound_ms = lower_bound(topology, job, free=free).comm_ms
    # A placement at the free-set bound is optimal (other jobs' flows only add); else look wider.
    if best_key[1] > bound_ms * (1 + 1e-9) + 1e-9:
        for gids, fit, is_regular in _wider_candidates(topology, idx, counts, free, job, spreads, seed):
            key = _key(topology, job, gids, leaf_load, fit, priced)
            if key < best_key:
                best_key, best_gids, regular = key, gids, is_regular
    gids = best_gids
    # Swaps and the local search only where the constructive stage missed the bound by more
    # than SEARCH_TOLERANCE: they cost a cost-model call a move and gain at most that much.
    above_bound = best_key[1] > bound_ms * (1 + SEARCH_TOLERANCE) + 1e-9
    if above_bound and not regular and job.gpus <= REFINE_MAX_GPUS:
        gids = refine(topology, idx, job, gids, free, leaf_load)
    if above_bound:
        gids, comm_ms = search(
            topology, job, gids, free, leaf_load, bound_ms, seed=seed, max_evals=search_evals(job)
        )
        if comm_ms > bound_ms * (1 + 1e-9) + 1e-9:
            # Ranks off NICs they share, onto free GPUs of the same node behind NICs the job
            # leaves unused: moves the search does not make.
            gids = spread_rails(topology, job, gids, free, leaf_load)
            if job.gpus <= REFINE_MAX_GPUS:
                gids = _rails_on_other_sets(topology, job, gids, free, leaf_load, priced)
        # No regression by construction: the plain nestings of the GPU set the search ended on
        # are priced too (swaps from a mixed start may never re-assemble whole groups).
        gids = _nested_on_set(topology, idx, job, gids, leaf_load, priced)
        price = functools.partial(_key, topology, job, leaf_load=leaf_load, fit=0.0, priced=priced)
        gids = _node_exchanges(idx, job, gids, price, priced)
        # Last, the map with its nodes moved onto more units of the pod, groups' shapes kept.
        for pod, _, fewest in spreads if job.gpus <= NODE_SPREAD_MAX_GPUS else ():
            for moved, _ in node_spreads(idx, counts, job, gids, pod, fewest):
                if price(moved) < price(gids):
                    gids = moved
    prediction = whole.get(np.asarray(gids, dtype=np.int64).tobytes())
    if prediction is None:
        prediction = evaluate(topology, job, gids, leaf_load)
    return Placement("topo", tuple(np.asarray(gids).tolist()), prediction)


def _rails_on_other_sets(
    topology: Topology,
    job: JobSpec,
    gids: np.ndarray,
    free: np.ndarray,
    leaf_load: np.ndarray,
    priced: dict[bytes, tuple[float, float]],
) -> np.ndarray:
    """`gids`, or the cheapest map rail spreading makes of the best priced map of each of the next
    RAIL_SETS GPU sets (by exposed, then all comm ms) where one is cheaper: on nodes whose NICs
    serve several GPUs a dearer set may spread over more NICs (a DP64 MoE job on PCIe nodes,
    206.2 ms to 160.8 against 178.9 from the best set)."""
    gids = np.asarray(gids, dtype=np.int64)
    best = _key(topology, job, gids, leaf_load, 0.0, priced)[:2]
    sets = {np.sort(gids).tobytes()}
    tried = 0
    for raw, key in sorted(priced.items(), key=lambda item: item[1]):
        if tried == RAIL_SETS:
            break
        trial = np.frombuffer(raw, dtype=np.int64)
        gset = np.sort(trial).tobytes()
        if gset in sets:
            continue
        sets.add(gset)
        tried += 1
        spread = spread_rails(topology, job, trial, free, leaf_load, max_evals=RAIL_SET_EVALS)
        key = _key(topology, job, spread, leaf_load, 0.0, priced)[:2]
        if key < best:
            best, gids = key, spread
    return gids


def _nested_on_set(
    topology: Topology,
    idx: HierarchyIndex,
    job: JobSpec,
    gids: np.ndarray,
    leaf_load: np.ndarray,
    priced: dict[bytes, tuple[float, float]],
) -> np.ndarray:
    """`gids`, or the cheapest (exposed, then all comm ms) nested mapping of its GPU set where
    one is cheaper; then a climb from the cheapest nesting over its transpositions
    (`mapping.transposed`), on that nesting's slot order, within NEST_CLIMB_EVALS more prices
    (fewer for jobs whose search has fewer moves)."""
    gids = np.asarray(gids, dtype=np.int64)
    best = _key(topology, job, gids, leaf_load, 0.0, priced)[:2]
    start: tuple[tuple[float, float], np.ndarray, tuple[str, ...]] | None = None
    for order, nest, trial in candidate_layouts(idx, job, canonical(idx, gids), wider=True):
        key = _key(topology, job, trial, leaf_load, 0.0, priced)[:2]
        if start is None or key < start[0]:
            start = (key, order, nest)
        if key < best:
            best, gids = key, trial
    if start is None:
        return gids
    left = min(NEST_CLIMB_EVALS, search_evals(job))
    nest_key, order, nest = start
    tried = {nest}
    improved = True
    while improved and left > 0:
        improved = False
        for step in transposed(job, nest):
            if left <= 0:
                break
            if step in tried:
                continue
            tried.add(step)
            trial = lay_out(job, order, step)
            fresh = trial.tobytes() not in priced
            key = _key(topology, job, trial, leaf_load, 0.0, priced)[:2]
            left -= fresh
            if key < nest_key:
                nest_key, nest, improved = key, step, True
                if key < best:
                    best, gids = key, trial
                break
    return gids


def _node_exchanges(
    idx: HierarchyIndex,
    job: JobSpec,
    gids: np.ndarray,
    price: Callable[[np.ndarray], tuple[float, ...]],
    priced: Mapping[bytes, object],
) -> np.ndarray:
    """`gids`, or a cheaper map (exposed, then all comm ms) its own GPUs reach by exchanging the
    ranks of two of the job's nodes, rank order kept on each: every pair that holds as many of
    its ranks and differs in unit (leaf, scalable unit) or NVLink domain, in node order, each
    improvement kept and the sweep going on from the next pair until a whole round improves
    nothing, within NODE_EXCHANGE_EVALS prices not in `priced` yet (none for jobs whose search
    has fewer moves). `price` gives a map's key (`_key`), memoised in `priced`. Nestings lay stages
    and replicas on nodes in id order, and the search's node moves are random draws: a tp4 x
    pp4 x dp4 job under a hot spine kept a pipeline crossing leaves three times where one
    exchange makes it twice (85.09 to 78.37 ms).
    When a round of pairs improves nothing, the ranks of three such nodes in three different
    cells are rotated (both ways, in node order; NODE_CYCLE_EVALS more prices, at most half the
    search's moves), and after an
    improvement the pairs sweep again: a map can be a local optimum of every exchange of two
    nodes and not of a rotation of three (a tp4 x pp4 x dp4 job at 4:1 on 8 nodes of four
    leaves, 64.78 to 51.34 ms, the free-set bound, with one rotation)."""
    gids = np.asarray(gids, dtype=np.int64)
    node_of = idx.gpu_node[gids]
    nodes, counts = np.unique(node_of, return_counts=True)
    if nodes.size < 2 or search_evals(job) < NODE_EXCHANGE_EVALS:
        return gids
    # A node's cell: its unit and NVLink domain.
    where = idx.gpu_cell[idx.node_first_gid[nodes]]
    pairs = [
        (int(a), int(b))
        for a, b in itertools.combinations(range(nodes.size), 2)
        if counts[a] == counts[b] and where[a] != where[b]
    ]
    if not pairs:
        return gids
    best = price(gids)[:2]
    # The ranks on each node, in rank order; an exchange moves such lists' GPUs.
    ranks = [np.flatnonzero(node_of == n) for n in nodes]
    left, left_cycles = NODE_EXCHANGE_EVALS, min(NODE_CYCLE_EVALS, search_evals(job) // 2)
    k = since = 0
    cycles = None
    while True:
        if left > 0 and since < len(pairs):
            a, b = pairs[k]
            k, since = (k + 1) % len(pairs), since + 1
            trial = gids.copy()
            trial[ranks[a]], trial[ranks[b]] = gids[ranks[b]], gids[ranks[a]]
            left -= trial.tobytes() not in priced
        else:
            # No exchange of two improves (or none is left to price): the next rotation of three.
            if cycles is None:
                cycles = _rotations(idx, gids, ranks, counts)
            rotation = next(cycles, None) if left_cycles > 0 else None
            if rotation is None:
                return gids
            a, b, d = rotation
            trial = gids.copy()
            trial[ranks[a]], trial[ranks[b]], trial[ranks[d]] = gids[ranks[b]], gids[ranks[d]], gids[ranks[a]]
            left_cycles -= trial.tobytes() not in priced
        key = price(trial)[:2]
        if key < best:
            # The pairs sweep again from here, and the rotations start over on the new map.
            best, gids, since, cycles = key, trial, 0, None


def _rotations(
    idx: HierarchyIndex, gids: np.ndarray, ranks: list[np.ndarray], counts: np.ndarray
) -> Iterator[tuple[int, int, int]]:
    """Rotations (a, b, c) of three of `ranks`' lists (a's ranks onto b's GPUs, b's onto c's, c's
    onto a's), as many ranks each and their nodes in three different cells, in list order, both
    ways round; lazily (a 512-GPU job's 64 nodes have 41,664 triples)."""
    where = [int(idx.gpu_cell[gids[r[0]]]) for r in ranks]
    for a, b, c in itertools.combinations(range(len(ranks)), 3):
        if counts[a] == counts[b] == counts[c] and len({where[a], where[b], where[c]}) == 3:
            yield a, b, c
            yield a, c, b


def _link_aware_sets(
    topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec, plans: list
) -> Iterator[tuple[np.ndarray, float, bool]]:
    """Link-aware sets beside the best-fit ones (`plans`, which the caller extends with each),
    ranked after them on fit. For a job one NVLink domain holds, only its equal pieces over
    several domains (NVL72 racks): a latency-bound allreduce's tree over two domains, a chain of
    n/2 ranks in each, takes fewer steps than one ring of n inside one."""
    if counts.domain.max() >= job.gpus:
        yield from ((gset, math.inf, False) for gset in domain_chunk_sets(idx, counts, job))
        return
    for gset in fast_sets(topology, idx, counts, job):
        yield gset, math.inf, False
    for gset in domain_chunk_sets(idx, counts, job):
        yield gset, math.inf, False
    # Unequal pieces (6 + 5 + 5, 24 + 8) that cover the job with few cells; only new sets.
    known = {np.sort(p[0]).tobytes() for p in plans}
    for gset in cover_sets(idx, counts, job):
        key = np.sort(gset).tobytes()
        if key not in known:
            known.add(key)
            yield gset, math.inf, False
    filled = rate_filled_set(topology, idx, counts, job)
    if filled is not None:
        yield filled, math.inf, False
    for gset in rail_balanced_sets(topology, idx, counts, job):
        key = np.sort(gset).tobytes()
        if key not in known:
            known.add(key)
            yield gset, math.inf, False


def _at_bound(key: tuple[float, ...], bound: tuple[float, float]) -> bool:
    """Whether a candidate's (exposed, all comm ms) key is at the bound's, each to 1e-9."""
    return all(x <= b * (1 + 1e-9) + 1e-9 for x, b in zip(key[:2], bound, strict=True))


def _one_best_domain(
    topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec, plans: list
) -> np.ndarray | None:
    """The first plan's map when the whole job sits in one uniform NVLink domain whose rate is the
    highest (and latency the lowest) of every domain with room for the job and at least any NIC's
    rate: every group then rides the fastest link the job could get. Only for jobs up to
    ONE_DOMAIN_MAX_GPUS: a larger ring in one domain pays a latency per member, and a hierarchical
    collective over two domains may price lower. None otherwise."""
    if len(plans) < 1 or not 2 <= job.gpus <= ONE_DOMAIN_MAX_GPUS:
        return None
    gset = plans[0][0]
    domain = int(idx.gpu_domain[gset[0]])
    if not idx.domain_uniform[domain] or (idx.gpu_domain[gset] != domain).any():
        return None
    room = counts.domain >= job.gpus
    bw, lat = topology.domain_bw, topology.domain_latency
    if bw[domain] < bw[room].max() or lat[domain] > lat[room].min():
        return None
    if topology.domain_nvls[domain] < topology.domain_nvls[room].max():
        return None
    if topology.gpu_nic_bw.size and bw[domain] < float(topology.gpu_nic_bw.max()):
        return None
    return next(candidate_mappings(idx, job, gset))


def _first_mappings(
    idx: HierarchyIndex, job: JobSpec, gset: np.ndarray, done: Callable[[], bool] = lambda: False
) -> Iterator[np.ndarray]:
    """A set's first nested mapping and, when it holds GPUs of nodes with intra links, the first
    mapping of its island order (`mapping.island_order`); none is built once `done()`."""
    if done():
        return
    yield next(candidate_mappings(idx, job, gset))
    if done():
        return
    islands = island_order(idx, gset, job.tp * job.cp)
    if islands is not None:
        for nest in nestings(job):
            if done():
                return
            yield lay_out(job, islands, nest)


def search_evals(job: JobSpec) -> int:
    """Moves the local search may price for `job` (SEARCH_EVALS)."""
    return next(evals for most, evals in SEARCH_EVALS if job.gpus <= most)


def _wider_candidates(
    topology: Topology,
    idx: HierarchyIndex,
    counts: Free,
    free: np.ndarray,
    job: JobSpec,
    spreads: list[tuple[int, int, int]],
    seed: int,
) -> Iterator[tuple[np.ndarray, float, bool]]:
    """Spread layouts over more units of the best pods, then every baseline's placement, then the
    baselines' GPU sets in the nested mappings; as (gids, fit score, regular?). Jobs that fit on
    a node with intra links also get that node's best GPU subsets and TP splits first; jobs
    larger than the uniform NVLink domains' free GPUs, the sets that add GPUs of nodes with
    intra links thinly (`intra.thin_sets`)."""
    for gids in intra_candidates(topology, free, job):
        yield gids, 0.0, True
    # A job the uniform NVLink domains cannot hold: their GPUs and the rest thinly from nodes
    # with intra links, in every nested mapping and island order.
    for gset in thin_sets(topology, idx, free, job):
        yield from ((gids, math.inf, False) for gids in candidate_mappings(idx, job, gset))
        islands = island_order(idx, gset, job.tp * job.cp)
        if islands is not None:
            yield from ((lay_out(job, islands, nest), math.inf, False) for nest in nestings(job))
    for pod, chunk, fewest in spreads:
        for gids, fit in spread_candidates(idx, counts, job, pod, chunk, fewest):
            yield gids, fit, True
    for k, (_, choose) in enumerate(BASELINES):
        chosen = np.asarray(choose(topology, free, None, job, seed), dtype=np.int64)
        # Ranked after every set of ours on fit, so a tie keeps our own placement.
        yield chosen, math.inf, False
        if k < BASELINES_REMAPPED:
            for gids in candidate_mappings(idx, job, canonical(idx, chosen)):
                yield gids, math.inf, False


def _key(
    topology: Topology,
    job: JobSpec,
    gids: np.ndarray,
    leaf_load: np.ndarray,
    fit: float,
    priced: dict[bytes, tuple[float, float]],
    whole: dict[bytes, Prediction] | None = None,
):
    """Sort key of a candidate: the predicted comm ms left exposed (not hidden behind compute, what
    the step time pays), then all comm ms, each to 1e-9, then the fit score. `priced` memoises
    the two times by map; `whole`, when given, keeps the map's Prediction with every group."""
    key = np.asarray(gids, dtype=np.int64).tobytes()
    hit = priced.get(key)
    if hit is None:
        pred = evaluate(topology, job, gids, leaf_load, detail=whole is not None)
        if whole is not None:
            whole[key] = pred
        hit = priced[key] = (round(pred.step_ms - job.compute_ms, 9), round(pred.comm_ms, 9))
    return (*hit, fit)


def chunk_ladder(idx: HierarchyIndex, job: JobSpec) -> list[tuple[int, int]]:
    """(chunk, unit alignment) pairs to try, strictest first.

    A chunk is how many GPUs every NVLink domain supplies a multiple of: TP*CP*EP, TP*CP, TP*EP
    and TP (so those groups stay inside a domain), then powers of two down to 1 - the larger the pieces a group
    spans domains in, the more rails its hierarchical allreduce runs on. A unit supplies whole
    PP stages (gpus/pp GPUs) or whole DP replicas (gpus/dp) when it can, else whole TP groups, so that
    a job spanning units crosses between them along one kind of group only. Last comes no
    alignment at all, which always fits."""
    sizes = [job.tp * job.cp * job.ep, job.tp * job.cp, job.tp * job.ep, job.tp]
    c = 1
    while c * 2 <= idx.max_domain_gpus and job.gpus % (c * 2) == 0:
        c *= 2
    while c >= 1:
        sizes.append(c)
        c //= 2
    # A PP stage and a DP replica, in GPUs.
    blocks = sorted({job.gpus // job.pp, job.gpus // job.dp}, reverse=True)
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


def _candidate_sets(
    idx: HierarchyIndex, counts: Free, job: JobSpec
) -> tuple[list[tuple[np.ndarray, float, bool]], list[tuple[int, int, int]]]:
    """Candidate GPU sets as (gids in canonical order, fit score, regular?), and the pods worth
    spreading the job over as (pod, chunk, units its best set there uses)."""
    n = job.gpus
    fits = np.flatnonzero((counts.domain >= n) & idx.domain_uniform)
    if fits.size:
        # One NVLink domain holds the job: every group rides NVLink, so only fit matters.
        leftover = counts.domain[fits] - n
        domain = int(fits[np.lexsort((fits, leftover))[0]])
        members, off = idx.nodes_of_domain
        nodes = members[off[domain] : off[domain + 1]]
        gset = take_nodes(idx, counts, nodes, n)
        return _with_lowest_ids(counts, n, [(canonical(idx, gset), float(leftover.min()), True)]), []
    plans: list[tuple[np.ndarray, float, bool]] = []
    spreads: list[tuple[int, int, int]] = []
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
                gset = take(idx, counts, caps, level, int(blocks[k]), n)
                scored.append(
                    (
                        float(leftover[k]) + fragmentation(idx, counts, gset),
                        float(load[blocks[k]]),
                        int(blocks[k]),
                        gset,
                    )
                )
            scored.sort(key=lambda s: (s[0], s[1]))
            if level == "pod":
                spreads = [(b, c, np.unique(idx.gpu_unit[gs]).size) for _, _, b, gs in scored[:PODS_SPREAD]]
            for fit, _, _, gset in scored[:BLOCKS_PRICED]:
                key = np.sort(gset).tobytes()
                if key not in seen:
                    seen.add(key)
                    regular = c == ladder[0][0] and _whole_chunks(idx, gset, job.tp)
                    plans.append((canonical(idx, gset), fit, regular))
            break
    return (_with_lowest_ids(counts, n, plans) if plans else plans), spreads


def _with_lowest_ids(counts: Free, n: int, plans: list) -> list[tuple[np.ndarray, float, bool]]:
    """`plans` plus the lowest free ids (first_fit's set), ranked last on fit, if not already in."""
    lowest = counts.ids[:n]
    if all(np.sort(gset).tobytes() != lowest.tobytes() for gset, _, _ in plans):
        plans.append((lowest, math.inf, False))
    return plans


def _raw_free(idx: HierarchyIndex, counts: Free, level: str, blocks: np.ndarray) -> np.ndarray:
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


def _whole_chunks(idx: HierarchyIndex, gset: np.ndarray, tp: int) -> bool:
    """True when every NVLink domain holds a multiple of tp of the set's GPUs."""
    _, per_domain = np.unique(idx.gpu_domain[gset], return_counts=True)
    return bool((per_domain % tp == 0).all())
