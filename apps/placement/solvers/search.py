"""Local search over rank -> GPU maps against the cost model, for any job size, within a budget.

Started from topo's cheapest constructive candidate, it tries moves and keeps any that lowers the
predicted comm time left exposed (then all comm time), or keeps both and scatters the
communicating groups no more (`_spread`, the declared traffic times the member pairs each group
splits between domains and leaves): equal moves let it cross plateaus, such as a group that only
gets faster once both of its slow nodes are replaced. A half move is kept only when it lowers
the exposed, all or every group's comm time (`Prediction.group_ms`), whatever it does to the
split count: an entry is priced by its slowest group, so repairing one of two TP groups split
3 + 1 shows only in the sum, and 2 + 2 splits more pairs (but runs on two rails, not one). Moves:
- node move: the job's ranks on one node go to another node's GPUs, in GPU order, exchanging
  with the job's ranks there or taking its unused free GPUs (this is what repairs a set chosen
  blind to link speed: two nodes whose GPUs share one NIC traded for 8-NIC nodes);
- group swap: two groups of one kind exchange their GPUs member by member (repairs nesting);
- rank swap: two ranks on different nodes exchange GPUs;
- rank move: a rank moves to an unused free GPU;
- half move: for a TP group of 4 or more split over nodes, another node b with room ends with half
  of it (or all of it): its members on neither b nor the node holding most of it (a) go first,
  then members from a, exchanging with the job's other ranks on b or taking b's free GPUs
  (3 + 1 to 2 + 2, also on a third node; 4 + 0 to 2 + 2 and back; two groups' halves swapped).
Then a regroup pass, within `regroup_evals` more prices: the map's own GPU set in each nested
mapping (`mapping.py`), so a mixed map gets its whole groups and their node order back; and each
group of a kind a node could hold whole (TP, CP, EP, a PP or DP group) that is split over nodes
tried whole on each of its nodes with room, its members elsewhere exchanging with the ranks
there, the members of another group of its kind first (two TP groups split 4 + 4 over two nodes
become whole in one move, where single swaps pass through dearer maps). Kept as half moves are;
the pass runs after the seeded moves, so it changes none of their draws.
It stops at the free-set lower bound (nothing is cheaper), after `stall_evals` moves in a row that
improve nothing or after `max_evals` moves, whichever comes first. The budget counts moves, not
seconds, and the moves are seeded: the same inputs give the same map on a busy machine as on an
idle one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..costmodel import evaluate
from ..groups import group_arrays
from ..jobs import JobSpec
from ..topology import Topology
from .base import hierarchy
from .blocks import canonical
from .mapping import candidate_mappings, declared_traffic

# Target nodes a node move may pick from: the best by free network rate per GPU.
TARGET_NODES = 48
# Moves in a row that improve neither the cost nor the spread before the search gives up.
STALL_EVALS = 200
# How often each move is tried: node move, group swap, rank swap, rank move, half move.
MOVE_WEIGHTS = (0.35, 0.25, 0.25, 0.15, 0.25)
# Prices the regroup pass may spend after the moves (gathers of split groups, nested re-layouts).
REGROUP_EVALS = 32


def search(
    topology: Topology,
    job: JobSpec,
    gids: np.ndarray,
    free: np.ndarray,
    leaf_load: np.ndarray,
    bound_ms: float,
    *,
    seed: int = 0,
    max_evals: int = 600,
    stall_evals: int = STALL_EVALS,
    regroup_evals: int | None = None,
) -> tuple[np.ndarray, float]:
    """A map at most as costly (predicted exposed, then all comm ms) as `gids` on the `free` GPUs,
    and its comm ms."""
    rng = np.random.default_rng(seed)
    cur = np.array(gids, dtype=np.int64)

    arrays = group_arrays(job)
    traffic = declared_traffic(job)
    weighted = [(arrays[k], w) for k, w in traffic.items() if w > 0 and arrays[k].shape[1] > 1]

    priced: dict[bytes, list] = {}

    def cost(trial: np.ndarray) -> list:
        # Exposed comm ms (what the step pays), all comm ms, every group's ms, then the spread
        # (None until a tie on the first two asks for it); a map the search comes back to (a move
        # undone, a swap of equal groups) is priced once.
        key = trial.tobytes()
        hit = priced.get(key)
        if hit is None:
            pred = evaluate(topology, job, trial, leaf_load, detail=False)
            hit = priced[key] = [pred.step_ms - job.compute_ms, pred.comm_ms, pred.group_ms, None]
        return hit

    def spread(trial: np.ndarray, c: list) -> float:
        if c[3] is None:
            c[3] = _spread(topology, trial, weighted)
        return c[3]

    cur_cost = cost(cur)
    stop = bound_ms * (1 + 1e-9) + 1e-9
    owner = np.full(topology.n_gpus, -1, dtype=np.int64)
    owner[cur] = np.arange(cur.size)
    targets = _target_nodes(topology, free, cur)
    groups = [a for a in arrays.values() if a.shape[0] > 1 and a.shape[1] > 1]
    # Half moves split or join TP groups of 4 or more only: on PP and DP groups they spent the
    # budget of the other moves for nothing on the adversarial bench.
    tp_groups = arrays["tp"] if job.tp >= 4 and arrays["tp"].shape[0] > 1 else None

    def half(topology, rng, cur, owner, free, targets, groups):
        return _half_move(topology, rng, cur, owner, free, targets, tp_groups)

    moves = (_node_move, _group_swap, _rank_swap, _rank_move, half)
    weights = np.array(MOVE_WEIGHTS) * [1, bool(groups), 1, 1, tp_groups is not None]
    weights /= weights.sum()
    evals = stalled = 0
    while evals < max_evals and stalled < stall_evals and cur_cost[1] > stop:
        move = moves[int(rng.choice(len(moves), p=weights))]
        trial = move(topology, rng, cur, owner, free, targets, groups)
        if trial is None:
            evals += 1
            continue
        c = cost(trial)
        evals += 1
        if move is half:
            # Kept only when it lowers exposed, all or every group's comm ms, the split count
            # aside: what makes 3 + 1 into 2 + 2.
            order = -1 if _compare(tuple(c[:3]), tuple(cur_cost[:3])) < 0 else 1
        else:
            # Exposed, then all comm ms, then the spread, priced only on a tie.
            order = _compare(tuple(c[:2]), tuple(cur_cost[:2]))
            if order == 0:
                order = _compare((*c[:2], spread(trial, c)), (*cur_cost[:2], spread(cur, cur_cost)))
        stalled = 0 if order < 0 else stalled + 1
        if order <= 0:
            owner[cur] = -1
            cur, cur_cost = trial, c
            owner[cur] = np.arange(cur.size)
    # The regroup pass: gathers of split groups, then the set's nested mappings, as long as one
    # improves and the budget lasts.
    node_max = int(topology.node_gpu_count.max())
    kinds = sorted(
        (a for a in arrays.values() if a.shape[0] > 1 and 1 < a.shape[1] <= node_max),
        key=lambda a: a.shape[1],
    )
    # No more than the moves had: large jobs price few maps.
    left = min(REGROUP_EVALS, max_evals) if regroup_evals is None else regroup_evals
    improved = True
    while improved and left > 0 and cur_cost[1] > stop:
        improved = False
        for trial in itertools.chain(
            _renests(topology, job, cur), _gathers(topology, cur, owner, free, kinds)
        ):
            if left <= 0:
                break
            left -= 1
            c = cost(trial)
            if _compare(tuple(c[:3]), tuple(cur_cost[:3])) < 0:
                owner[cur] = -1
                cur, cur_cost = trial, c
                owner[cur] = np.arange(cur.size)
                improved = True
                break
    return cur, cur_cost[1]


def _compare(a: tuple[float, ...], b: tuple[float, ...]) -> int:
    """-1, 0 or 1 as `a` is better, as good or worse than `b`, key by key, equal within 1e-12 ms
    (1e-9 relative for the group sum and the spread)."""
    tols = (1e-12, 1e-12, *(1e-9 * max(abs(y), 1.0) for y in b[2:]))
    for x, y, tol in zip(a, b, tols, strict=True):
        if x < y - tol:
            return -1
        if x > y + tol:
            return 1
    return 0


def _spread(topology: Topology, gids: np.ndarray, weighted: list[tuple[np.ndarray, float]]) -> float:
    """How scattered the communicating groups are: per kind, its declared traffic per rank times
    the member pairs of its groups in different NVLink domains and under different leaves, over
    the group size. Breaks the cost model's ties, since an entry costs only its slowest group:
    moving one of many slow groups changes nothing until the last one is repaired."""
    total = 0.0
    for arr, weight in weighted:
        rows, size = arr.shape
        row = np.repeat(np.arange(rows, dtype=np.int64), size)
        for per_gpu in (topology.gpu_domain, topology.gpu_leaf):
            ids = per_gpu[gids[arr]].astype(np.int64).ravel() + 1
            _, together = np.unique(row * (int(ids.max()) + 1) + ids, return_counts=True)
            apart = (rows * size * size - int((together.astype(np.int64) ** 2).sum())) / 2
            total += weight * apart / size
    return total


def _node_gids(topology: Topology, node: int) -> np.ndarray:
    first = int(topology.node_first_gid[node])
    return np.arange(first, first + int(topology.node_gpu_count[node]))


def _target_nodes(topology: Topology, free: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """Nodes a node move may use: the job's own and those with free GPUs, the fastest network
    rate per free GPU first, at most TARGET_NODES."""
    usable = free.copy()
    usable[cur] = True
    per_node = np.bincount(topology.gpu_node[usable], minlength=len(topology.nodes))
    rate = np.bincount(
        topology.gpu_node[usable], weights=topology.gpu_nic_bw[usable], minlength=per_node.size
    )
    nodes = np.flatnonzero(per_node)
    order = np.lexsort((nodes, -per_node[nodes], -rate[nodes] / per_node[nodes]))
    own = np.unique(topology.gpu_node[cur])
    return np.union1d(nodes[order[:TARGET_NODES]], own)


def _node_move(topology, rng, cur, owner, free, targets, groups):
    own_nodes = np.unique(topology.gpu_node[cur])
    a = int(rng.choice(own_nodes))
    b = int(rng.choice(targets))
    if a == b:
        return None
    ga, gb = _node_gids(topology, a), _node_gids(topology, b)
    ranks_a = owner[ga][owner[ga] >= 0]
    # Node b's GPUs the job may take: its own ranks' and the free ones.
    slots_b = gb[(owner[gb] >= 0) | free[gb]]
    if slots_b.size < ranks_a.size:
        return None
    trial = cur.copy()
    ranks_b = owner[slots_b[: ranks_a.size]]
    back = ga[(owner[ga] >= 0)][: int((ranks_b >= 0).sum())]
    trial[ranks_a] = slots_b[: ranks_a.size]
    trial[ranks_b[ranks_b >= 0]] = back
    return trial


def _group_swap(topology, rng, cur, owner, free, targets, groups):
    kind = groups[int(rng.integers(len(groups)))]
    i, j = rng.choice(kind.shape[0], size=2, replace=False)
    trial = cur.copy()
    trial[kind[i]], trial[kind[j]] = cur[kind[j]], cur[kind[i]]
    return trial


def _rank_swap(topology, rng, cur, owner, free, targets, groups):
    a, b = rng.choice(cur.size, size=2, replace=False)
    if topology.gpu_node[cur[a]] == topology.gpu_node[cur[b]]:
        return None
    trial = cur.copy()
    trial[a], trial[b] = cur[b], cur[a]
    return trial


def _rank_move(topology, rng, cur, owner, free, targets, groups):
    node = int(rng.choice(targets))
    g = _node_gids(topology, node)
    spare = g[free[g] & (owner[g] < 0)]
    if not spare.size:
        return None
    trial = cur.copy()
    trial[int(rng.integers(cur.size))] = int(rng.choice(spare))
    return trial


def _half_move(topology, rng, cur, owner, free, targets, kind):
    node_of = topology.gpu_node[cur[kind]]
    split = np.flatnonzero((node_of != node_of[:, :1]).any(axis=1))
    row = int(rng.choice(split)) if split.size else int(rng.integers(kind.shape[0]))
    ranks, nodes = kind[row], node_of[row]
    # a: the node holding most of the group; node b ends with half of it (or all of it), the
    # members on neither a nor b going first, then members from a.
    held, count = np.unique(nodes, return_counts=True)
    a = int(rng.choice(held[count == count.max()]))
    keep = ranks.size // 2 if rng.random() < 0.7 else ranks.size
    in_group = np.zeros(cur.size, dtype=bool)
    in_group[ranks] = True
    options = []
    for b in np.union1d(np.unique(topology.gpu_node[cur]), targets):
        b = int(b)
        need = keep - int(np.count_nonzero(nodes == b))
        if b == a or need <= 0:
            continue
        gb = _node_gids(topology, b)
        holder = owner[gb]
        # b's GPUs the block may take: other ranks' (which go where the block was), unused free ones.
        slots = gb[((holder >= 0) & ~in_group[np.maximum(holder, 0)]) | ((holder < 0) & free[gb])]
        if slots.size >= need:
            options.append((need, slots, b))
    if not options:
        return None
    need, slots, b = options[int(rng.integers(len(options)))]
    moved = np.concatenate([ranks[(nodes != a) & (nodes != b)], ranks[nodes == a]])[:need]
    return _exchange(cur, owner, moved, rng.permutation(slots)[:need])


def _exchange(cur: np.ndarray, owner: np.ndarray, moved: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """`cur` with ranks `moved` on GPUs `slots`, the job's ranks there taking the GPUs they left."""
    trial = cur.copy()
    trial[moved] = slots
    displaced = owner[slots]
    back = displaced >= 0
    trial[displaced[back]] = cur[moved][back]
    return trial


