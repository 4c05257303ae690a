"""Placement solvers: one signature, `place(topology, free, link_load, job) -> Placement | NoFit`.

Policies: `topo` (ours: smallest fitting domain, nested group mapping, swap refinement), and the
baselines `naive` (the seed's free-GPU-first), `first_fit` (lowest GPU ids), `tree_best_fit`
(Slurm topology/tree) and `random` (seeded). Every placement holds exactly `job.gpus` distinct free
GPUs; `Placement.gids[r]` is rank r's GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..costmodel import Prediction, evaluate, pipeline_compute_ms
from ..costmodel.speed import allowed, at_rate, reference
from ..jobs import POLICY_NAMES, JobSpec
from ..topology import Topology
from . import first_fit, naive, seeded_random, topo, tree_best_fit
from .base import NoFit, Placement, check_free, check_link_load

# The same names a job spec may ask for (jobs.POLICY_NAMES): "topo", "naive", "first_fit",
# "tree_best_fit", "random".
POLICIES = POLICY_NAMES

_CHOOSERS = {
    "naive": naive.choose,
    "first_fit": first_fit.choose,
    "tree_best_fit": tree_best_fit.choose,
    "random": seeded_random.choose,
}


def place(
    topology: Topology,
    free,
    link_load: Mapping[str, float] | None,
    job: JobSpec,
    policy: str = "topo",
    seed: int = 0,
) -> Placement | NoFit:
    """Place `job` on the `free` GPUs (bool array over gids) by `policy`, priced with `link_load`
    (leaf name -> other jobs' rates, GB/s, on its uplinks). `seed` drives `random` (and, since
    topo weighs every baseline's placement, topo's random candidate). NoFit says what is missing,
    also when the only placement has no finite predicted time (GPUs that cannot reach each other)."""
    if policy not in POLICIES:
        raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
    mask = check_free(topology, free)
    load = check_link_load(link_load)
    try:
        reference(topology, job)
    except ValueError as exc:
        # A stored job naming a model its cluster no longer has.
        return NoFit(str(exc))
    ok = allowed(topology, job)
    if ok is not None:
        mask = mask & ok
        n_free = int(np.count_nonzero(mask))
        if n_free < job.gpus:
            return NoFit(f"needs {job.gpus} GPUs of {', '.join(job.gpu_models)}, {n_free} free")
    if policy == "topo":
        return _finite(_by_generation(topology, mask, load, job, seed))
    chosen = _CHOOSERS[policy](topology, mask, load, job, seed)
    if isinstance(chosen, NoFit):
        return chosen
    return _finite(Placement(policy, chosen, evaluate(topology, job, chosen, load)))


def _by_generation(topology: Topology, mask: np.ndarray, load, job: JobSpec, seed: int) -> Placement | NoFit:
    """topo on a fleet of several GPU models: a step runs at its slowest GPU, so topo is run on the
    free GPUs of each model alone and on those of each model or faster, fastest model first; the
    cheapest step wins, ties to the earlier (faster, then unmixed) set. A set whose compute alone,
    at its slowest model, is no cheaper than the best step so far is not tried."""
    if len(topology.model_rates) == 1:
        return topo.solve(topology, mask, load, job, seed)
    rates = topology.node_rate[topology.gpu_node]
    levels = np.unique(rates[mask])[::-1]
    if levels.size <= 1:
        return topo.solve(topology, mask, load, job, seed)
    best: Placement | NoFit | None = None
    tried: set[bytes] = set()
    for rate in levels:
        if isinstance(best, Placement):
            floor = pipeline_compute_ms(at_rate(topology, job, float(rate)))
            if floor >= best.prediction.step_ms:
                break
        for sub in (mask & (rates == rate), mask & (rates >= rate)):
            key = np.packbits(sub).tobytes()
            if key in tried or int(np.count_nonzero(sub)) < job.gpus:
                continue
            tried.add(key)
            got = _finite(topo.solve(topology, sub, load, job, seed))
            if isinstance(got, NoFit):
                best = best or got
            elif not isinstance(best, Placement) or got.prediction.step_ms < best.prediction.step_ms * (
                1 - 1e-9
            ):
                best = got
    return best if best is not None else topo.solve(topology, mask, load, job, seed)


def _finite(result: Placement | NoFit) -> Placement | NoFit:
    """A placement whose predicted times are not finite numbers is no placement: its GPUs cannot
    reach each other (standalone nodes), and an infinite time must never be stored or compared."""
    if isinstance(result, NoFit):
        return result
    p = result.prediction
    if all(math.isfinite(x) for x in (p.comm_ms, p.step_ms, 1.0 if p.mfu is None else p.mfu)):
        return result
    return NoFit(
        f"the {result.policy} placement's predicted step time is {p.step_ms} ms: its GPUs cannot all reach"
        " each other (standalone nodes)"
    )


def _number(x: float | None):
    # JSON has no infinity: an unreachable pair (standalone nodes) is reported as null.
    if x is None or not np.isfinite(x):
        return None
    return float(x)


def prediction_output(prediction: Prediction) -> dict:
    """A Prediction as the `predicted` object of the placement output (times in ms, GB/s)."""
    return {
        "comm_ms": _number(prediction.comm_ms),
        "step_ms": _number(prediction.step_ms),
        "mfu": _number(prediction.mfu),
        "groups": [
            {
                "group": gc.group,
                "ranks": list(gc.ranks),
                "level": gc.level,
                "bottleneck_GBps": _number(gc.bottleneck_GBps),
                "time_ms": _number(gc.time_ms),
            }
            for gc in prediction.groups
        ],
    }


def placement_output(topology: Topology, job: JobSpec, placement: Placement) -> dict:
    """The placement output of job spec v1: job, policy, one {rank, node, gpu} per rank, predicted."""
    ranks = []
    for rank, gid in enumerate(placement.gids):
        node, index = topology.gpu_key(gid)
        ranks.append({"rank": rank, "node": node, "gpu": index})
    return {
        "job": job.name,
        "policy": placement.policy,
        "ranks": ranks,
        "predicted": prediction_output(placement.prediction),
    }


__all__ = ["POLICIES", "NoFit", "Placement", "place", "placement_output", "prediction_output"]
