"""No regression by construction: topo's answer is never dearer than the plain nestings of its own
GPU set, and the local search re-assembles TP groups split over whole nodes."""

from __future__ import annotations

import numpy as np
import pytest

from apps.placement.bounds import lower_bound
from apps.placement.costmodel import evaluate, load_array
from apps.placement.groups import group_arrays
from apps.placement.solvers import Placement, place
from apps.placement.solvers import topo as topo_module
from apps.placement.solvers.base import hierarchy
from apps.placement.solvers.blocks import canonical
from apps.placement.solvers.mapping import candidate_mappings, nestings
from apps.placement.solvers.search import _gathers, search
from apps.placement.solvers.topo import search_evals

from .test_adversarial_cases import cluster, job, node

TP_HEAVY = [
    {"group": "tp", "collective": "allreduce", "bytes": 4.2e7, "count": 96},
    {"group": "pp", "collective": "p2p", "bytes": 4.2e7, "count": 16},
    {"group": "dp", "collective": "allreduce", "bytes": 8e8},
]


def four_nodes():
    """Four 8-GPU nodes of 8 x 50 GB/s NICs, two under each of two leaves (2:1 uplinks)."""
    return cluster(2, 200, [node(f"n{i}", 8, f"leaf-{i // 2 + 1}", 8) for i in range(4)])


def plain_and_mixed(j):
    """The plain nesting (TP group g on node g) and the issue's map: TP groups 0 and 1 whole, 2
    and 3 split 4 + 4 over nodes 2 and 3."""
    tp = group_arrays(j)["tp"]
    plain = np.empty(j.gpus, dtype=np.int64)
    for g in range(4):
        plain[tp[g]] = np.arange(8) + 8 * g
    mixed = plain.copy()
    mixed[tp[2][4:]], mixed[tp[3][:4]] = plain[tp[3][:4]], plain[tp[2][4:]]
    return plain, mixed


def test_the_issues_split_tp_map_prices_well_above_the_plain_nesting_of_its_nodes():
    topo, j = four_nodes(), job(8, 2, 2, TP_HEAVY)
    plain, mixed = plain_and_mixed(j)
    assert np.array_equal(np.sort(plain), np.sort(mixed))
    plain_ms, mixed_ms = evaluate(topo, j, plain).comm_ms, evaluate(topo, j, mixed).comm_ms
    # Split TP and DP pairs across nodes: about 1.28x the plain nesting (the issue: 78.86 / 65.31).
    assert mixed_ms > 1.2 * plain_ms
    idx = hierarchy(topo)
    nested = min(evaluate(topo, j, g).comm_ms for g in candidate_mappings(idx, j, canonical(idx, mixed)))
    assert nested == pytest.approx(plain_ms)
    load = load_array(topo, None)
    got = topo_module._nested_on_set(topo, idx, j, mixed, load, {})
    assert evaluate(topo, j, got).comm_ms == pytest.approx(plain_ms)
    assert place(topo, np.ones(topo.n_gpus, dtype=bool), None, j).prediction.comm_ms == pytest.approx(
        plain_ms
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_search_reassembles_split_tp_groups_within_its_budget(seed):
    topo, j = four_nodes(), job(8, 2, 2, TP_HEAVY)
    plain, mixed = plain_and_mixed(j)
    free = np.ones(topo.n_gpus, dtype=bool)
    bound = lower_bound(topo, j, free=free).comm_ms
    gids, cost = search(
        topo, j, mixed, free, load_array(topo, None), bound, seed=seed, max_evals=search_evals(j)
    )
    assert cost == pytest.approx(evaluate(topo, j, plain).comm_ms)
    tp_nodes = topo.gpu_node[gids[group_arrays(j)["tp"]]]
    assert (tp_nodes == tp_nodes[:, :1]).all()


def test_a_gather_makes_two_interleaved_groups_whole_in_one_move():
    topo, j = four_nodes(), job(8, 2, 2, TP_HEAVY)
    _, mixed = plain_and_mixed(j)
    tp = group_arrays(j)["tp"]
    owner = np.full(topo.n_gpus, -1, dtype=np.int64)
    owner[mixed] = np.arange(j.gpus)
    free = np.ones(topo.n_gpus, dtype=bool)
    trials = list(_gathers(topo, mixed, owner, free, [tp]))
    # Groups 2 and 3, each whole on node 2 or on node 3.
    assert len(trials) == 4
    for trial in trials:
        assert sorted(trial.tolist()) == sorted(mixed.tolist())
        nodes = topo.gpu_node[trial[tp]]
        assert (nodes == nodes[:, :1]).all()
        assert np.array_equal(trial[tp[:2]], mixed[tp[:2]])


def test_nothing_split_gives_no_gather():
    topo, j = four_nodes(), job(8, 2, 2, TP_HEAVY)
    plain, _ = plain_and_mixed(j)
    owner = np.full(topo.n_gpus, -1, dtype=np.int64)
    owner[plain] = np.arange(j.gpus)
    tp = group_arrays(j)["tp"]
    assert list(_gathers(topo, plain, owner, np.ones(topo.n_gpus, dtype=bool), [tp])) == []


@pytest.mark.parametrize("seed", range(8))
def test_topo_is_never_dearer_than_the_plain_nestings_of_its_own_gpus(seed):
    """Fragmented free sets with other jobs' load on the uplinks, on which the search runs: the
    answer prices at most the cheapest nested mapping of the GPUs it took."""
    rng = np.random.default_rng([34, seed])
    nodes = [node(f"n{i:02d}", 8, f"leaf-{i // 4 + 1}", int(rng.choice((1, 4, 8)))) for i in range(12)]
    topo = cluster(3, 200, nodes)
    free = rng.random(topo.n_gpus) < 0.7
    load = {f"leaf-{k + 1}": float(rng.uniform(0, 300)) for k in range(3)}
    tp, pp, dp = [(8, 2, 2), (4, 2, 4), (4, 4, 2)][seed % 3]
    j = job(tp, pp, dp, TP_HEAVY)
    got = place(topo, free, load, j)
    assert isinstance(got, Placement)
    idx = hierarchy(topo)
    leaf_load = load_array(topo, load)

    def key(g):
        pred = evaluate(topo, j, g, leaf_load, detail=False)
        return (round(pred.step_ms - j.compute_ms, 9), round(pred.comm_ms, 9))

    nested = min(key(g) for g in candidate_mappings(idx, j, canonical(idx, np.asarray(got.gids))))
    assert key(np.asarray(got.gids)) <= nested


def test_the_wider_nestings_add_the_second_heaviest_kind_innermost_and_reversed_traffic():
    j = job(8, 2, 1, TP_HEAVY)
    plain = nestings(j)
    wider = nestings(j, wider=True)
    assert wider[: len(plain)] == plain
    (extra,) = wider[len(plain) :]
    assert extra[:2] == ("pp", "tp")
    # A job moving nothing over its second kind gets only the reversed traffic order: its idle
    # DP pairs inside a node, each TP group across nodes.
    lone = job(8, 1, 2, TP_HEAVY[:1])
    plain = nestings(lone)
    wider = nestings(lone, wider=True)
    assert wider[: len(plain)] == plain
    (extra,) = wider[len(plain) :]
    assert [d for d in extra if d in ("tp", "dp")] == ["dp", "tp"]
