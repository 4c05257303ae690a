"""The node and switch pages: GPUs with their job and rank, NICs and leaves, health, metrics."""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from apps.metrics.models import GpuLatest, NicLatest
from apps.scheduling.choices import NodeState
from apps.scheduling.models import NodeHealth
from apps.topology.models import Gpu, Node


def node_url(name="node-a", cluster="case-4-4"):
    return reverse("dashboard:node", args=[cluster, name])


def test_node_page_lists_each_gpu_with_its_job_rank_and_nic(client, people, naive_case44):
    client.force_login(people["alice"])
    html = client.get(node_url()).content.decode()
    assert html.count("<tr data-gpu=") == 8
    assert f'href="/jobs/{naive_case44.pk}/"' in html and "bert-large-16" in html
    # The naive placement spreads ranks 0-3 and 8-11 on node-a: the table lists them.
    assert 'id="node-jobs"' in html and "0-3, 8-11" in html
    assert 'href="/clusters/case-4-4/switches/' in html
    assert 'id="drain-form"' not in html  # operators only


def test_other_users_jobs_on_a_node_stay_anonymous(client, people, naive_case44):
    client.force_login(people["bob"])
    html = client.get(node_url()).content.decode()
    assert f"job {naive_case44.pk} (other user)" in html
    assert "bert-large-16" not in html and f'href="/jobs/{naive_case44.pk}/"' not in html


def test_unknown_node_or_cluster_is_404(client, people, case44_db):
    client.force_login(people["alice"])
    assert client.get(node_url("no-such-node")).status_code == 404
    assert client.get(node_url("node-a", "no-such-cluster")).status_code == 404
    assert client.get("/clusters/case-4-4/nodes/" + "x" * 300 + "/").status_code == 404


def test_node_page_shows_health_and_fresh_measurements(client, people, naive_case44):
    node = Node.objects.get(cluster=naive_case44.cluster, name="node-a")
    NodeHealth.objects.create(
        node=node,
        state=NodeState.DRAINING,
        reason="firmware update",
        last_seen=timezone.now(),
        unhealthy_gpus=[{"gpu": 5, "reason": "XID 79"}],
    )
    gpu = Gpu.objects.get(node=node, index=2)
    GpuLatest.objects.create(gpu=gpu, at=timezone.now(), gpu_util=0.875, power_W=612.4)
    nic = node.nics.first()
    NicLatest.objects.create(
        node=node, device=nic.name, port="1", at=timezone.now(), tx_Bps=5.5e9, rx_Bps=1e9
    )
    client.force_login(people["ops"])
    html = client.get(node_url()).content.decode()
    assert "firmware update" in html and "XID 79" in html
    assert "87.5%" in html and "612 W" in html
    assert f"{100 * 5.5e9 / (nic.bw_GBps * 1e9):.1f}%" in html  # NIC load as a share of its speed
    assert 'id="resume-form"' in html and 'id="drain-form"' not in html


def test_drain_from_the_node_page_comes_back_to_it(client, people, case44_db):
    client.force_login(people["ops"])
    response = client.post(
        reverse("dashboard:node-drain", args=["case-4-4"]),
        {"node": "node-b", "reason": "cable check", "back": "node"},
    )
    assert response.status_code == 302 and response["Location"] == node_url("node-b")
    assert NodeHealth.objects.get(node__name="node-b").state == NodeState.DRAINED
    html = client.get(node_url("node-b")).content.decode()
    assert "cable check" in html and 'id="resume-form"' in html


def test_switch_page_lists_links_and_the_nodes_on_a_leaf(client, people, case44_db):
    node = Node.objects.select_related("leaf").get(cluster=case44_db, name="node-a")
    client.force_login(people["alice"])
    html = client.get(reverse("dashboard:switch", args=["case-4-4", node.leaf.name])).content.decode()
    assert 'id="switch-nodes"' in html and node_url("node-a") in html
    assert client.get(reverse("dashboard:switch", args=["case-4-4", "nope"])).status_code == 404


def test_a_finished_job_moves_to_the_recent_list(client, people, naive_case44):
    from apps.scheduling import services

    services.job_cancel(job=naive_case44, user=people["alice"])
    client.force_login(people["alice"])
    html = client.get(node_url()).content.decode()
    assert 'id="node-no-jobs"' in html
    assert 'id="node-recent"' in html and "bert-large-16" in html and "cancelled" in html


def test_a_rail_optimized_node_lists_each_nic_on_its_own_leaf(client, people, django_assert_max_num_queries):
    from apps.placement.topology import read_spec_file
    from apps.topology.services import cluster_import

    from .conftest import EXAMPLES

    cluster_import(data=read_spec_file(str(EXAMPLES / "su-h100-rail.yaml")))
    node = Node.objects.filter(cluster__name="su-h100").order_by("position").first()
    client.force_login(people["alice"])
    with django_assert_max_num_queries(16):  # a fixed number, whatever the GPU and NIC count
        html = client.get(node_url(node.name, "su-h100")).content.decode()
    leaves = sorted({nic.leaf.name for nic in node.nics.select_related("leaf")})
    assert len(leaves) == 8  # NIC i on leaf i: one rail per leaf
    for leaf in leaves:
        assert f'href="/clusters/su-h100/switches/{leaf}/"' in html
    assert html.count("<tr data-nic=") == 8
