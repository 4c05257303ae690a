"""What the dashboard shows about one placed job, as plain data (no Django).

`JobView` is built from the core's job spec, the rank-to-GPU mapping and the cost model's
prediction; the figure builders and templates read only this. A job of another user is a
`JobView` with `details=False`: its GPUs are drawn, but its name, owner, ranks and groups are not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from apps.placement.groups import rank_groups
from apps.placement.jobs import GROUP_KINDS, JobSpec
from apps.placement.topology import LEVEL_RANK, Topology


@dataclass(frozen=True, slots=True)
class GroupView:
    """One communication group of a job: its ranks, the highest tier it crosses, its slowest
    member path in GB/s (with congestion, where the cost model priced it) and, when the job's
    comm entries price it, its time per step in ms."""

    kind: str
    index: int
    ranks: tuple[int, ...]
    level: str
    bottleneck_GBps: float
    time_ms: float | None = None


@dataclass(frozen=True)
class JobView:
    """A placed job as the cluster graph and job page draw it.

    `gids[r]` is rank r's GPU. Predicted figures: `step_ms` and `comm_ms` in milliseconds,
    `mfu`, `util` (compute time / step time) and `comm_share` (communication time / (compute +
    communication time)) as fractions 0..1. `flows` is the job's heavy flows per leaf name.
    """

    id: int
    label: str
    details: bool
    gids: tuple[int, ...]
    status: str = "running"
    step_ms: float | None = None
    comm_ms: float | None = None
    compute_ms: float | None = None
    mfu: float | None = None
    util: float | None = None
    comm_share: float | None = None
    groups: Mapping[str, tuple[GroupView, ...]] = field(default_factory=dict)
    flows: Mapping[str, float] = field(default_factory=dict)
    url: str | None = None
    # Predicted mean send rate (GB/s) of each GPU over the network, per level its groups cross:
    # (gid, level, GB/s) rows; kept for every job (link loads do not depend on who looks).
    net_rates: tuple[tuple[int, str, float], ...] = ()

    @cached_property
    def _group_of_rank(self) -> dict[str, dict[int, GroupView]]:
        return {kind: {r: g for g in views for r in g.ranks} for kind, views in self.groups.items()}

    def rank_groups(self, rank: int) -> list[GroupView]:
        """The groups (one per kind with more than one rank) that `rank` belongs to."""
        index = self._group_of_rank
        return [index[k][rank] for k in GROUP_KINDS if k in index and rank in index[k]]


def predicted_shares(compute_ms: float, comm_ms: float | None, step_ms: float | None):
    """(GPU utilisation, comm share) of a predicted step: compute time over step time, and
    communication time over compute plus communication time; None when not predicted."""
    if comm_ms is None or step_ms is None or step_ms <= 0:
        return None, None
    util = min(1.0, compute_ms / step_ms)
    total = compute_ms + comm_ms
    return util, (comm_ms / total if total > 0 else 0.0)


def job_view(
    topo: Topology,
    *,
    id: int,
    label: str,
    details: bool,
    job: JobSpec,
    gids: Sequence[int],
    predicted: Mapping | None,
    flows: Mapping[str, float] | None = None,
    status: str = "running",
    url: str | None = None,
    traffic: Mapping | None = None,
) -> JobView:
    """A placed job's view: `predicted` is the placement output's `predicted` block (comm_ms,
    step_ms, mfu, groups); groups and per-rank details are kept only when `details` is True.
    `traffic` is the full prediction used for link loads (default: `predicted`)."""
    predicted = predicted or {}
    comm_ms = predicted.get("comm_ms")
    step = predicted.get("step_ms")
    util, comm_share = predicted_shares(job.compute_ms, comm_ms, step)
    full = predicted if traffic is None else traffic
    all_groups = group_views(topo, gids, rank_groups(job), full.get("groups") or ())
    groups = all_groups if details else {}
    return JobView(
        id=id,
        label=label,
        details=details,
        gids=tuple(int(g) for g in gids),
        status=status,
        step_ms=step,
        comm_ms=comm_ms,
        compute_ms=job.compute_ms,
        mfu=predicted.get("mfu"),
        util=util,
        comm_share=comm_share,
        groups=groups,
        flows=dict(flows or {}),
        url=url,
        net_rates=network_rates(gids, all_groups, full.get("step_ms")),
    )


def network_rates(gids: Sequence[int], groups: Mapping[str, tuple[GroupView, ...]], step_ms) -> tuple:
    """(gid, level, GB/s) per GPU and level its priced groups cross beyond NVLink: each member
    sends at the group's bottleneck for the group's time per step, averaged over the step (a ring
    sends about as much as it receives, so this is also the receive rate)."""
    if not step_ms or not np.isfinite(step_ms) or step_ms <= 0:
        return ()
    rate: dict[tuple[int, str], float] = {}
    for views in groups.values():
        for g in views:
            if g.level == "nvlink" or g.time_ms is None or not g.bottleneck_GBps:
                continue
            r = g.bottleneck_GBps * min(1.0, g.time_ms / step_ms)
            for rank in g.ranks:
                key = (int(gids[rank]), g.level)
                rate[key] = rate.get(key, 0.0) + r
    return tuple((gid, level, round(v, 4)) for (gid, level), v in sorted(rate.items()))


def _field(cost, name):
    return cost[name] if isinstance(cost, Mapping) else getattr(cost, name)


def group_views(
    topo: Topology,
    gids: Sequence[int],
    groups: Mapping[str, Sequence[Sequence[int]]],
    priced: Sequence = (),
) -> dict[str, tuple[GroupView, ...]]:
    """Every group of more than one rank, with its level and bottleneck (GB/s).

    `groups` maps kind -> list of rank tuples (the core's `rank_groups`). `priced` is the
    prediction's group list (`GroupCost` objects or the placement output's `groups` dicts): where a
    group is priced, its level, congested bottleneck and time per step (ms) come from there;
    the others take level and bottleneck from the path model.
    """
    costs: dict[tuple[str, tuple[int, ...]], object] = {}
    for cost in priced:
        costs[(_field(cost, "group"), tuple(int(r) for r in _field(cost, "ranks")))] = cost
    out: dict[str, tuple[GroupView, ...]] = {}
    for kind in GROUP_KINDS:
        views = []
        for i, ranks in enumerate(groups.get(kind, ())):
            ranks = tuple(int(r) for r in ranks)
            if len(ranks) < 2:
                continue
            cost = costs.get((kind, ranks))
            if cost is None:
                path = topo.group_path([gids[r] for r in ranks])
                views.append(GroupView(kind, i, ranks, path.level, path.bw_GBps))
                continue
            priced_bw = _field(cost, "bottleneck_GBps")
            t = _field(cost, "time_ms")
            views.append(
                GroupView(
                    kind,
                    i,
                    ranks,
                    _field(cost, "level"),
                    float(priced_bw) if priced_bw is not None else 0.0,
                    float(t) if t is not None else None,
                )
            )
        if views:
            out[kind] = tuple(views)
    return out


def crossed_links(topo: Topology, gids: Sequence[int], groups: Mapping[str, tuple[GroupView, ...]]):
    """What a job's groups cross: (gids whose NIC carries group traffic, leaf indices whose
    uplinks carry it, pod indices whose core uplinks carry it)."""
    nic_gids: set[int] = set()
    leaves: set[int] = set()
    pods: set[int] = set()
    for views in groups.values():
        for g in views:
            if LEVEL_RANK[g.level] < LEVEL_RANK["leaf"]:
                continue
            members = [int(gids[r]) for r in g.ranks]
            nic_gids.update(members)
            if LEVEL_RANK[g.level] >= LEVEL_RANK["spine"]:
                leaves.update(int(topo.gpu_leaf[m]) for m in members if topo.gpu_leaf[m] >= 0)
            if g.level == "core":
                pods.update(int(topo.gpu_pod[m]) for m in members if topo.gpu_pod[m] >= 0)
    return nic_gids, leaves, pods
