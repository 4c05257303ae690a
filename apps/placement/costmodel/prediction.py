"""`evaluate`: price one placement of a job (step time, comm time, MFU, per-group costs, flows)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..groups import group_arrays
from ..jobs import JobSpec
from ..topology import LEVELS, Topology
from .formulas import (
    FLAT_FORMS,
    HIERARCHICAL_FORMS,
    NVLS_COLLECTIVES,
    alltoall_spanning_ms,
    domain_ms,
    exposed_ms,
    mfu,
    p2p_ms,
    pipeline_compute_ms,
    spanning_ms,
    volume_ms,
)
from .linkload import core_flow_names, fabric_links, load_array
from .paths import KindStats, kind_stats, nic_ids, nic_sharing, pair_paths, pod_core_total
from .speed import placed

RING_COLLECTIVES = ("allreduce", "allgather", "reducescatter")


@dataclass(frozen=True, slots=True)
class GroupCost:
    """One group's cost: its highest level, bottleneck bandwidth (GB/s) and time per step (ms)."""

    group: str
    ranks: tuple[int, ...]
    level: str
    bottleneck_GBps: float
    time_ms: float


@dataclass(frozen=True)
class Prediction:
    """A placement's cost per training step: comm and step time (ms), MFU (None without
    flops_per_step), every group of the kinds that communicate, this job's mean offered rate
    (GB/s) per leaf's uplinks and per core-linked spine (to add to `link_load` once placed) and
    each comm entry's time (ms, count included)."""

    comm_ms: float
    step_ms: float
    mfu: float | None
    groups: tuple[GroupCost, ...]
    flows: dict[str, float]
    entry_ms: tuple[float, ...] = field(default=())
    # Every group's time summed over the comm entries (count included), ms: an entry costs its
    # slowest group, so this is what moves one of several slow groups for the better.
    group_ms: float = 0.0


def check_gids(topo: Topology, job: JobSpec, gids) -> np.ndarray:
    """`gids` as an int64 array, checked: one GPU per rank, in range, none twice."""
    g = np.asarray(gids, dtype=np.int64)
    if g.shape != (job.gpus,):
        raise ValueError(f"gids: job {job.name!r} has {job.gpus} ranks, got {g.size} GPUs")
    if g.size and (g.min() < 0 or g.max() >= topo.n_gpus):
        raise ValueError(f"gids: GPU ids must lie in 0..{topo.n_gpus - 1}")
    if np.unique(g).size != g.size:
        raise ValueError("gids: a GPU is given to more than one rank")
    return g


def evaluate(
    topology: Topology,
    job: JobSpec,
    gids,
    link_load: Mapping[str, float] | np.ndarray | None = None,
    *,
    detail: bool = True,
) -> Prediction:
    """Predict one placement: `gids[r]` is rank r's GPU; `link_load` other jobs' mean rates
    (GB/s) on each leaf's uplinks (and pods' core links). Times in ms. `detail=False` leaves
    `groups` empty (faster, for solvers)."""
    g = check_gids(topology, job, gids)
    # The compute part runs at the slowest placed GPU.
    job = placed(topology, job, g)
    arrays = group_arrays(job)
    both = load_array(topology, link_load)
    load, core_load = both[: len(topology.leaf_names)], both[len(topology.leaf_names) :]
    stats: dict[str, KindStats] = {}
    kind_time: dict[str, np.ndarray] = {}
    kind_bw: dict[str, np.ndarray] = {}
    flows = np.zeros(load.size)
    core_flows = np.zeros(core_load.size)
    entry_ms: list[float] = []
    group_ms = 0.0
    for entry in job.comm:
        st = stats.get(entry.group)
        if st is None:
            st = stats[entry.group] = kind_stats(topology, g[arrays[entry.group]])
            kind_time[entry.group] = np.zeros(st.members.shape[0])
            kind_bw[entry.group] = np.full(st.members.shape[0], math.inf)
        if st.members.shape[1] < 2 or entry.bytes == 0:
            entry_ms.append(0.0)
            continue
        t, bw, own, own_core = _entry(
            topology, st, entry.collective, entry.bytes, load, core_load, entry.group
        )
        flows += own * entry.count
        core_flows += own_core * entry.count
        kind_time[entry.group] += t * entry.count
        kind_bw[entry.group] = np.minimum(kind_bw[entry.group], bw)
        entry_ms.append(float(t.max()) * entry.count)
        group_ms += float(t.sum()) * entry.count

    comm = float(sum(entry_ms))
    step = pipeline_compute_ms(job) + exposed_ms(job, entry_ms)
    # Offered rates: the bytes each link carries per step over the step (or over the comm time
    # when overlap hides more than the step lasts: a link is never busier than while in use).
    period = max(step, comm)
    if 0 < period < math.inf:
        flows /= period
        core_flows /= period
    else:
        flows[:], core_flows[:] = 0.0, 0.0
    peak = float(topology.node_peak_tflops[topology.gpu_node[g]].sum())
    groups = _group_costs(arrays, stats, kind_time, kind_bw) if detail else ()
    return Prediction(
        comm_ms=comm,
        step_ms=step,
        mfu=mfu(job.flops_per_step, step, peak),
        groups=groups,
        flows={topology.leaf_names[i]: float(flows[i]) for i in np.flatnonzero(flows)}
        | core_flow_names(topology, core_flows),
        entry_ms=tuple(entry_ms),
        group_ms=group_ms,
    )