def _gathers(topology, cur, owner, free, kinds) -> Iterator[np.ndarray]:
    """For each split group of `kinds` (smallest groups first), the map with it whole on each of
    its nodes that has room (the job's ranks outside the group, or unused free GPUs), the node
    holding most of it first; the ranks it displaces take the GPUs its members leave. Displaced
    first: ranks of another group of its kind with members on the nodes the gathered members
    leave (so both groups end whole), most such members first, then free GPUs, then the rest."""
    for arr in kinds:
        node_of = topology.gpu_node[cur[arr]]
        group_of = np.empty(cur.size, dtype=np.int64)
        group_of[arr] = np.arange(arr.shape[0])[:, None]
        in_group = np.zeros(cur.size, dtype=bool)
        for row in np.flatnonzero((node_of != node_of[:, :1]).any(axis=1)):
            ranks, nodes = arr[row], node_of[row]
            held, count = np.unique(nodes, return_counts=True)
            in_group[:] = False
            in_group[ranks] = True
            for b in held[np.argsort(-count, kind="stable")].tolist():
                need = ranks.size - int(np.count_nonzero(nodes == b))
                gb = _node_gids(topology, b)
                holder = owner[gb]
                mine = holder >= 0
                usable = (mine & ~in_group[np.maximum(holder, 0)]) | (~mine & free[gb])
                if np.count_nonzero(usable) < need:
                    continue
                slots, holder, mine = gb[usable], holder[usable], mine[usable]
                # A kind-mate scores by its members on the nodes the gathered members leave.
                on_left = np.count_nonzero(np.isin(node_of, held[held != b]), axis=1)
                mate = on_left[group_of[np.maximum(holder, 0)]]
                score = np.where(mine, np.where(mate > 0, 1.0 + mate, -1.0), 1.0)
                slots = slots[np.argsort(-score, kind="stable")][:need]
                yield _exchange(cur, owner, ranks[nodes != b], slots)


def _renests(topology, job, cur) -> Iterator[np.ndarray]:
    """The GPUs of `cur` in each of their nested mappings other than `cur` itself."""
    idx = hierarchy(topology)
    for trial in candidate_mappings(idx, job, canonical(idx, cur), wider=True):
        if not np.array_equal(trial, cur):
            yield trial
