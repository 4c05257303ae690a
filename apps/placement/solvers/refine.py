"""Swap refinement of a mapping against the cost model, for irregular free sets.

Hill climbing on the predicted comm time: take the slowest group that spans NVLink domains, find
the domain holding most of its members, and try to pull each outlier member into that domain -
by swapping it with a rank of the job already there, or by moving it to a free unused GPU there.
The best improving move is kept; a group with no improving move is set aside. Bounded by a budget
of cost-model evaluations so it stays in milliseconds.
"""

from __future__ import annotations

import numpy as np

from ..costmodel import evaluate
from ..jobs import JobSpec
from ..topology import Topology
from .base import HierarchyIndex

MAX_EVALUATIONS = 160
MOVES_PER_OUTLIER = 6


def refine(
    topology: Topology,
    idx: HierarchyIndex,
    job: JobSpec,
    gids: np.ndarray,
    free: np.ndarray,
    leaf_load: np.ndarray,
) -> np.ndarray:
    """A mapping at least as cheap (predicted comm ms) as `gids`, using only `free` GPUs."""
    cur = np.array(gids, dtype=np.int64)
    cur_cost = evaluate(topology, job, cur, leaf_load, detail=False).comm_ms
    used = np.zeros(topology.n_gpus, dtype=bool)
    used[cur] = True
    budget = MAX_EVALUATIONS
    stuck: set[tuple[int, ...]] = set()
    while budget > 0:
        pred = evaluate(topology, job, cur, leaf_load)
        target = _slowest_spanning_group(idx, cur, pred.groups, stuck)
        if target is None:
            break
        ranks = np.asarray(target, dtype=np.int64)
        doms = idx.gpu_domain[cur[ranks]]
        values, counts = np.unique(doms, return_counts=True)
        home = int(values[np.argmax(counts)])
        outliers = ranks[doms != home]
        in_group = np.zeros(job.gpus, dtype=bool)
        in_group[ranks] = True
        # Partners: ranks of the job in the home domain outside the group; spare free GPUs there.
        at_home = np.flatnonzero((idx.gpu_domain[cur] == home) & ~in_group)
        members, off = idx.nodes_of_domain
        home_nodes = members[off[home] : off[home + 1]]
        spare = np.concatenate(
            [
                np.flatnonzero(
                    free[idx.node_first_gid[k] : idx.node_first_gid[k] + idx.node_gpu_count[k]]
                    & ~used[idx.node_first_gid[k] : idx.node_first_gid[k] + idx.node_gpu_count[k]]
                )
                + idx.node_first_gid[k]
                for k in home_nodes
            ]
        )
        best_cost, best_move = cur_cost, None
        for r in outliers:
            for partner in at_home[:MOVES_PER_OUTLIER]:
                trial = cur.copy()
                trial[r], trial[partner] = cur[partner], cur[r]
                cost = evaluate(topology, job, trial, leaf_load, detail=False).comm_ms
                budget -= 1
                if cost < best_cost - 1e-12:
                    best_cost, best_move = cost, ("swap", int(r), int(partner))
            for g in spare[:MOVES_PER_OUTLIER]:
                trial = cur.copy()
                trial[r] = g
                cost = evaluate(topology, job, trial, leaf_load, detail=False).comm_ms
                budget -= 1
                if cost < best_cost - 1e-12:
                    best_cost, best_move = cost, ("move", int(r), int(g))
            if budget <= 0:
                break
        if best_move is None:
            stuck.add(tuple(int(x) for x in ranks))
            continue
        kind, r, other = best_move
        if kind == "swap":
            cur[r], cur[other] = cur[other], cur[r]
        else:
            used[cur[r]] = False
            used[other] = True
            cur[r] = other
        cur_cost = best_cost
    return cur


def _slowest_spanning_group(idx, cur, groups, stuck) -> tuple[int, ...] | None:
    """Ranks of the slowest group whose members sit in more than one NVLink domain, not set aside."""
    best, best_time = None, 0.0
    for gc in groups:
        if gc.time_ms <= best_time or gc.ranks in stuck or len(gc.ranks) < 2:
            continue
        doms = idx.gpu_domain[cur[list(gc.ranks)]]
        if (doms != doms[0]).any():
            best, best_time = gc.ranks, gc.time_ms
    return best
