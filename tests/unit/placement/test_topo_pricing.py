"""topo prices fewer maps once one is at the empty cluster's bound, and chooses as well as when it
priced every candidate (the shortcut switched off)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from apps.placement.bounds import lower_bound
from apps.placement.solvers import Placement, place
from apps.placement.solvers import topo as topo_solver

from .test_solvers import LLM_COMM, cluster_and_job, generated, make_job


def _full_pricing(monkeypatch):
    """topo as it was before the shortcut: no map ever counts as at the bound."""
    monkeypatch.setattr(topo_solver, "_at_bound", lambda key, bound: False)


def _counted(monkeypatch) -> list[int]:
    calls = [0]
    original = topo_solver._key

    def key(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(topo_solver, "_key", key)
    return calls


def _no_worse(ours, theirs):
    """Exposed comm (step) first, then all comm, as topo's key; equal within 1e-9."""
    a, b = ours.prediction, theirs.prediction
    if a.step_ms < b.step_ms * (1 - 1e-9):
        return True
    return a.step_ms <= b.step_ms * (1 + 1e-9) + 1e-9 and a.comm_ms <= b.comm_ms * (1 + 1e-9) + 1e-9


def test_a_map_at_the_empty_clusters_bound_ends_the_pricing(monkeypatch):
    topo = generated(leaves=4, nodes_per_leaf=4)
    job = make_job(tp=4, pp=2, dp=2, comm=LLM_COMM)
    calls = _counted(monkeypatch)
    ours = place(topo, topo.free_mask(), None, job, policy="topo")
    priced_ours = calls[0]
    assert ours.prediction.comm_ms == pytest.approx(lower_bound(topo, job).comm_ms, rel=1e-9)
    calls[0] = 0
    _full_pricing(monkeypatch)
    full = place(topo, topo.free_mask(), None, job, policy="topo")
    assert priced_ours == 1 < calls[0]
    assert ours.gids == full.gids


def test_the_free_set_bound_is_not_computed_at_the_empty_clusters_bound(monkeypatch):
    topo = generated(leaves=4, nodes_per_leaf=4)
    free = topo.free_mask()
    free[:3] = False
    job = make_job(tp=4, pp=2, dp=2, comm=LLM_COMM)
    frees = []
    original = topo_solver.lower_bound

    def bound(topology, job, *, free=None):
        frees.append(free is not None)
        return original(topology, job, free=free)

    monkeypatch.setattr(topo_solver, "lower_bound", bound)
    assert isinstance(place(topo, free, None, job, policy="topo"), Placement)
    assert frees == [False]


@pytest.mark.parametrize("overlap", [0.0, 0.5])
@pytest.mark.parametrize("microbatches", [None, 8])
def test_the_shortcut_chooses_as_cheap_a_map_as_full_pricing_on_fragmented_pods(
    monkeypatch, overlap, microbatches
):
    topo = generated(leaves=4, nodes_per_leaf=4)
    comm = [dict(c) for c in LLM_COMM]
    comm[1]["overlap"] = overlap
    job = make_job(tp=4, pp=2, dp=4, comm=comm)
    if microbatches:
        job = replace(job, microbatches=microbatches)
    # Three fragmented free sets for each of the four jobs, each job its own (twelve in all).
    rng = np.random.default_rng([7, int(overlap * 10), microbatches or 0])
    for _ in range(3):
        free = rng.random(topo.n_gpus) >= 0.35
        if int(free.sum()) < job.gpus:
            continue
        ours = place(topo, free, None, job, policy="topo")
        with monkeypatch.context() as m:
            _full_pricing(m)
            full = place(topo, free, None, job, policy="topo")
        assert _no_worse(ours, full)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_and_job())
def test_the_shortcut_never_chooses_a_dearer_map_than_full_pricing(case):
    topo, free, job, seed = case
    ours = place(topo, free, None, job, policy="topo", seed=seed)
    with pytest.MonkeyPatch.context() as m:
        _full_pricing(m)
        full = place(topo, free, None, job, policy="topo", seed=seed)
    if isinstance(full, Placement):
        assert isinstance(ours, Placement)
        assert _no_worse(ours, full)


def test_link_aware_sets_are_built_only_when_no_better_fitting_set_is_at_the_bound(monkeypatch):
    topo = generated(leaves=4, nodes_per_leaf=4)
    job = make_job(tp=4, pp=2, dp=2, comm=LLM_COMM)
    built = []
    original = topo_solver.fast_sets

    def fast_sets(*args):
        built.append(1)
        return original(*args)

    monkeypatch.setattr(topo_solver, "fast_sets", fast_sets)
    ours = place(topo, topo.free_mask(), None, job, policy="topo")
    assert built == []
    _full_pricing(monkeypatch)
    full = place(topo, topo.free_mask(), None, job, policy="topo")
    assert built == [1]
    assert ours.gids == full.gids


def test_a_placement_at_the_bound_costs_one_cost_model_call(monkeypatch):
    topo = generated(leaves=4, nodes_per_leaf=4)
    job = make_job(tp=4, pp=2, dp=2, comm=LLM_COMM)
    calls = []
    original = topo_solver.evaluate

    def evaluate(*args, **kwargs):
        calls.append(kwargs.get("detail", True))
        return original(*args, **kwargs)

    monkeypatch.setattr(topo_solver, "evaluate", evaluate)
    placed = place(topo, topo.free_mask(), None, job, policy="topo")
    assert calls == [True]
    again = original(topo, job, placed.gids)
    assert placed.prediction == again
    assert len(placed.prediction.groups) == len(again.groups) > 0
