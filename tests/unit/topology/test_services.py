"""The core's snapshot of a cluster, its cache, validation of edited rows, and the selectors."""

import pytest

from apps.placement.topology import SpecError
from apps.topology import selectors, services
from apps.topology.models import Cluster, Gpu, Nic, Node, NvlinkDomain, Switch

pytestmark = pytest.mark.django_db


def test_cluster_topology_matches_the_rows(pod256):
    topo = services.cluster_topology(cluster=pod256)
    assert topo.n_gpus == 256
    assert topo.leaf_names == ("leaf-1", "leaf-2", "leaf-3", "leaf-4")
    gpu = Gpu.objects.select_related("node").get(node__cluster=pod256, node__name="node-009", index=3)
    assert topo.gpu_key(topo.gid(gpu.node.name, gpu.index)) == ("node-009", 3)
    assert topo.gid("node-009", 3) == 8 * 8 + 3
    assert topo.path(topo.gid("node-001", 0), topo.gid("node-009", 0)).level == "spine"


def test_cluster_topology_is_cached_until_a_row_changes(case44):
    first = services.cluster_topology(cluster=case44)
    assert services.cluster_topology(cluster=case44) is first
    nic = Nic.objects.get(node__cluster=case44, node__name="node-b")
    nic.bw_GBps = 25
    nic.save()
    # A stale instance still sees the change: the stamp is read from the database.
    second = services.cluster_topology(cluster=case44)
    assert second is not first
    assert second.path(0, 8).bw_GBps == 11.0
    assert float(second.gpu_nic_bw[8]) == 25.0


def test_cluster_topology_of_a_deleted_cluster_raises(case44):
    Cluster.objects.filter(pk=case44.pk).delete()
    with pytest.raises(Cluster.DoesNotExist):
        services.cluster_topology(cluster=case44)


def test_valid_cluster_has_no_problems(pod256):
    assert services.cluster_validate(cluster=pod256) == []


def test_gpu_left_without_a_nic_is_reported_with_its_node(case44):
    Gpu.objects.filter(node__cluster=case44, node__name="node-b", index__gte=6).update(nic=None)
    problems = services.cluster_validate(cluster=case44)
    assert problems == [
        (
            "nodes[1].nics",
            "GPUs [6, 7] of node 'node-b' have no NIC (mark the node standalone: true if intended)",
        )
    ]
    with pytest.raises(SpecError):
        services.cluster_to_spec(cluster=case44)


def test_gap_in_gpu_indices_is_reported(case44):
    Gpu.objects.filter(node__cluster=case44, node__name="node-a", index=7).delete()
    Gpu.objects.filter(node__cluster=case44, node__name="node-a", index=6).update(index=9)
    fields = [field for field, _ in services.cluster_validate(cluster=case44)]
    assert "nodes[0].gpus" in fields


def test_node_split_across_domains_is_reported(case44):
    domain_b = NvlinkDomain.objects.get(cluster=case44, name="node-b")
    Gpu.objects.filter(node__cluster=case44, node__name="node-a", index=0).update(domain=domain_b)
    problems = dict(services.cluster_validate(cluster=case44))
    assert problems["nodes[0].nvlink"] == (
        "node 'node-a' has GPUs in several NVLink domains (node-a, node-b); spec v1 needs one"
    )


def test_unknown_leaf_message_names_the_node(import_example):
    su = import_example("su-h100")
    spine = Switch.objects.get(cluster=su, name="spine-1")
    Nic.objects.filter(node__cluster=su, node__name="node-002", name="mlx5_3").update(leaf=spine)
    problems = dict(services.cluster_validate(cluster=su))
    assert problems["nodes[1].nics[3].leaf"] == "node 'node-002': unknown leaf switch 'spine-1'"


def test_node_refresh_leaf_follows_the_first_nic(pod256):
    node = Node.objects.get(cluster=pod256, name="node-001")
    leaf3 = Switch.objects.get(cluster=pod256, name="leaf-3")
    Nic.objects.filter(node=node).update(leaf=leaf3)
    assert dict(services.cluster_validate(cluster=pod256))["nodes[0].leaf"].endswith("first NIC is on leaf-3")
    services.node_refresh_leaf(node=node)
    node.refresh_from_db()
    assert node.leaf == leaf3
    assert services.cluster_validate(cluster=pod256) == []


def test_cluster_summary_counts_by_tier(import_example):
    su = import_example("su-h100")
    summary = selectors.cluster_summary(cluster=su)
    assert summary["nodes"] == 32
    assert summary["gpus"] == 256
    assert summary["switches"] == {"leaf": 8, "spine": 4, "core": 0}
    assert summary["links"] == 32
    assert summary["nvlink_domains"] == 32
    assert summary["leaves"] == [f"leaf-{i}" for i in range(1, 9)]


def test_cluster_list_counts_each_cluster_separately(case44, pod256, django_assert_num_queries):
    with django_assert_num_queries(1):
        rows = {c.name: (c.node_count, c.gpu_count, c.switch_count) for c in selectors.cluster_list()}
    assert rows == {"case-4-4": (2, 16, 1), "pod-256": (32, 256, 6)}
