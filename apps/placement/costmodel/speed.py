"""Compute time by GPU model: a job's `compute_ms` is for its reference GPU, a step runs at its
slowest placed GPU.

The reference is the model the job names (`step.gpu_model`), else the fastest model it may run on
that the cluster has (the cluster's fastest when the job names no `gpu_models`). On GPUs of rate r
(`GpuModel.rate`: the operator's measured `speed`, else the peak) the compute part of a step takes
compute_ms * r_ref / r_slowest: a synchronous step waits for its slowest rank.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..jobs import JobSpec, check_gpu_models, check_peak
from ..topology import Topology


def reference(topology: Topology, job: JobSpec) -> str:
    """The GPU model `job.compute_ms` is for. ValueError naming the field for a model the cluster
    does not have (`jobs.check_gpu_models` refuses such a job at submission)."""
    rates = topology.model_rates
    if job.reference_model is not None:
        if job.reference_model not in rates:
            raise ValueError(f"step.gpu_model: cluster {topology.name!r} has no {job.reference_model!r} GPUs")
        return job.reference_model
    # model_rates is fastest first.
    for m in rates:
        if not job.gpu_models or m in job.gpu_models:
            return m
    raise ValueError(f"gpu_models: cluster {topology.name!r} has none of {', '.join(job.gpu_models)}")


def reference_rate(topology: Topology, job: JobSpec) -> float:
    """The rate (`GpuModel.rate`) of the GPU `job.compute_ms` is for."""
    return topology.model_rates[reference(topology, job)]


def check_job_models(topology: Topology, job: JobSpec) -> None:
    """SpecError for models the cluster lacks (`jobs.check_gpu_models`) and for compute beyond the
    reference GPU's peak (`jobs.check_peak`)."""
    check_gpu_models(job, topology.model_rates)
    check_peak(job, topology.gpu_models[reference(topology, job)].peak_tflops)


def allowed(topology: Topology, job: JobSpec) -> np.ndarray | None:
    """Bool per gid, True on a GPU of a model the job may run on; None when it may run on any."""
    if not job.gpu_models:
        return None
    ok = np.array([m in job.gpu_models for m in topology.model_rates])
    return ok[topology.node_model][topology.gpu_node]


def at_rate(topology: Topology, job: JobSpec, rate: float) -> JobSpec:
    """`job` with its compute time on GPUs of `rate` (the same job on the reference's rate)."""
    ref = reference_rate(topology, job)
    if rate == ref:
        return job
    return replace(job, compute_ms=job.compute_ms * ref / rate)


def placed(topology: Topology, job: JobSpec, gids: np.ndarray) -> JobSpec:
    """`job` with its compute time on its slowest GPU among `gids`."""
    if len(topology.model_rates) == 1 and job.reference_model is None:
        return job
    return at_rate(topology, job, float(topology.node_rate[topology.gpu_node[gids]].min()))
