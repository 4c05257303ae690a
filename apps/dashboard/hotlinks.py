"""The hottest links of a cluster (as Grafana's `topk`): every NIC cable, leaf-spine and
spine-core uplink with its capacity, predicted load, measured load where NIC counters give one,
and the jobs on it; each leaf's measured uplink share over the last hours; a switch's
oversubscription (bandwidth below it over bandwidth above it)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from django.db.models import Q, Sum
from django.utils import timezone

from apps.dashboard.links import link_loads
from apps.dashboard.measured import link_values
from apps.dashboard.selectors import cluster_graph_data
from apps.metrics import selectors as metrics
from apps.metrics.models import UplinkSample
from apps.topology.models import Cluster, Link, Nic, Switch

SORTS = ("load", "predicted", "measured", "diff")
MAX_LIMIT = 500
JOBS_PER_LINK = 5


def _share(load, cap) -> float | None:
    return None if load is None or not cap else load / cap


def _jobs(per_job: dict[int, float] | None, views) -> list[dict]:
    rows = sorted((per_job or {}).items(), key=lambda jv: -jv[1])
    return [
        {"label": views[j].label, "url": views[j].url, "GBps": v} for j, v in rows[:JOBS_PER_LINK] if v > 0
    ]


def hot_links(
    *, cluster: Cluster, user, limit: int = 25, sort: str = "load", switch: str | None = None
) -> dict:
    """The `limit` busiest links by `sort` (one of SORTS: the larger of predicted and measured
    share of capacity, either alone, or measured minus predicted), each a dict with `kind`
    ("NIC cable", "leaf-spine", "spine-core"), its ends (`a`, `b`, and `node` for a NIC cable),
    `cap` GB/s, `predicted` and `measured` GB/s (measured None without fresh counters), their
    shares, `diff` (measured − predicted share) and `jobs` ([{label, url, GBps}]); with
    `switch`, only the links that end at that switch, its uplinks first."""
    data = cluster_graph_data(cluster=cluster, user=user)
    lay, views = data.layout, data.jobs
    topo = lay.topology
    loads = link_loads(lay, views)
    now = timezone.now()
    fresh_s = metrics.freshness_s(cluster=cluster)
    measured = link_values(
        cluster=cluster, topology=topo, since=now - timedelta(seconds=fresh_s), now=now, fresh_s=fresh_s
    )
    leaf_share = measured["leaf_uplink"]
    nic_GBps = {int(k): v for k, v in measured["nic_GBps"].items()}
    rows = []
    leaf_cap: dict[str, float] = {}
    for lo, _hi, bw, _ in lay.uplinks:
        if lay.switch_tier[lo] == "leaf":
            leaf_cap[lo] = leaf_cap.get(lo, 0.0) + bw
    for i, (lo, hi, _bw, _) in enumerate(lay.uplinks):
        cap = float(loads.up_cap[i])
        pred = float(loads.up_load[i])
        if lay.switch_tier[lo] == "leaf":
            share = cap / leaf_cap[lo] if leaf_cap.get(lo) else 0.0
            per = {j: v * share for j, v in loads.leaf_jobs.get(topo.leaf_by_name[lo], {}).items()}
            meas = leaf_share[lo] * cap if lo in leaf_share else None
            kind = "leaf-spine"
        else:
            per = loads.up_jobs.get(i)
            meas = None
            kind = f"{lay.switch_tier[lo]}-{lay.switch_tier[hi]}"
        rows.append(
            {
                "kind": kind,
                "a": lo,
                "b": hi,
                "node": "",
                "cap": cap,
                "predicted": pred,
                "measured": meas,
                "per": per,
            }
        )
    # NIC cables: only those carrying something, predicted or measured (16k idle NICs say nothing).
    busy = set(np.flatnonzero(loads.nic_load > 0).tolist()) | set(nic_GBps)
    for k in sorted(busy):
        if k >= lay.n_nics:
            continue
        if loads.nic_job[k] >= 0:
            per = {int(loads.nic_job[k]): float(loads.nic_load[k])}
        else:
            per = loads.nic_jobs.get(k)
        node = topo.nodes[int(lay.nic_node[k])].name
        rows.append(
            {
                "kind": "NIC cable",
                "a": f"{node} {lay.nic_names[k]}",
                "b": topo.leaf_names[int(lay.nic_leaf[k])],
                "node": node,
                "cap": float(loads.nic_cap[k]),
                "predicted": float(loads.nic_load[k]),
                "measured": nic_GBps.get(k),
                "per": per,
            }
        )
    for r in rows:
        r["predicted_share"] = _share(r["predicted"], r["cap"])
        r["measured_share"] = _share(r["measured"], r["cap"])
        r["diff"] = None if r["measured_share"] is None else r["measured_share"] - r["predicted_share"]
    key = {
        "load": lambda r: max(r["predicted_share"] or 0.0, r["measured_share"] or 0.0),
        "predicted": lambda r: r["predicted_share"] or 0.0,
        "measured": lambda r: -1.0 if r["measured_share"] is None else r["measured_share"],
        "diff": lambda r: -9.0 if r["diff"] is None else r["diff"],
    }[sort]
    if switch is not None:
        rows = [r for r in rows if switch in (r["a"], r["b"])]
        # A switch's own uplinks first (what its oversubscription is about), then its cables.
        rows.sort(key=lambda r: (r["kind"] == "NIC cable", -key(r), r["kind"], r["a"], r["b"]))
    else:
        rows.sort(key=lambda r: (-key(r), r["kind"], r["a"], r["b"]))
    top = rows[:limit]
    for r in top:
        r["jobs"] = _jobs(r.pop("per"), views)
    return {
        "rows": top,
        "total": len(rows),
        "measured": bool(nic_GBps or leaf_share),
        "fresh_s": fresh_s,
    }


def leaf_history(
    *, cluster: Cluster, hours: float = 6.0, leaf: str | None = None, limit: int = 12
) -> list[dict]:
    """Each leaf's measured uplink share over the last `hours` (UplinkSample): points [(time,
    share)], mean and peak; the `limit` leaves with the highest peak (or only `leaf`)."""
    since = timezone.now() - timedelta(hours=hours)
    qs = UplinkSample.objects.filter(cluster=cluster, at__gte=since)
    if leaf is not None:
        qs = qs.filter(leaf=leaf)
    series: dict[str, list] = {}
    for name, at, share in qs.order_by("leaf", "at").values_list("leaf", "at", "share"):
        series.setdefault(name, []).append((at, share))
    out = [
        {
            "leaf": name,
            "points": pts,
            "mean": sum(s for _, s in pts) / len(pts),
            "peak": max(s for _, s in pts),
            "last": pts[-1][1],
        }
        for name, pts in series.items()
    ]
    out.sort(key=lambda r: (-r["peak"], r["leaf"]))
    return out[:limit]


def oversubscription(*, switch: Switch) -> dict | None:
    """A switch's bandwidth below (NICs cabled to a leaf; links to the tier below otherwise) and
    above (links to the tier above), GB/s, and their ratio (below / above, 1.0: non-blocking);
    None for a top-tier switch or one with nothing below."""
    tiers = {"leaf": ("", "spine"), "spine": ("leaf", "core"), "core": ("spine", "")}
    below_tier, above_tier = tiers[switch.tier]
    if not above_tier:
        return None
    links = Link.objects.filter(Q(a=switch) | Q(b=switch)).select_related("a", "b")
    above = below = 0.0
    for link in links:
        other = link.b if link.a_id == switch.pk else link.a
        if other.tier == above_tier:
            above += link.bw_GBps
        elif other.tier == below_tier:
            below += link.bw_GBps
    if switch.tier == "leaf":
        below = float(Nic.objects.filter(leaf=switch).aggregate(bw=Sum("bw_GBps"))["bw"] or 0.0)
    if not below or not above:
        return None
    return {"below_GBps": below, "above_GBps": above, "ratio": below / above}