def _factor(total: np.ndarray, other: np.ndarray, offered: np.ndarray) -> np.ndarray:
    """Per link: the share of its offered rate each flow gets, proportional sharing of its capacity
    `total` among the rates on it (`other`, other jobs', plus `offered`, this entry's), GB/s; 1 where
    the link holds them all or has no capacity given."""
    demand = other + offered
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((offered > 0) & (total > 0) & (demand > total), total / demand, 1.0)


def spine_pods(topo: Topology) -> Mapping[str, int]:
    """Each spine with links to core switches -> its pod (the key of its core links' load)."""
    return fabric_links(topo).spine_pod


def _spread(links: np.ndarray, rings: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flows of the rows of `links` (each member's leaf or pod) as (row, link, flows) triplets:
    `rings[row]` on each distinct link a ring row spans, or one per member (rings None)."""
    rows = np.broadcast_to(np.arange(links.shape[0])[:, None], links.shape)
    if rings is None:
        return rows.ravel(), links.ravel(), np.ones(links.size)
    srt = np.sort(links, axis=1)
    first = np.ones(srt.shape, dtype=bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    weight = np.broadcast_to(np.asarray(rings, dtype=float)[:, None], srt.shape)
    return rows[first], srt[first], weight[first]


def _shared(
    links: np.ndarray, rings: np.ndarray | None, demand: np.ndarray, total: np.ndarray, other: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per row of `links` (each member's leaf or pod, rows that cross them): the least `_factor` of
    the links it spans, every flow of every row offering its row's `demand` (GB/s), with `other`
    (other jobs' rates per link); and the rows' flows as `_spread` triplets."""
    rows, where, flows = _spread(links, rings)
    offered = np.bincount(where, weights=flows * demand[rows], minlength=total.size)
    return _factor(total, other, offered)[links].min(axis=1), (rows, where, flows)


def _carried(n_links: int, spread, rate: np.ndarray, time_ms: np.ndarray) -> np.ndarray:
    """Per link: what the rows' flows carry through it, rate (GB/s) times time (ms)."""
    rows, where, flows = spread
    with np.errstate(invalid="ignore"):
        carried = np.where(rate > 0, rate * time_ms, 0.0)
    return np.bincount(where, weights=flows * carried[rows], minlength=n_links)


def _entry(
    topo: Topology,
    st: KindStats,
    collective: str,
    nbytes: float,
    load: np.ndarray,
    core_load: np.ndarray,
    kind: str = "",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One comm entry of group `kind`: per-group time (ms), the bandwidth that set it (GB/s), and
    what its flows carry through each leaf's uplinks and each pod's core links (GB/s x ms)."""
    n = st.members.shape[1]
    if collective == "p2p":
        return _p2p(topo, st, nbytes, load, core_load, ring=kind == "cp")
    crossing = st.multi_leaf.copy()
    hier = st.spans if collective in HIERARCHICAL_FORMS else np.zeros_like(st.spans)
    if collective in HIERARCHICAL_FORMS:
        crossing &= ~st.rail_aligned
    share = np.full(st.members.shape[0], math.inf)
    up = core = None
    if crossing.any():
        # Ring collectives run leaf by leaf: each parallel ring leaves every leaf (and pod) it
        # spans once. alltoall and volume: every member sends across, one flow per member GPU.
        # Each flow offers the rate its path allows unshared (volume: its bottleneck; others: the
        # slower of the network path and its NIC's share among this kind's groups).
        rings = st.rails_min[crossing] if collective in RING_COLLECTIVES else None
        cap = st.path_bw if collective == "volume" else np.minimum(st.inter_bw, st.nic_share)
        demand = cap[crossing]
        factor, up = _shared(st.leaves[crossing], rings, demand, topo.leaf_uplink_total_bw, load)
        # Groups crossing pods also share their pods' links to the cores.
        across = st.level[crossing] == 3
        if across.any():
            pods = topo.leaf_pod[np.maximum(st.leaves[crossing][across], 0)]
            r = rings[across] if rings is not None else None
            f_core, core = _shared(pods, r, demand[across], pod_core_total(topo), core_load)
            factor[across] = np.minimum(factor[across], f_core)
            core = (np.flatnonzero(across)[core[0]], core[1], core[2])
        share[crossing] = demand * factor
    granted = share.copy()

    def carried(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # What this entry's flows carry per leaf and per pod: each at its share for its group's time.
        if up is None:
            return np.zeros(load.size), np.zeros(core_load.size)
        rate, time = granted[crossing], t[crossing]
        own_core = np.zeros(core_load.size) if core is None else _carried(core_load.size, core, rate, time)
        return _carried(load.size, up, rate, time), own_core

    if collective == "volume":
        # The seed's accounting: each rank's bytes over its own bottleneck, no NIC sharing.
        eff_bw = np.minimum(st.path_bw, share)
        t = np.broadcast_to(np.asarray(volume_ms(nbytes, eff_bw), dtype=float), eff_bw.shape)
        return (t, eff_bw, *carried(t))
    uplink_share = share
    # Groups of one kind that cross the same NIC at once share its rate.
    share = np.minimum(share, st.nic_share)
    eff_bw = np.minimum(st.path_bw, share)
    if collective in NVLS_COLLECTIVES and topo.any_nvls:
        # Groups inside one domain run as NCCL would there: ring, tree or NVLS (`domain_ms`).
        nvls = np.where(st.spans, 0.0, topo.domain_nvls[topo.gpu_domain[st.members[:, 0]]])
        t = np.array(domain_ms(collective, n, nbytes, eff_bw, st.path_lat, nvls), dtype=float, ndmin=1)
    else:
        t = np.array(FLAT_FORMS[collective](n, nbytes, eff_bw, st.path_lat), dtype=float, ndmin=1)
    t = np.broadcast_to(t, eff_bw.shape).copy()
    if collective == "alltoall" and st.spans.any():
        sp = st.spans
        eff_bw = eff_bw.copy()
        t[sp], eff_bw[sp] = _alltoall_spanning(
            topo, st, sp, nbytes, np.minimum(st.inter_bw, uplink_share)[sp]
        )
    if hier.any():
        aligned = st.rail_aligned[hier]
        inter_bw = np.where(
            aligned,
            np.minimum(st.nic_bw[hier], st.nic_share[hier]),
            np.minimum(st.inter_bw[hier], share[hier]),
        )
        inter_lat = np.where(aligned, st.nic_lat[hier], st.inter_lat[hier])
        t[hier] = spanning_ms(
            collective,
            n,
            st.k_max[hier],
            st.n_domains[hier],
            nbytes,
            st.intra_bw[hier],
            st.intra_lat[hier],
            inter_bw,
            inter_lat,
            st.rails_min[hier],
        )
        eff_bw = eff_bw.copy()
        eff_bw[hier] = np.minimum(st.intra_bw[hier], inter_bw)
    return (t, eff_bw, *carried(t))


def _alltoall_spanning(topo: Topology, st: KindStats, sp: np.ndarray, nbytes: float, path_bw: np.ndarray):
    """(ms, GB/s) per group of an alltoall whose groups span NVLink domains. Member i sends S/n to
    each peer: those in other domains through its own NIC (one NIC per rank, NCCL does not
    aggregate NICs for all-to-all; shared by every spanning member on it, capped by the group's
    path and uplink share `path_bw`), those in its domain over NVLink; the group takes its slowest
    member, plus (n-1) path latencies. So 7+1, 4+4 and one rank per node differ."""
    m = st.members[sp]
    rows, n = m.shape
    dom = topo.gpu_domain[m].astype(np.int64)
    row = np.repeat(np.arange(rows, dtype=np.int64), n)
    _, inverse, counts = np.unique(
        row * (int(dom.max()) + 1) + dom.ravel(), return_inverse=True, return_counts=True
    )
    together = counts[inverse.reshape(-1)].reshape(rows, n)
    ids, n_nics = nic_ids(topo)
    nic = ids[m]
    on_nic = np.bincount(nic.ravel(), minlength=n_nics)[nic]
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.minimum(path_bw[:, None], topo.gpu_nic_bw[m] / on_nic)
    lat = st.path_lat[sp][:, None]
    inter = alltoall_spanning_ms(n, n - together, nbytes, bw, lat)
    intra = alltoall_spanning_ms(n, together - 1, nbytes, topo.domain_bw[dom], lat)
    return np.maximum(inter, intra).max(axis=1), bw.min(axis=1)


def _p2p(
    topo: Topology, st: KindStats, nbytes: float, load: np.ndarray, core_load: np.ndarray, ring: bool = False
):
    # Consecutive members (stage i -> i+1); a hop between leaves is a flow on each of its leaves.
    # A ring (context parallelism's ring attention) also closes from the last member to the first,
    # and a pass takes n - 1 steps, every member sending to its successor at once in each.
    a, b = st.members[:, :-1], st.members[:, 1:]
    if ring:
        a, b = st.members, np.roll(st.members, -1, axis=1)
    bw, lat, level = pair_paths(topo, a.ravel(), b.ravel())
    la, lb = topo.gpu_leaf[a.ravel()], topo.gpu_leaf[b.ravel()]
    crossing = level >= 2
    crossing &= (la >= 0) & (lb >= 0)
    # Hops that leave their NVLink domain share the NICs they send and receive through.
    netted = (level >= 1) & (la >= 0) & (lb >= 0)
    if netted.any():
        bw = bw.copy()
        bw[netted] = np.minimum(bw[netted], nic_sharing(topo, a.ravel()[netted], b.ravel()[netted]))
    own = np.zeros(load.size)
    own_core = np.zeros(core_load.size)
    steps = st.members.shape[1] - 1 if ring else 1
    if crossing.any():
        # Each crossing hop offers its path's rate on both ends' leaves (and pods, between pods)
        # and carries its bytes there once per send (GB/s x ms: 1e6 bytes).
        demand = bw[crossing]
        ends = np.stack([la[crossing], lb[crossing]], axis=1)
        factor, up = _shared(ends, None, demand, topo.leaf_uplink_total_bw, load)
        sent = np.full(demand.size, nbytes * steps / 1e6)
        own = _carried(load.size, up, sent, np.ones(demand.size))
        pods = topo.leaf_pod[ends]
        across = pods[:, 0] != pods[:, 1]
        if across.any():
            f_core, core = _shared(pods[across], None, demand[across], pod_core_total(topo), core_load)
            factor[across] = np.minimum(factor[across], f_core)
            own_core = _carried(core_load.size, core, sent[across], np.ones(int(across.sum())))
        bw = bw.copy()
        bw[crossing] = demand * factor
    bw = bw.reshape(a.shape)
    hop = np.asarray(p2p_ms(nbytes, bw, lat.reshape(a.shape)))
    return hop.max(axis=1) * steps, bw.min(axis=1), own, own_core


def _group_costs(arrays, stats, kind_time, kind_bw) -> tuple[GroupCost, ...]:
    out: list[GroupCost] = []
    for kind, st in stats.items():
        bws = np.where(np.isinf(kind_bw[kind]), st.path_bw, kind_bw[kind]).tolist()
        out.extend(
            GroupCost(kind, tuple(r), LEVELS[lv], bw, t)
            for r, lv, bw, t in zip(
                arrays[kind].tolist(), st.level.tolist(), bws, kind_time[kind].tolist(), strict=True
            )
        )
    return tuple(out)
