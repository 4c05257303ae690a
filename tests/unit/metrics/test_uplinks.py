"""Leaf-uplink hotspots from measured NIC counters: a leaf whose uplinks carry 90% of their
bandwidth for three intervals gets a hotspot and a proposal for the job that crosses it."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.metrics.choices import HotspotKind
from apps.metrics.models import Hotspot, NicLatest
from apps.metrics.selectors import open_hotspots
from apps.metrics.uplinks import leaf_uplink_loads, uplink_hotspots_detect
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
        link.bw_GBps = 80.0  # an oversubscribed leaf: 160 GB/s of uplinks
        link.save()
    start = timezone.now()
    # Its NICs near line rate (45 of 50 GB/s), part of that traffic leaving the leaf.
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
