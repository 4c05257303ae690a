"""Workload profiles: a trace gives GPU counts and durations, not parallelism; this assigns one.

The mix, drawn per job from one seeded generator (same seed, same specs):
- 1 GPU: compute only, no communication.
- 2 to 8 GPUs, and larger counts that are not a multiple of 8: data parallel, a CNN (ResNet-50,
  102 MB of fp32 gradients) or BERT-Large (1.34 GB), even odds; ring allreduce of the gradients.
- 8 GPUs or more in multiples of 8: MoE with probability `moe_share` (ep8, every rank data
  parallel, all-to-all of the routed tokens 64 times per step plus an allreduce of the dense
  gradients); else, from 16 GPUs, a dense LLM with tp8 and the rest split between pp (4, 2 or 1,
  drawn among those that divide it) and dp. The model grows with the job: 7B up to 32 GPUs, 13B
  up to 64, 70B above. Per-rank bytes come from the model: TP allreduce of one micro-batch's
  activations (seq 4096 x hidden x 2 bytes) 4 times per layer and micro-batch, PP p2p of the same
  activations twice per micro-batch (8 micro-batches), DP allreduce of the bf16 gradients of the
  rank's shard (params / (tp x pp) x 2 bytes).
Compute time is `flops_per_step / (gpus x peak x 0.5)`, peak the topology's mean per-GPU TFLOPS:
jobs are sized so that the ideal placement spends a realistic share of the step communicating.
A trace job's GPU models (Alibaba's `gpu_spec`) become its spec's `gpu_models`, those the topology
has: a job naming only models the cluster lacks runs unconstrained (`unknown_models` counts them),
so a trace of one fleet's types replays on another cluster as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..jobs import JobSpec, load_job
from ..topology import Topology
from .traces import TraceJob

COMPUTE_EFFICIENCY = 0.5
SEQ = 4096
MICRO_BATCHES = 8
# name: (parameters, hidden size, layers)
LLMS = {"llm-7b": (6.7e9, 4096, 32), "llm-13b": (13e9, 5120, 40), "llm-70b": (70e9, 8192, 80)}
# name: (gradient bytes per rank, FLOPs per GPU per step)
DP_MODELS = {"resnet50": (1.02e8, 3.1e12), "bert-large": (1.34e9, 3.3e13)}
MOE_HIDDEN, MOE_LAYERS, MOE_TOPK, MOE_ACTIVE_PARAMS = 4096, 32, 2, 3e9


@dataclass(frozen=True, slots=True)
class Profile:
    """A job's assigned workload: profile name, shape key (jobs with equal keys differ only in
    name and runtime) and job spec (estimated runtime = the trace's duration)."""

    profile: str
    key: tuple
    spec: JobSpec


def assign_profiles(
    jobs: list[TraceJob], topology: Topology, *, seed: int = 0, moe_share: float = 0.2
) -> list[Profile]:
    """One profile per trace job, in order, drawn from a generator seeded with `seed`."""
    if not 0.0 <= moe_share <= 1.0:
        raise ValueError(f"moe_share: must be between 0 and 1, got {moe_share!r}")
    rng = np.random.default_rng(seed)
    peak_flops = float(np.mean(topology.node_peak_tflops)) * 1e12 if topology.nodes else 1e15
    cache: dict[tuple, JobSpec] = {}
    out = []
    for job in jobs:
        kind, shape = _draw(job.gpus, rng, moe_share)
        models = cluster_models(job, topology)
        key = (kind, job.gpus, shape, models)
        base = cache.get(key)
        if base is None:
            base = cache[key] = replace(_spec(job.gpus, kind, shape, peak_flops), gpu_models=models)
        out.append(Profile(kind, key, replace(base, name=job.name, estimated_runtime_s=job.duration_s)))
    return out


def cluster_models(job: TraceJob, topology: Topology) -> tuple[str, ...]:
    """The trace job's GPU models the topology has, in the trace's order; () for any model
    (none named, or none of them in the cluster)."""
    return tuple(m for m in job.gpu_models if m in topology.gpu_models)


def unknown_models(jobs: list[TraceJob], topology: Topology) -> int:
    """Trace jobs that name GPU models of which the topology has none (they run unconstrained)."""
    return sum(1 for j in jobs if j.gpu_models and not cluster_models(j, topology))


def _draw(gpus: int, rng: np.random.Generator, moe_share: float) -> tuple[str, tuple]:
    """(profile name, parallelism shape) for a job of `gpus` GPUs."""
    if gpus == 1:
        return "single", (1,)
    if gpus % 8 == 0 and rng.random() < moe_share:
        return "moe", (gpus,)
    if gpus >= 16 and gpus % 8 == 0:
        stages = gpus // 8
        pp = int(rng.choice([p for p in (4, 2, 1) if stages % p == 0]))
        size = "llm-7b" if gpus <= 32 else "llm-13b" if gpus <= 64 else "llm-70b"
        return size, (8, pp, stages // pp)
    return str(rng.choice(list(DP_MODELS))), (gpus,)


def _spec(gpus: int, kind: str, shape: tuple, peak_flops: float) -> JobSpec:
    tp, pp, dp, ep = 1, 1, gpus, 1
    if kind == "single":
        flops, comm = DP_MODELS["resnet50"][1], []
    elif kind in DP_MODELS:
        grad_bytes, flops_per_gpu = DP_MODELS[kind]
        flops = flops_per_gpu * gpus
        comm = [{"group": "dp", "collective": "allreduce", "bytes": grad_bytes}]
    elif kind == "moe":
        ep = 8
        tokens = SEQ * MICRO_BATCHES
        flops = 6 * MOE_ACTIVE_PARAMS * tokens * gpus
        comm = [
            {
                "group": "ep",
                "collective": "alltoall",
                "bytes": SEQ * MOE_HIDDEN * 2 * MOE_TOPK,
                "count": 2 * MOE_LAYERS,
            },
            {"group": "dp", "collective": "allreduce", "bytes": 5e8},
        ]
    else:
        params, hidden, layers = LLMS[kind]
        tp, pp, dp = shape
        activation = SEQ * hidden * 2
        flops = 6 * params * SEQ * MICRO_BATCHES * dp
        comm = [
            {
                "group": "tp",
                "collective": "allreduce",
                "bytes": activation,
                "count": 4 * (layers // pp) * MICRO_BATCHES,
            },
            {"group": "dp", "collective": "allreduce", "bytes": params / (tp * pp) * 2},
        ]
        if pp > 1:
            comm.append({"group": "pp", "collective": "p2p", "bytes": activation, "count": 2 * MICRO_BATCHES})
    compute_ms = flops / (gpus * peak_flops * COMPUTE_EFFICIENCY) * 1e3
    return load_job(
        {
            "version": 1,
            "name": f"{kind}-{gpus}",
            "gpus": gpus,
            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "ep": ep},
            "model": {"flops_per_step": flops},
            "step": {"compute_ms": compute_ms, "overlap": 0.0},
            "comm": comm,
        }
    )
