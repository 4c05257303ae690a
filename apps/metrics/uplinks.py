"""Measured leaf-uplink load: each NIC's measured transmit rate (node-exporter InfiniBand counters
or the node agent's sysfs counters) times the share of that NIC's traffic the placement's flows
send off its leaf (`traffic.nic_off_leaf_shares`), summed per leaf and divided by the leaf's total
uplink bandwidth. The NIC rate is measured; its split between the leaf and the uplinks is the
prediction's (switch port counters are not read), so traffic that stays under the leaf (a ring
across nodes of one leaf) is never charged to the uplinks, and a NIC no job is predicted to load
adds nothing.

A leaf at UPLINK_SATURATED or more for HOTSPOT_INTERVALS consecutive collections opens an
`uplink` hotspot and proposals for the jobs that cross it. Until then its row counts intervals
and is not shown (selectors show hotspots from HOTSPOT_INTERVALS intervals on)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from apps.scheduling import snapshot as snap
from apps.scheduling.models import Job
from apps.scheduling.proposals import migrations_propose_measured
from apps.topology.models import Cluster, Node

from .choices import HotspotKind
from .hotspots import HOTSPOT_INTERVALS
from .models import Hotspot, NicLatest, UplinkSample
from .traffic import nic_first, nic_off_leaf_shares

UPLINK_SATURATED = 0.9  # fraction of the leaf's total uplink bandwidth


def leaf_uplink_loads(*, cluster: Cluster, now: datetime, fresh_s: float) -> tuple[dict[str, float], dict]:
    """(leaf name -> measured uplink utilisation 0..1+, leaf name -> ids of the jobs crossing
    it) from the fresh NIC rates (see the module docstring)."""
    snapshot = snap.cluster_snapshot(cluster=cluster)
    topo = snapshot.topology
    rates = list(
        NicLatest.objects.filter(
            node__cluster=cluster, at__gte=now - timedelta(seconds=fresh_s), tx_Bps__isnull=False
        ).values_list("node_id", "device", "tx_Bps")
    )
    crossing: dict[str, set[int]] = defaultdict(set)
    placed = {a.job_id: a.gids for a in snapshot.active if a.gids}
    for job_id, gids in placed.items():
        leaves = {int(topo.gpu_leaf[g]) for g in gids} - {-1}
        if len(leaves) > 1:
            for leaf in leaves:
                crossing[topo.leaf_names[leaf]].add(job_id)
    if not rates:
        return {}, {k: sorted(v) for k, v in crossing.items()}
    predicted = dict(Job.objects.filter(pk__in=placed).values_list("pk", "predicted"))
    total, leaving = nic_off_leaf_shares(topo, ((gids, predicted.get(j)) for j, gids in placed.items()))
    first = nic_first(topo)
    names = dict(Node.objects.filter(cluster=cluster).values_list("pk", "name"))
    load: dict[int, float] = defaultdict(float)
    for node_id, device, tx in rates:
        n = topo.node_by_name.get(names.get(node_id, ""))
        if n is None:
            continue
        k = next((i for i, c in enumerate(topo.nodes[n].nics) if c.name == device), None)
        if k is None or total[first[n] + k] <= 0:
            continue
        share = leaving[first[n] + k] / total[first[n] + k]
        load[topo.leaf_by_name[topo.nodes[n].nics[k].leaf]] += tx * share
    out = {}
    for leaf, bps in load.items():
        capacity = float(topo.leaf_uplink_total_bw[leaf]) * 1e9
        if capacity > 0:
            out[topo.leaf_names[leaf]] = bps / capacity
    return out, {k: sorted(v) for k, v in crossing.items()}


def uplink_hotspots_detect(*, cluster: Cluster, now: datetime, fresh_s: float) -> list[Hotspot]:
    """Record each leaf's measured uplink share (UplinkSample), count saturated intervals per
    leaf; open a hotspot (and proposals for the jobs crossing the
    leaf) at HOTSPOT_INTERVALS; close it, or forget the count, once the leaf is below the mark."""
    loads, crossing = leaf_uplink_loads(cluster=cluster, now=now, fresh_s=fresh_s)
    UplinkSample.objects.bulk_create(
        [
            UplinkSample(cluster=cluster, leaf=leaf, at=now, share=share)
            for leaf, share in sorted(loads.items())
        ]
    )
    rows = {
        h.leaf: h
        for h in Hotspot.objects.filter(cluster=cluster, kind=HotspotKind.UPLINK, closed_at__isnull=True)
    }
    calm = [h for leaf, h in rows.items() if loads.get(leaf, 0.0) < UPLINK_SATURATED]
    Hotspot.objects.filter(pk__in=[h.pk for h in calm if h.intervals < HOTSPOT_INTERVALS]).delete()
    Hotspot.objects.filter(pk__in=[h.pk for h in calm if h.intervals >= HOTSPOT_INTERVALS]).update(
        closed_at=now
    )
    touched = []
    for leaf, share in sorted(loads.items()):
        if share < UPLINK_SATURATED:
            continue
        h = rows.get(leaf) or Hotspot(cluster=cluster, kind=HotspotKind.UPLINK, leaf=leaf, opened_at=now)
        h.intervals += 1
        h.last_seen_at = now
        history = (h.evidence or {}).get("uplink_load", [])[-(HOTSPOT_INTERVALS - 1) :]
        h.evidence = {"uplink_load": [*history, round(share, 4)], "jobs": crossing.get(leaf, [])}
        if h.intervals == HOTSPOT_INTERVALS and h.evidence["jobs"]:
            text = (
                f"uplinks of {leaf} at {share:.0%} of their bandwidth, measured, for {h.intervals} intervals"
            )
            proposals = migrations_propose_measured(
                cluster=cluster, evidence=dict.fromkeys(h.evidence["jobs"], text)
            )
            h.proposal = next((p for p in proposals.values() if p is not None), None)
        h.save()
        touched.append(h)
    return touched
