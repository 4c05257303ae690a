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


def alltoall_spanning_ms(n, off_peers, bytes, bw_GBps, latency_us):
    """All-to-all of `bytes` per rank over n ranks, for the member with `off_peers` of its n - 1
    peers outside its NVLink domain, sending their share (S/n each) through its NIC at B:
    (n-1)·a + off/n·S/B, in ms. One NIC per rank: NCCL does not aggregate NICs for all-to-all."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (n - 1) * np.asarray(latency_us) / 1e3 + _ms(np.multiply(np.divide(off_peers, n), bytes), bw_GBps)
    return _out(np.where(n > 1, t, 0.0))


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


def hierarchical_allgather_ms(
    n_intra, n_inter, bytes, intra_bw_GBps, intra_latency_us, inter_bw_GBps, inter_latency_us, rails=None
):
    """Allgather across NVLink domains, in ms: an allgather between the n_inter domains over `rails`
    parallel links per domain (each carrying S/rails of the result, NCCL's PXN and multi-NIC
    channels), then an allgather inside each domain (n_intra ranks). With
    `hierarchical_reducescatter_ms` it composes `hierarchical_allreduce_ms` exactly."""
    rails = n_intra if rails is None else rails
    per_rail = np.divide(bytes, np.maximum(rails, 1))
    inter = allgather_ms(n_inter, per_rail, inter_bw_GBps, inter_latency_us)
    intra = allgather_ms(n_intra, bytes, intra_bw_GBps, intra_latency_us)
    return _out(np.asarray(inter) + np.asarray(intra))


def hierarchical_reducescatter_ms(
    n_intra, n_inter, bytes, intra_bw_GBps, intra_latency_us, inter_bw_GBps, inter_latency_us, rails=None
):
    """Reduce-scatter across NVLink domains, in ms: inside each domain, then between the domains over
    `rails` parallel links (the mirror image of `hierarchical_allgather_ms`, the same time)."""
    return hierarchical_allgather_ms(
        n_intra, n_inter, bytes, intra_bw_GBps, intra_latency_us, inter_bw_GBps, inter_latency_us, rails
    )


# Collectives priced hierarchically when a group spans NVLink domains.
HIERARCHICAL_FORMS = {
    "allreduce": hierarchical_allreduce_ms,
    "allgather": hierarchical_allgather_ms,
    "reducescatter": hierarchical_reducescatter_ms,
}


def pipelined_ms(
    collective,
    n,
    n_intra,
    n_inter,
    bytes,
    intra_bw_GBps,
    intra_latency_us,
    inter_bw_GBps,
    inter_latency_us,
    rails,
):
    """NCCL's ring (allgather, reduce-scatter) or tree (allreduce) across NVLink domains, in ms: one
    channel per rail, NVLink and network hops pipelined, so the bandwidth is the lesser of the
    domain's NVLink and the rails' summed rate, B = min(B_intra, rails·B_inter). Allreduce:
    2(n-1)/n·S/B + 2·(ceil(log2 n_inter)·a_inter + (n_intra-1)·a_intra) (a tree's depth over the
    domains); allgather and reduce-scatter: (n-1)/n·S/B + (n-1)·a_inter."""
    n = np.asarray(n, dtype=float)
    bw = np.minimum(intra_bw_GBps, np.multiply(np.maximum(rails, 1), inter_bw_GBps))
    with np.errstate(divide="ignore", invalid="ignore"):
        if collective == "allreduce":
            depth = np.ceil(np.log2(np.maximum(n_inter, 1)))
            lat = 2 * (
                depth * np.asarray(inter_latency_us)
                + (np.asarray(n_intra) - 1) * np.asarray(intra_latency_us)
            )
            t = lat / 1e3 + 2 * (n - 1) / n * _ms(bytes, bw)
        else:
            t = (n - 1) * np.asarray(inter_latency_us) / 1e3 + (n - 1) / n * _ms(bytes, bw)
    return _out(np.where(n > 1, t, 0.0))


def spanning_ms(
    collective,
    n,
    n_intra,
    n_inter,
    bytes,
    intra_bw_GBps,
    intra_latency_us,
    inter_bw_GBps,
    inter_latency_us,
    rails,
):
    """An allreduce, allgather or reduce-scatter over n ranks spanning n_inter NVLink domains (the
    fullest holding n_intra, `rails` parallel NICs per domain), in ms: the faster of the
    hierarchical form and the pipelined one (`pipelined_ms`), as NCCL's tuner picks its algorithm
    by size: the hierarchical form's fewer network steps win for small messages over many nodes,
    the pipelined one's overlap of NVLink and network for large ones."""
    hier = HIERARCHICAL_FORMS[collective](
        n_intra, n_inter, bytes, intra_bw_GBps, intra_latency_us, inter_bw_GBps, inter_latency_us, rails
    )
    piped = pipelined_ms(
        collective,
        n,
        n_intra,
        n_inter,
        bytes,
        intra_bw_GBps,
        intra_latency_us,
        inter_bw_GBps,
        inter_latency_us,
        rails,
    )
    return _out(np.minimum(hier, piped))


