"""Compute by GPU model: a step runs at its slowest placed GPU, a job may constrain the models it
runs on, and topo takes no slower GPU (and mixes no generations) when that buys no faster step."""

from __future__ import annotations

import numpy as np
import pytest

from apps.placement.bounds import lower_bound
from apps.placement.costmodel import evaluate
from apps.placement.jobs import check_gpu_models, job_to_spec, load_job
from apps.placement.solvers import NoFit, place
from apps.placement.topology import SpecError, load_topology

from .specs import job as make_job

A100, H100 = "A100-SXM4-80GB", "H100-SXM5-80GB"


def node(name, model, leaf="leaf-1"):
    return {
        "name": name,
        "gpu_model": model,
        "gpus": 8,
        "nvlink": {"domain": name, "bw_GBps": 450, "latency_us": 2.0},
        "nics": [
            {"name": f"mlx5_{i}", "gpus": [i], "leaf": leaf, "bw_GBps": 25.0, "latency_us": 1.5}
            for i in range(8)
        ],
    }


def fleet(models, speeds=None, leaves=1):
    """Nodes n0, n1, ... of `models` in that order, spread evenly over `leaves` leaves and a spine."""
    per = -(-len(models) // leaves)
    gpu_models = {A100: {"peak_tflops": 312.0}, H100: {"peak_tflops": 989.0}}
    for m, s in (speeds or {}).items():
        gpu_models[m]["speed"] = s
    switches = [{"name": f"leaf-{i + 1}", "tier": "leaf"} for i in range(leaves)] + [
        {"name": "spine-1", "tier": "spine"}
    ]
    return load_topology(
        {
            "version": 1,
            "name": "gens",
            "gpu_models": gpu_models,
            "switches": switches,
            "links": [
                {"a": f"leaf-{i + 1}", "b": "spine-1", "bw_GBps": 400.0, "latency_us": 1.0}
                for i in range(leaves)
            ],
            "nodes": [node(f"n{i}", m, f"leaf-{i // per + 1}") for i, m in enumerate(models)],
        }
    )


def dp_job(gpus, compute_ms=100.0, nbytes=1e9, **extra):
    return make_job(gpus, comm=[("dp", "allreduce", nbytes)], compute_ms=compute_ms, **extra)


def models_of(topo, gids):
    return {topo.nodes[int(topo.gpu_node[g])].gpu_model for g in gids}


def test_a_step_runs_at_its_slowest_gpu_and_mfu_uses_each_gpus_peak():
    topo = fleet([A100, H100])
    job = dp_job(8, compute_ms=100.0)
    fast = evaluate(topo, job, list(range(8, 16)))
    mixed = evaluate(topo, job, [0, *range(8, 15)])
    slow = evaluate(topo, job, list(range(8)))
    # The reference is the cluster's fastest model: 100 ms on H100s, 100 * 989 / 312 on A100s.
    assert fast.step_ms - fast.comm_ms == pytest.approx(100.0)
    assert slow.step_ms - slow.comm_ms == pytest.approx(100.0 * 989 / 312)
    # One A100 among seven H100s: the whole step waits for it (comm apart, over its NIC).
    assert mixed.step_ms - mixed.comm_ms == pytest.approx(100.0 * 989 / 312)
    flops = {"model": {"flops_per_step": 8 * 312e12 * 0.1}}
    fj = load_job(job_to_spec(job) | flops)
    m = evaluate(topo, fj, [0, *range(8, 15)])
    assert m.mfu == pytest.approx(8 * 312e12 * 0.1 / (m.step_ms / 1e3 * (312 + 7 * 989) * 1e12))


def test_the_named_reference_and_the_operators_measured_speeds():
    topo = fleet([A100, H100])
    on_a100 = dp_job(8, compute_ms=300.0, nbytes=0, step={"compute_ms": 300.0, "gpu_model": A100})
    assert evaluate(topo, on_a100, list(range(8))).step_ms == pytest.approx(300.0)
    assert evaluate(topo, on_a100, list(range(8, 16))).step_ms == pytest.approx(300.0 * 312 / 989)
    measured = fleet([A100, H100], speeds={A100: 1.0, H100: 2.5})
    assert evaluate(measured, on_a100, list(range(8, 16))).step_ms == pytest.approx(300.0 / 2.5)
    # Speeds are compared with each other, never with a peak.
    with pytest.raises(SpecError) as err:
        fleet([A100, H100], speeds={H100: 2.5})
    assert f"gpu_models.{A100}.speed" in err.value.as_dict()
    with pytest.raises(SpecError) as err:
        fleet([A100, H100], speeds={A100: 0.0, H100: 1.0})
    assert f"gpu_models.{A100}.speed" in err.value.as_dict()


def test_the_bound_computes_on_the_fastest_gpu_the_job_may_get():
    topo = fleet([A100, H100])
    job = dp_job(8, nbytes=0)
    assert lower_bound(topo, job).step_ms == pytest.approx(100.0)
    free = np.zeros(topo.n_gpus, dtype=bool)
    free[:8] = True
    assert lower_bound(topo, job, free=free).step_ms == pytest.approx(100.0 * 989 / 312)
    only_a100 = dp_job(8, nbytes=0, gpu_models=[A100])
    assert lower_bound(topo, only_a100).step_ms == pytest.approx(100.0)
    assert evaluate(topo, only_a100, list(range(8))).step_ms == pytest.approx(100.0)


@pytest.mark.parametrize("compute_ms", [100.0, 0.0])
def test_an_empty_mixed_cluster_gives_the_faster_gpus(compute_ms):
    # A100 nodes come first: a tie on comm broken by node id would take them.
    topo = fleet([A100, A100, H100, H100])
    for gpus in (8, 16):
        job = make_job(
            gpus, tp=8, comm=[("tp", "allreduce", 1e8, 20), ("dp", "allreduce", 1e9)], compute_ms=compute_ms
        )
        got = place(topo, np.ones(topo.n_gpus, dtype=bool), {}, job)
        assert models_of(topo, got.gids) == {H100}, gpus


def test_the_constraint_holds_for_every_policy_and_a_short_fleet_is_no_fit():
    topo = fleet([H100, A100, A100, H100])
    job = dp_job(16, gpu_models=[A100])
    free = np.ones(topo.n_gpus, dtype=bool)
    for policy in ("topo", "naive", "first_fit", "tree_best_fit", "random"):
        got = place(topo, free, {}, job, policy=policy)
        assert models_of(topo, got.gids) == {A100}, policy
    free[8] = False
    got = place(topo, free, {}, job)
    assert isinstance(got, NoFit) and "16 GPUs of A100-SXM4-80GB, 15 free" in got.reason


def _unmixed_best(topo, free, job):
    """topo's step on the free GPUs of each model alone."""
    out = {}
    model = np.array([topo.nodes[int(n)].gpu_model for n in topo.gpu_node])
    for m in (H100, A100):
        got = place(topo, free & (model == m), {}, job)
        if not isinstance(got, NoFit):
            out[m] = got.prediction.step_ms
    return out


@pytest.mark.parametrize("seed", range(12))
def test_busy_mixed_clusters_take_no_slower_or_mixed_set_for_nothing(seed):
    rng = np.random.default_rng(9100 + seed)
    topo = fleet([A100, H100, A100, H100, A100, H100, A100, H100], leaves=2)
    free = rng.random(topo.n_gpus) > rng.uniform(0.2, 0.6)
    gpus = int(rng.choice([4, 8, 16]))
    tp = int(rng.choice([1, 2, 4]))
    compute = float(rng.choice([0.0, 10.0, 200.0]))
    job = make_job(
        gpus, tp=tp, comm=[("tp", "allreduce", 5e7, 8), ("dp", "allreduce", 2e9)], compute_ms=compute
    )
    got = place(topo, free, {}, job)
    if isinstance(got, NoFit):
        return
    step = got.prediction.step_ms
    unmixed = _unmixed_best(topo, free, job)
    # Never worse than a one-generation placement topo itself would make.
    assert all(step <= s * (1 + 1e-9) for s in unmixed.values())
    used = models_of(topo, got.gids)
    if len(used) > 1:
        # Mixed only when it is strictly faster than every one-generation set.
        assert all(step < s * (1 - 1e-9) for s in unmixed.values())
    if used == {A100} and H100 in unmixed:
        # Slower GPUs only when the faster ones give a strictly slower step.
        assert unmixed[H100] > step * (1 + 1e-9)


def test_job_spec_gpu_models_bounds():
    ok = dp_job(8, gpu_models=[H100, A100], step={"compute_ms": 10.0, "gpu_model": A100})
    assert ok.gpu_models == (H100, A100) and ok.reference_model == A100
    assert load_job(job_to_spec(ok)) == ok
    for bad, field in (
        ({"gpu_models": []}, "gpu_models"),
        ({"gpu_models": "H100"}, "gpu_models"),
        ({"gpu_models": [f"M{i}" for i in range(17)]}, "gpu_models"),
        ({"gpu_models": [H100, "bad/name"]}, "gpu_models[1]"),
        ({"gpu_models": [H100, H100]}, "gpu_models[1]"),
        ({"gpu_models": [H100], "step": {"compute_ms": 1.0, "gpu_model": A100}}, "step.gpu_model"),
        ({"step": {"compute_ms": 1.0, "gpu_model": 7}}, "step.gpu_model"),
    ):
        with pytest.raises(SpecError) as err:
            dp_job(8, **bad)
        assert field in err.value.as_dict(), bad
    topo = fleet([A100, H100])
    check_gpu_models(ok, topo.model_rates)
    with pytest.raises(SpecError) as err:
        check_gpu_models(dp_job(8, gpu_models=[H100, "B200"]), topo.model_rates)
    assert "unknown GPU model 'B200'" in err.value.as_dict()["gpu_models[1]"][0]
