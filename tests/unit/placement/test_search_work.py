"""What the local search prices: the spread, its tie-break, only when a move ties the current map
on exposed and all comm ms."""

from __future__ import annotations

import numpy as np

from apps.placement.bounds import lower_bound
from apps.placement.solvers import search as search_module

from .test_link_aware import _tp_pp_job, cluster, node


def test_the_spread_is_computed_only_for_maps_that_tie_on_comm(monkeypatch):
    topo = cluster([node(f"n{i}", 8) for i in range(4)])
    j = _tp_pp_job(2, 8, 2, 1e6, 4e8)
    free = np.ones(topo.n_gpus, dtype=bool)
    start = np.random.default_rng(3).permutation(topo.n_gpus)[: j.gpus]
    bound = lower_bound(topo, j, free=free).comm_ms
    priced, spreads = {}, []
    evaluate, spread = search_module.evaluate, search_module._spread

    def counted_evaluate(topology, job, gids, *args, **kwargs):
        pred = evaluate(topology, job, gids, *args, **kwargs)
        priced[np.asarray(gids).tobytes()] = (pred.step_ms, pred.comm_ms)
        return pred

    def counted_spread(topology, gids, weighted):
        spreads.append(priced[gids.tobytes()])
        return spread(topology, gids, weighted)

    monkeypatch.setattr(search_module, "evaluate", counted_evaluate)
    monkeypatch.setattr(search_module, "_spread", counted_spread)
    gids, cost = search_module.search(
        topo, j, start, free, np.zeros(1), bound, max_evals=3000, stall_evals=3000
    )
    assert cost < evaluate(topo, j, start).comm_ms
    # Every spread was asked for by a tie: at least two priced maps share its (step, comm).
    ties = list(priced.values())
    assert spreads and len(spreads) < len(priced)
    assert all(sum(abs(s - t[0]) < 1e-9 and abs(c - t[1]) < 1e-9 for t in ties) >= 2 for s, c in spreads)
