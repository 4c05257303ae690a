"""Lower bound on a job's step time: every group priced alone in the smallest domain that could hold it.

For a group of n ranks the smallest domain is an NVLink domain if some domain of the cluster has
>= n GPUs, else one leaf if some leaf has enough GPUs, else one spine pod, else the core. The group
is priced there with the best bandwidth and latency the cluster offers at that level and no
congestion; where the group must span NVLink domains, its hierarchical allreduce is priced at the
most favourable split (any number of domains m, members ceil(n/m) per domain, the most rails).
Every term is one that `costmodel.evaluate` can only match or exceed, so no placement beats the bound.
`gap = evaluate(...).step_ms / lower_bound(...).step_ms`.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from .costmodel import (
    FLAT_FORMS,
    GroupCost,
    Prediction,
    hierarchical_allreduce_ms,
    mfu,
    p2p_ms,
    step_ms,
    volume_ms,
)
from .costmodel.paths import nic_ids
from .groups import group_arrays
from .jobs import JobSpec
from .topology import Topology


@dataclass(frozen=True)
class _Capacity:
    """What the cluster offers at each level: sizes (GPUs) and best bandwidth (GB/s) / latency (us)."""

    domain_gpus: np.ndarray  # GPUs per NVLink domain
    max_leaf_gpus: int
    max_pod_gpus: int
    max_domain_rails: int  # most distinct NICs in one domain
    rail_capable: bool  # some domain reaches more than one leaf
    nic_bw: float
    nic_lat: float
    uplink_bw: float
    uplink_lat: float
    core_bw: float
    core_lat: float
    min_peak_tflops: float


_CAPACITY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _capacity(topo: Topology) -> _Capacity:
    cap = _CAPACITY.get(topo)
    if cap is not None:
        return cap
    dom_gpus = np.bincount(topo.gpu_domain, minlength=len(topo.domain_names))
    net = topo.gpu_leaf >= 0
    leaf_gpus = np.bincount(topo.gpu_leaf[net], minlength=len(topo.leaf_names))
    pod_gpus = np.bincount(topo.gpu_pod[net]) if net.any() else np.zeros(1, dtype=np.int64)
    ids, _ = nic_ids(topo)
    dom_nic = np.unique(np.stack([topo.gpu_domain[net].astype(np.int64), ids[net]]), axis=1)
    dom_leaf = np.unique(np.stack([topo.gpu_domain[net].astype(np.int64), topo.gpu_leaf[net]]), axis=1)
    finite_up = topo.leaf_spine_bw[np.isfinite(topo.leaf_spine_bw)]
    finite_core = topo.pod_core_bw[np.isfinite(topo.pod_core_bw)]
    cap = _Capacity(
        domain_gpus=dom_gpus,
        max_leaf_gpus=int(leaf_gpus.max(initial=0)),
        max_pod_gpus=int(pod_gpus.max(initial=0)),
        max_domain_rails=int(np.bincount(dom_nic[0]).max(initial=1)) if dom_nic.size else 1,
        rail_capable=bool(dom_leaf.size and np.bincount(dom_leaf[0]).max() > 1),
        nic_bw=float(topo.gpu_nic_bw[net].max(initial=0.0)),
        nic_lat=float(topo.gpu_nic_latency[net].min(initial=math.inf)),
        uplink_bw=float(finite_up.max()) if finite_up.size else math.inf,
        uplink_lat=float(topo.leaf_spine_latency.min()) if topo.leaf_spine_latency.size else 0.0,
        core_bw=float(finite_core.max()) if finite_core.size else math.inf,
        core_lat=float(topo.pod_core_latency.min()) if topo.pod_core_latency.size else 0.0,
        min_peak_tflops=float(topo.node_peak_tflops.min()),
    )
    _CAPACITY[topo] = cap
    return cap


def smallest_level(topo: Topology, n: int) -> str:
    """The lowest level whose largest domain has >= n GPUs: nvlink, leaf, spine or core."""
    cap = _capacity(topo)
    if int(cap.domain_gpus.max()) >= n:
        return "nvlink"
    if cap.max_leaf_gpus >= n:
        return "leaf"
    if cap.max_pod_gpus >= n:
        return "spine"
    return "core"


def _network(cap: _Capacity, level: str) -> tuple[float, float]:
    # Best bandwidth (GB/s) and latency (us) of a path that crosses `level` between two domains.
    bw, lat = cap.nic_bw, 2 * cap.nic_lat
    if level in ("spine", "core"):
        bw, lat = min(bw, cap.uplink_bw), lat + 2 * cap.uplink_lat
    if level == "core":
        bw, lat = min(bw, cap.core_bw), lat + 2 * cap.core_lat
    return bw, lat


def _in_domain(topo: Topology, cap: _Capacity, n: int, collective: str, nbytes: float) -> tuple[float, float]:
    # Alone in the best NVLink domain that holds n GPUs: (time ms, bandwidth GB/s).
    fits = cap.domain_gpus >= n
    bw = float(topo.domain_bw[fits].max())
    lat = float(topo.domain_latency[fits].min())
    if collective == "volume":
        return float(volume_ms(nbytes, bw)), bw
    if collective == "p2p":
        return float(p2p_ms(nbytes, bw, lat)), bw
    return float(FLAT_FORMS[collective](n, nbytes, bw, lat)), bw


def _spanning(topo: Topology, cap: _Capacity, n: int, level: str, collective: str, nbytes: float):
    # Spread over several NVLink domains at `level` or above, priced at its best: (time ms, GB/s).
    bw, lat = _network(cap, level)
    if collective == "volume":
        return float(volume_ms(nbytes, bw)), bw
    if collective == "p2p":
        return float(p2p_ms(nbytes, bw, lat)), bw
    if collective != "allreduce":
        return float(FLAT_FORMS[collective](n, nbytes, bw, lat)), bw
    big = cap.domain_gpus >= 2
    intra_bw = float(topo.domain_bw[big].max()) if big.any() else math.inf
    intra_lat = float(topo.domain_latency[big].min()) if big.any() else 0.0
    # A rail-aligned allreduce keeps its rings under one leaf: NIC-only paths between domains.
    inter_bw, inter_lat = _network(cap, "leaf") if cap.rail_capable else (bw, lat)
    d_max = int(cap.domain_gpus.max())
    m = np.arange(max(2, -(-n // d_max)), n + 1)
    k = -(-n // m)
    rails = np.clip(np.minimum(n // m, cap.max_domain_rails), 1, None)
    t = hierarchical_allreduce_ms(k, m, nbytes, intra_bw, intra_lat, inter_bw, inter_lat, rails=rails)
    i = int(np.argmin(t))
    return float(np.asarray(t)[i]), min(inter_bw, intra_bw if k[i] > 1 else math.inf)


def _group_bound(topo: Topology, n: int, collective: str, nbytes: float) -> tuple[str, float, float]:
    """(smallest level, bandwidth GB/s, time ms) of one group of n ranks alone in the cluster."""
    level = smallest_level(topo, n)
    if n < 2 or nbytes == 0:
        return level, float(topo.domain_bw.max()), 0.0
    cap = _capacity(topo)
    candidates = []
    if level == "nvlink":
        candidates.append(_in_domain(topo, cap, n, collective, nbytes))
    if cap.nic_bw > 0:
        candidates.append(_spanning(topo, cap, n, "leaf" if level == "nvlink" else level, collective, nbytes))
    if not candidates:
        # Standalone nodes only: a group larger than one domain cannot communicate at all.
        return level, 0.0, math.inf
    t, bw = min(candidates)
    return level, bw, t


def lower_bound(topology: Topology, job: JobSpec) -> Prediction:
    """A Prediction no placement of `job` on `topology` can beat: each group priced alone in the
    smallest domain that could hold it, no congestion. Times in ms; `groups` gives each group's
    level and bottleneck (GB/s); MFU uses the cluster's lowest peak, so it is an upper bound."""
    arrays = group_arrays(job)
    entry_ms: list[float] = []
    kind_time: dict[str, float] = {}
    kind_bw: dict[str, float] = {}
    kind_level: dict[str, str] = {}
    for entry in job.comm:
        n = arrays[entry.group].shape[1]
        level, bw, t = _group_bound(topology, n, entry.collective, entry.bytes)
        kind_level[entry.group] = level
        kind_time[entry.group] = kind_time.get(entry.group, 0.0) + t * entry.count
        kind_bw[entry.group] = min(kind_bw.get(entry.group, math.inf), bw)
        entry_ms.append(t * entry.count)
    comm = float(sum(entry_ms))
    step = step_ms(job.compute_ms, job.overlap, comm)
    groups = tuple(
        GroupCost(kind, tuple(r), kind_level[kind], kind_bw[kind], kind_time[kind])
        for kind in kind_time
        for r in arrays[kind].tolist()
    )
    return Prediction(
        comm_ms=comm,
        step_ms=step,
        mfu=mfu(job.flops_per_step, step, job.gpus * _capacity(topology).min_peak_tflops),
        groups=groups,
        flows={},
        entry_ms=tuple(entry_ms),
    )
