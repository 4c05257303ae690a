"""Database constraints, model validation and the cluster `updated_at` touch."""

import math

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import RestrictedError

from apps.topology.models import Cluster, Gpu, GpuModel, Link, Nic, Node, NvlinkDomain, Switch

pytestmark = pytest.mark.django_db


@pytest.fixture
def other(import_example):
    """A second cluster, to point rows across clusters."""
    return import_example("pod-256")


def integrity_error(create) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        create()


def test_switch_names_are_unique_per_cluster_only(case44, other):
    integrity_error(lambda: Switch.objects.create(cluster=case44, name="leaf-1", tier="leaf"))
    assert Switch.objects.filter(name="leaf-1").count() == 2


def test_gpu_index_is_unique_per_node(case44):
    gpu = Gpu.objects.filter(node__cluster=case44).first()
    integrity_error(
        lambda: Gpu.objects.create(node=gpu.node, index=gpu.index, domain=gpu.domain, nic=gpu.nic)
    )


def test_nic_name_is_unique_per_node(case44):
    nic = Nic.objects.filter(node__cluster=case44).first()
    integrity_error(
        lambda: Nic.objects.create(node=nic.node, name=nic.name, leaf=nic.leaf, bw_GBps=1, latency_us=1)
    )


@pytest.mark.parametrize("value", [0, -3])
def test_database_refuses_non_positive_bandwidths_and_latencies(case44, value):
    nic = Nic.objects.filter(node__cluster=case44).first()
    domain = NvlinkDomain.objects.filter(cluster=case44).first()
    integrity_error(lambda: Nic.objects.filter(pk=nic.pk).update(bw_GBps=value))
    integrity_error(lambda: Nic.objects.filter(pk=nic.pk).update(latency_us=value))
    integrity_error(lambda: NvlinkDomain.objects.filter(pk=domain.pk).update(bw_GBps=value))
    integrity_error(lambda: GpuModel.objects.filter(cluster=case44).update(peak_tflops=value))


def test_database_refuses_a_link_from_a_switch_to_itself(other):
    spine = Switch.objects.get(cluster=other, name="spine-1")
    integrity_error(lambda: Link.objects.create(cluster=other, a=spine, b=spine, bw_GBps=1, latency_us=1))


def test_database_refuses_an_unknown_tier(case44):
    integrity_error(lambda: Switch.objects.create(cluster=case44, name="x", tier="tor"))


def test_infinite_bandwidth_fails_validation_on_its_field(case44):
    nic = Nic.objects.filter(node__cluster=case44).first()
    nic.bw_GBps = math.inf
    with pytest.raises(ValidationError) as err:
        nic.full_clean()
    assert "bw_GBps" in err.value.message_dict


def test_node_on_another_clusters_leaf_fails_validation(case44, other):
    node = Node.objects.get(cluster=case44, name="node-a")
    node.leaf = Switch.objects.get(cluster=other, name="leaf-1")
    with pytest.raises(ValidationError) as err:
        node.full_clean()
    assert err.value.message_dict["leaf"] == ["switch 'leaf-1' belongs to another cluster"]


def test_nic_on_a_spine_fails_validation(other):
    nic = Nic.objects.filter(node__cluster=other).first()
    nic.leaf = Switch.objects.get(cluster=other, name="spine-2")
    with pytest.raises(ValidationError) as err:
        nic.full_clean()
    assert err.value.message_dict["leaf"] == ["switch 'spine-2' is a spine switch, not a leaf"]


def test_gpu_using_another_nodes_nic_fails_validation(case44):
    gpu = Gpu.objects.get(node__cluster=case44, node__name="node-a", index=0)
    gpu.nic = Nic.objects.get(node__cluster=case44, node__name="node-b")
    with pytest.raises(ValidationError) as err:
        gpu.full_clean()
    assert err.value.message_dict["nic"] == ["NIC 'mlx5_0' is on node 'node-b', not on 'node-a'"]


def test_gpu_of_a_networked_node_needs_a_nic(case44):
    gpu = Gpu.objects.get(node__cluster=case44, node__name="node-a", index=0)
    gpu.nic = None
    with pytest.raises(ValidationError) as err:
        gpu.full_clean()
    assert "exactly one NIC" in err.value.message_dict["nic"][0]


def test_link_between_two_leaves_fails_validation(other):
    a, b = Switch.objects.filter(cluster=other, tier="leaf")[:2]
    link = Link(cluster=other, a=a, b=b, bw_GBps=10, latency_us=1)
    with pytest.raises(ValidationError) as err:
        link.full_clean()
    assert "adjacent tiers" in err.value.message_dict["b"][0]


def test_gpu_in_another_clusters_domain_fails_validation(case44, other):
    gpu = Gpu.objects.get(node__cluster=case44, node__name="node-a", index=0)
    gpu.domain = NvlinkDomain.objects.filter(cluster=other).first()
    with pytest.raises(ValidationError) as err:
        gpu.full_clean()
    assert "belongs to another cluster" in err.value.message_dict["domain"][0]


def test_saving_or_deleting_a_row_advances_the_clusters_updated_at(case44):
    stamps = [Cluster.objects.get(pk=case44.pk).updated_at]
    nic = Nic.objects.filter(node__cluster=case44).first()
    nic.bw_GBps = 12
    nic.save()
    stamps.append(Cluster.objects.get(pk=case44.pk).updated_at)
    Link.objects.filter(cluster=case44).delete()
    Switch.objects.create(cluster=case44, name="spine-1", tier="spine").delete()
    stamps.append(Cluster.objects.get(pk=case44.pk).updated_at)
    assert stamps[0] < stamps[1] < stamps[2]


def test_a_nic_that_gpus_use_cannot_be_deleted(case44):
    nic = Nic.objects.filter(node__cluster=case44).first()
    with pytest.raises(RestrictedError):
        nic.delete()


def test_deleting_a_cluster_deletes_all_its_rows(case44, other):
    case44.delete()
    assert not Gpu.objects.filter(node__cluster_id=case44.pk).exists()
    assert Node.objects.count() == 32
    assert Gpu.objects.count() == 256
