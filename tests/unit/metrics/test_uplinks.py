"""Measured leaf-uplink load from NIC counters, attributed with the placement's flows (only the
traffic that leaves the leaf), and the hotspots it opens: a leaf whose uplinks carry 90% of their
bandwidth for three intervals gets a hotspot and a proposal for the job that crosses it."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.metrics.choices import HotspotKind
from apps.metrics.models import Hotspot, NicLatest
from apps.metrics.selectors import open_hotspots
from apps.metrics.traffic import nic_first, nic_off_leaf_shares, rank_network_rates
from apps.metrics.uplinks import leaf_uplink_loads, uplink_hotspots_detect
from apps.scheduling import snapshot as snap
from apps.scheduling.demo import load_demo_jobs
from apps.scheduling.models import Allocation, Job
from apps.topology.models import Link, Node


def nic_rates(cluster, leaf_nodes, tx_Bps, at):
    NicLatest.objects.all().delete()
    for node in Node.objects.filter(cluster=cluster, name__in=leaf_nodes):
        for nic in node.nics.all():
            NicLatest.objects.create(node=node, device=nic.name, port="1", at=at, tx_Bps=tx_Bps)


def test_a_saturated_leaf_opens_an_uplink_hotspot_after_three_intervals(pod256, client):
    load_demo_jobs(start_all=True)
    naive = Job.objects.get(name="llm-tp8-dp2-naive")
    nodes = set(
        Allocation.objects.filter(job=naive, live=True, gpu__node__leaf__name="leaf-2").values_list(
            "gpu__node__name", flat=True
        )
    )
    for link in Link.objects.filter(cluster=pod256, a__name="leaf-2"):
        link.bw_GBps = 2.0  # an oversubscribed leaf: 4 GB/s of uplinks
        link.save()
    start = timezone.now()
    # Its NICs near line rate (45 of 50 GB/s); the part its DP allreduce sends off the leaf
    # (the TP traffic stays on NVLink) fills the thin uplinks.
    nic_rates(pod256, nodes, 45e9, start)
    loads, crossing = leaf_uplink_loads(cluster=pod256, now=start, fresh_s=60)
    assert loads["leaf-2"] > 0.9 and naive.pk in crossing["leaf-2"]
    for i in range(2):
        uplink_hotspots_detect(cluster=pod256, now=start + timedelta(seconds=i), fresh_s=60)
    assert not open_hotspots(cluster=pod256).exists()  # two intervals are not yet a hotspot
    uplink_hotspots_detect(cluster=pod256, now=start + timedelta(seconds=2), fresh_s=60)
    (hotspot,) = open_hotspots(cluster=pod256)
    assert (hotspot.kind, hotspot.leaf, hotspot.intervals) == (HotspotKind.UPLINK, "leaf-2", 3)
    assert len(hotspot.evidence["uplink_load"]) == 3 and naive.pk in hotspot.evidence["jobs"]
    assert hotspot.proposal is not None and hotspot.proposal.job_id == naive.pk
    assert "uplinks of leaf-2" in hotspot.proposal.reason
    client.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    body = client.get("/clusters/pod-256/").content.decode()
    assert "uplink load" in body and f"proposal {hotspot.proposal_id}" in body

    nic_rates(pod256, nodes, 1e9, start)
    uplink_hotspots_detect(cluster=pod256, now=start + timedelta(seconds=3), fresh_s=60)
    assert Hotspot.objects.get(pk=hotspot.pk).closed_at is not None


def test_a_group_inside_one_leaf_loads_nics_but_never_the_uplinks(pod256):
    topo = snap.cluster_snapshot(cluster=pod256).topology
    leaf0 = [g for g in range(topo.n_gpus) if topo.gpu_leaf[g] == 0]
    leaf1 = [g for g in range(topo.n_gpus) if topo.gpu_leaf[g] == 1]
    gids = [leaf0[0], leaf0[8], leaf1[0], leaf1[8]]  # two nodes under each of two leaves
    groups = [
        {"group": "pp", "ranks": [0, 1], "level": "leaf", "bottleneck_GBps": 40.0, "time_ms": 50.0},
        {"group": "pp", "ranks": [2, 3], "level": "leaf", "bottleneck_GBps": 40.0, "time_ms": 50.0},
        {"group": "dp", "ranks": [0, 2], "level": "spine", "bottleneck_GBps": 20.0, "time_ms": 100.0},
    ]
    nic, off = rank_network_rates(topo, gids, groups, 200.0)
    # 40 GB/s for a quarter of the step within the leaf, 20 GB/s for half of it across leaves,
    # of which half leaves (half the job's GPUs are under the other leaf).
    assert list(nic) == [20.0, 10.0, 20.0, 10.0]
    assert list(off) == [5.0, 0.0, 5.0, 0.0]
    total, leaving = nic_off_leaf_shares(topo, [(gids, {"groups": groups, "step_ms": 200.0})])
    first = nic_first(topo)
    nics = [int(first[topo.gpu_node[g]] + topo.gpu_rail[g]) for g in gids]
    assert [total[k] for k in nics] == [20.0, 10.0, 20.0, 10.0]
    assert [leaving[k] for k in nics] == [5.0, 0.0, 5.0, 0.0]
    assert total.sum() == 60.0  # no other NIC loaded


def test_measured_uplink_load_on_the_demo_is_within_20_percent_of_the_predicted(pod256, client):
    """The simulated exporter's counters (the demo's) collected twice give NIC rates; attributed to
    the uplinks they match the hot-links page's predicted load on every leaf whose crossing jobs
    run as predicted (measured step within 10% of the predicted one)."""
    from apps.dashboard.hotlinks import hot_links
    from apps.metrics.fake import SimulatedExporter
    from apps.metrics.models import JobSample
    from apps.metrics.services import metrics_collect

    load_demo_jobs(start_all=True)
    exporter = SimulatedExporter(["pod-256"])
    server = exporter.serve("127.0.0.1", 0, refresh_s=3600)
    try:
        exporter.point_nodes(f"http://127.0.0.1:{server.server_address[1]}")
        start = timezone.now() - timedelta(seconds=30)
        for i in range(2):
            sim = exporter._sims["pod-256"]
            sim.last -= 15.0  # the counters advance 15 s of traffic between the two scrapes
            exporter.refresh()
            metrics_collect(cluster=pod256, now=start + timedelta(seconds=15 * i))
    finally:
        exporter.stop()
    user = get_user_model().objects.create_user("ops", is_staff=True)
    rows = hot_links(cluster=pod256, user=user, limit=500)["rows"]
    predicted: dict[str, float] = {}
    measured: dict[str, float] = {}
    for r in rows:
        if r["kind"] == "leaf-spine":
            predicted[r["a"]] = predicted.get(r["a"], 0.0) + r["predicted"]
            measured[r["a"]] = measured.get(r["a"], 0.0) + (r["measured"] or 0.0)
    _, crossing = leaf_uplink_loads(cluster=pod256, now=start + timedelta(seconds=15), fresh_s=60)
    right = {
        s.job_id
        for s in JobSample.objects.filter(job__cluster=pod256)
        if s.step_ms and s.predicted_step_ms and abs(s.step_ms / s.predicted_step_ms - 1) < 0.1
    }
    checked = [leaf for leaf, jobs in crossing.items() if predicted.get(leaf, 0) > 0 and set(jobs) <= right]
    assert checked, "no leaf whose crossing jobs run as predicted"
    for leaf in checked:
        assert abs(measured[leaf] / predicted[leaf] - 1) <= 0.2, (leaf, measured[leaf], predicted[leaf])