FLAT_FORMS = {
    "allreduce": ring_allreduce_ms,
    "allgather": allgather_ms,
    "reducescatter": reducescatter_ms,
    "alltoall": alltoall_ms,
}


# NCCL's tuning model for collectives inside one NVLink domain: NCCL 2.30.7, src/graph/tuning.cc
# (github.com/NVIDIA/nccl at 5067397), `ncclTopoTuneModel` and its default tuner constants.
# NVLS (NVLink SHARP, the switch reduces and multicasts): latency hwLatencies[NVLINK][NVLS][SIMPLE]
# = 25 us, flat in the rank count (baseLatencies[NVLS] = 0, and NCCL sets rather than adds it);
# bandwidth bwIntra * nvlsEfficiency (Hopper 0.85, Blackwell 0.74), doubled for allreduce ("pipelines
# two operations") and times (ppn-1)/ppn for allgather and reduce-scatter, capped at the graph's
# bwInter (= bwIntra on one node). Tree allreduce: busBw * 0.92, bus-to-algorithm ratio 0.5, and
# 2(n-1) intra-node latency steps like the ring's.
NVLS_LATENCY_US = 25.0
NVLS_EFFICIENCY_HOPPER = 0.85
NVLS_EFFICIENCY_BLACKWELL = 0.74
TREE_BUS_FACTOR = 0.92


def nvls_ms(collective, n, bytes, bw_GBps, efficiency):
    """NVLS (NVLink SHARP) allreduce, allgather or reduce-scatter of `bytes` per rank over n ranks
    of one domain whose switches reduce at `efficiency` (NCCL's nvlsEfficiency; 0: no NVLS, inf
    time), in ms. Allreduce: 25 us + 2(n-1)/n·S/(B·min(1, 2e)); allgather and reduce-scatter:
    25 us + S/(B·min(1, e·(n-1)/n)) (NCCL prices them at bus bandwidth, with no ring ratio). The
    channel factor (nChannels-1)/nChannels (15/16 or more) is left out, so this is never slower
    than NCCL's own estimate."""
    n = np.asarray(n, dtype=float)
    eff = np.asarray(efficiency, dtype=float)
    part = (n - 1) / np.maximum(n, 1.0)
    if collective == "allreduce":
        t = NVLS_LATENCY_US / 1e3 + 2 * part * _ms(bytes, np.multiply(bw_GBps, np.minimum(1.0, 2 * eff)))
    else:
        t = NVLS_LATENCY_US / 1e3 + _ms(bytes, np.multiply(bw_GBps, np.minimum(1.0, eff * part)))
    return _out(np.where(n > 1, np.where(eff > 0, t, np.inf), 0.0))


