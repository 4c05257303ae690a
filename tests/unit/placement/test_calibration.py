"""The pure parts of bench/calibrate_pollux.py: NNLS, the overlap model, the comm features, the fit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench import calibrate_pollux
from bench.calibrate_pollux import (
    App,
    AppFit,
    exposed_ms,
    fit_app,
    group_medians,
    implied_comm_ms,
    nnls,
    spearman,
)


def brute_force_nnls(a, b):
    # The NNLS optimum is the least-squares solution on some support with all entries positive.
    best, best_x = np.inf, np.zeros(a.shape[1])
    for r in range(1, a.shape[1] + 1):
        for sub in itertools.combinations(range(a.shape[1]), r):
            x = np.linalg.lstsq(a[:, sub], b, rcond=None)[0]
            res = float(np.sum((a[:, sub] @ x - b) ** 2))
            if (x >= 0).all() and res < best:
                best, best_x = res, np.zeros(a.shape[1])
                best_x[list(sub)] = x
    return best_x


def test_nnls_matches_brute_force_on_random_problems():
    rng = np.random.default_rng(3)
    for _ in range(30):
        a = rng.normal(size=(12, 4))
        b = rng.normal(size=12)
        x = nnls(a, b)
        assert (x >= 0).all()
        assert np.allclose(x, brute_force_nnls(a, b), atol=1e-8)


def test_nnls_recovers_a_nonnegative_exact_solution():
    rng = np.random.default_rng(4)
    a = rng.uniform(size=(20, 5))
    truth = np.array([2.0, 0.0, 0.5, 3.0, 0.0])
    assert np.allclose(nnls(a, a @ truth), truth, atol=1e-9)


def test_overlap_gamma_one_exposes_all_comm_and_large_gamma_only_the_excess():
    compute = np.array([100.0, 100.0, 100.0])
    comm = np.array([50.0, 100.0, 300.0])
    assert np.allclose(exposed_ms(compute, comm, 1.0), comm)
    assert np.allclose(exposed_ms(compute, comm, 60.0), np.maximum(comm - compute, 0.0), atol=2.0)


def test_implied_comm_inverts_exposed():
    compute = np.array([10.0, 200.0, 50.0])
    comm = np.array([300.0, 40.0, 50.0])
    for g in (1.0, 1.7, 4.0):
        assert np.allclose(implied_comm_ms(exposed_ms(compute, comm, g), compute, g), comm)


def test_group_medians_one_value_per_sorted_key():
    (med,) = group_medians(np.array(["b", "a", "b", "a", "b"]), np.array([1.0, 10.0, 3.0, 20.0, 2.0]))
    assert med.tolist() == [15.0, 2.0]


def test_spearman_is_one_for_monotone_and_minus_one_for_reversed():
    x = np.array([1.0, 5.0, 2.0, 9.0])
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)


PLACEMENTS = ["1", "2", "4", "11", "22", "44", "14", "111", "222", "444", "1111", "2222", "1234", "4444"]


def synthetic_app(truth: AppFit, compute_ms=(100.0, 200.0, 400.0), floor_ms=2.0) -> App:
    """An App whose sync times follow `truth` exactly: the fit must give them back."""
    rows = []
    for p in PLACEMENTS:
        for bsz, c in zip((8, 16, 32), compute_ms, strict=True):
            rows.append(
                {"placement": p, "local_bsz": bsz, "step_time": (c + floor_ms) / 1e3, "sync_time": 0.0}
            )
    app = App("synthetic", rows, np.zeros(len(rows), dtype=int))  # every row in the fit half
    app.floor_ms = floor_ms
    app.sync_ms = truth.predict_ms(app)
    return app


def test_features_reproduce_the_closed_forms_for_every_model():
    app = synthetic_app(AppFit("nccl", 1.0, 0.0, np.array([0.0, 1.0, 1.0, 1.0, 1.0]), 0.0))
    nbytes, b_inter, a_inter, b_intra, a_intra = 2e8, 2.0, 30.0, 8.0, 5.0
    x = np.array([0.0, a_intra, a_inter, nbytes / 1e6 / b_intra, nbytes / 1e6 / b_inter])
    for model in ("hierarchical", "flat", "nccl"):
        assert np.allclose(
            app.features(model) @ x, app.comm_ms(model, nbytes, b_inter, a_inter, b_intra, a_intra)
        )


def test_nccl_model_makes_two_nodes_slower_than_three_at_large_gradients():
    app = synthetic_app(AppFit("nccl", 1.0, 0.0, np.array([0.0, 1.0, 1.0, 1.0, 1.0]), 0.0))
    comm = dict(zip(app.placement, app.comm_ms("nccl", 4e8, 1.0, 10.0, 8.0, 5.0), strict=False))
    assert comm["44"] > comm["444"]
    # One GPU per node: ring and tree move the gradient across each NIC the same once each way.
    assert comm["11"] == pytest.approx(comm["111"], rel=0.01)


def test_fit_recovers_the_parameters_that_generated_the_data(monkeypatch):
    # A coarse grid holding the true (g, h) keeps the test fast; the search itself is unchanged.
    monkeypatch.setattr(calibrate_pollux, "GAMMAS", np.array([1.0, 1.5, 2.0, 3.0]))
    monkeypatch.setattr(calibrate_pollux, "INTERFERENCES", np.array([0.0, 0.02, 0.04, 0.1]))
    truth = AppFit("nccl", 2.0, 0.04, np.array([5.0, 300.0, 2000.0, 20.0, 250.0]), 0.0)
    app = synthetic_app(truth)
    got = fit_app(app, "nccl")
    assert got.gamma == pytest.approx(truth.gamma)
    assert got.interference == pytest.approx(truth.interference)
    assert np.allclose(got.x, truth.x, rtol=1e-6, atol=1e-6)
    assert got.loss < 1e-12
