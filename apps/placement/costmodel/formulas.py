"""Closed forms of the collectives, step time and MFU.

Units: times in milliseconds, payloads in bytes, bandwidth in GB/s (1 GB = 1e9 bytes), latency in
microseconds. Each form accepts scalars (and returns a float) or numpy arrays (and returns an array).
"""

from __future__ import annotations

import math

import numpy as np


def _ms(nbytes, bw_GBps):
    # bytes / (GB/s * 1e9) seconds, times 1e3 for milliseconds; zero bandwidth is infinitely slow.
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.divide(nbytes, np.multiply(bw_GBps, 1e6))
    return np.where(np.asarray(nbytes) == 0, 0.0, t)


def _out(x):
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


def ring_allreduce_ms(n, bytes, bw_GBps, latency_us):
    """Ring allreduce of `bytes` per rank over n ranks: 2(n-1)·a + 2(n-1)/n·S/B, in ms."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = 2 * (n - 1) * np.asarray(latency_us) / 1e3 + 2 * (n - 1) / n * _ms(bytes, bw_GBps)
    return _out(np.where(n > 1, t, 0.0))


def allgather_ms(n, bytes, bw_GBps, latency_us):
    """Ring allgather producing `bytes` per rank over n ranks: (n-1)·a + (n-1)/n·S/B, in ms."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (n - 1) * np.asarray(latency_us) / 1e3 + (n - 1) / n * _ms(bytes, bw_GBps)
    return _out(np.where(n > 1, t, 0.0))


def reducescatter_ms(n, bytes, bw_GBps, latency_us):
    """Ring reduce-scatter of `bytes` per rank over n ranks: (n-1)·a + (n-1)/n·S/B, in ms."""
    return allgather_ms(n, bytes, bw_GBps, latency_us)


def alltoall_ms(n, bytes, bw_GBps, latency_us):
    """All-to-all of `bytes` per rank over n ranks: (n-1)·a + (n-1)/n·S/B, in ms.

    Across nodes B is one NIC's rate (each rank's share leaves through its own NIC)."""
    return allgather_ms(n, bytes, bw_GBps, latency_us)


def p2p_ms(bytes, bw_GBps, latency_us):
    """One point-to-point send of `bytes`: a + S/B, in ms."""
    return _out(np.asarray(latency_us) / 1e3 + _ms(bytes, bw_GBps))


def volume_ms(bytes, bw_GBps):
    """`bytes` moved over a `bw_GBps` bottleneck with no algorithm factor: S/B, in ms."""
    return _out(_ms(bytes, bw_GBps))


def hierarchical_allreduce_ms(
    n_intra, n_inter, bytes, intra_bw_GBps, intra_latency_us, inter_bw_GBps, inter_latency_us, rails=None
):
    """Allreduce across NVLink domains, in ms: reduce-scatter inside each domain (n_intra ranks),
    ring allreduce across the n_inter domains over `rails` parallel links per domain, each carrying
    S/rails (default rails = n_intra: one rail per local rank), then allgather inside each domain."""
    rails = n_intra if rails is None else rails
    per_rail = np.divide(bytes, np.maximum(rails, 1))
    scatter = reducescatter_ms(n_intra, bytes, intra_bw_GBps, intra_latency_us)
    inter = ring_allreduce_ms(n_inter, per_rail, inter_bw_GBps, inter_latency_us)
    gather = allgather_ms(n_intra, bytes, intra_bw_GBps, intra_latency_us)
    return _out(np.asarray(scatter) + np.asarray(inter) + np.asarray(gather))


FLAT_FORMS = {
    "allreduce": ring_allreduce_ms,
    "allgather": allgather_ms,
    "reducescatter": reducescatter_ms,
    "alltoall": alltoall_ms,
}


def step_ms(compute_ms: float, overlap: float, comm_ms: float) -> float:
    """Step time in ms: compute_ms + (1 - overlap) * comm_ms."""
    return compute_ms + (1.0 - overlap) * comm_ms


def mfu(flops_per_step: float | None, step_time_ms: float, peak_tflops_total: float) -> float | None:
    """Model FLOPs utilisation: flops_per_step / (step_s * sum of the GPUs' peak TFLOPS * 1e12).

    None without flops_per_step or with a zero step; 0.0 for an infinitely long step."""
    if flops_per_step is None or step_time_ms <= 0 or peak_tflops_total <= 0:
        return None
    if math.isinf(step_time_ms):
        return 0.0
    return flops_per_step / (step_time_ms / 1e3 * peak_tflops_total * 1e12)