def tree_allreduce_ms(n, bytes, bw_GBps, latency_us):
    """NCCL's tree allreduce inside one domain (a chain there), in ms: 2(n-1)·a + S/(0.5·0.92·B).
    Its latency steps are the ring's and its rate under half, so the ring never loses to it inside a
    domain (NCCL's tuner agrees); kept so that `domain_ms` is the best of what NCCL runs."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = 2 * (n - 1) * np.asarray(latency_us) / 1e3 + _ms(
            bytes, np.multiply(bw_GBps, 0.5 * TREE_BUS_FACTOR)
        )
    return _out(np.where(n > 1, t, 0.0))


def domain_ms(collective, n, bytes, bw_GBps, latency_us, nvls=0.0):
    """A collective of n ranks inside one NVLink domain, in ms, as NCCL runs it: the best of the
    ring (`FLAT_FORMS`), the tree (allreduce) and, where the domain's switches support NVLS
    (`nvls` > 0: their efficiency), NVLS (allreduce, allgather, reduce-scatter). All-to-all is
    the flat form alone. Monotone: slower with latency, faster with bandwidth and efficiency.
    The tree is not computed: inside a domain it has the ring's 2(n-1) latency steps and moves
    S/(0.46 B) against the ring's 2(n-1)/n S/B < 2 S/B, so it is never the best
    (`tree_allreduce_ms`; the formulas' tests check it)."""
    t = FLAT_FORMS[collective](n, bytes, bw_GBps, latency_us)
    if collective in NVLS_COLLECTIVES and np.any(np.asarray(nvls) > 0):
        t = np.minimum(t, nvls_ms(collective, n, bytes, bw_GBps, nvls))
    return _out(t)


NVLS_COLLECTIVES = ("allreduce", "allgather", "reducescatter")


def step_ms(compute_ms: float, overlap: float, comm_ms: float) -> float:
    """Step time in ms: compute_ms + (1 - overlap) * comm_ms."""
    return compute_ms + (1.0 - overlap) * comm_ms


def pipeline_compute_ms(job) -> float:
    """Compute part of a step, in ms: `compute_ms`, plus the 1F1B pipeline bubble when the job
    declares `step.microbatches` m and has pp > 1 stages: compute_ms * (m + pp - 1) / m, so the
    bubble is (pp - 1) / (m + pp - 1) of it."""
    m = job.microbatches
    if not m or job.pp < 2:
        return job.compute_ms
    return job.compute_ms * (m + job.pp - 1) / m


def _one_f_one_b(job, entry) -> bool:
    return bool(job.microbatches) and job.pp > 1 and entry.group == "pp" and entry.collective == "p2p"


def entry_exposed_ms(job, entry, t: float) -> float:
    """The part of comm entry `entry`'s time `t` (ms, count included) that the step waits for:
    t * (1 - its overlap). Under 1F1B (`step.microbatches` m, pp > 1) a pipeline p2p send overlaps
    the next microbatch's compute (compute_ms / m) except on the critical path of the fill and the
    drain, 2(pp - 1) sends: with h = t / count per send, h * min(count, 2(pp-1)) +
    max(0, h - compute_ms/m) * max(0, count - 2(pp-1)), times (1 - overlap)."""
    hidden = job.entry_overlap(entry)
    if not _one_f_one_b(job, entry) or not 0 < t < math.inf:
        return (1.0 - hidden) * t
    per_send = t / entry.count
    critical = 2 * (job.pp - 1)
    exposed = per_send * min(entry.count, critical)
    if entry.count > critical:
        exposed += max(0.0, per_send - job.compute_ms / job.microbatches) * (entry.count - critical)
    return (1.0 - hidden) * exposed


def most_hidden_share(job, entry) -> float:
    """The largest share of `entry`'s time that compute can hide (`entry_exposed_ms` over t at
    its least): its overlap, and under 1F1B every send but the 2(pp - 1) on the critical path."""
    hidden = job.entry_overlap(entry)
    if not _one_f_one_b(job, entry):
        return hidden
    return 1.0 - (1.0 - hidden) * min(entry.count, 2 * (job.pp - 1)) / entry.count


def exposed_ms(job, entry_ms) -> float:
    """Communication left exposed per step, in ms: each comm entry's exposed part
    (`entry_exposed_ms`: its time times 1 - its overlap, pipeline sends under 1F1B), summed;
    step time = `pipeline_compute_ms` + exposed."""
    return float(sum(entry_exposed_ms(job, e, t) for e, t in zip(job.comm, entry_ms, strict=True)))


def mfu(flops_per_step: float | None, step_time_ms: float, peak_tflops_total: float) -> float | None:
    """Model FLOPs utilisation: flops_per_step / (step_s * sum of the GPUs' peak TFLOPS * 1e12).

    None without flops_per_step or with a zero step; 0.0 for an infinitely long step."""
    if flops_per_step is None or step_time_ms <= 0 or peak_tflops_total <= 0:
        return None
    if math.isinf(step_time_ms):
        return 0.0
    return flops_per_step / (step_time_ms / 1e3 * peak_tflops_total * 1e12)
