"""The admin topology editor, driven through the test client as a superuser."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from apps.topology.models import Cluster, Gpu, GpuModel, Link, Nic, Node, NvlinkDomain, Switch

pytestmark = pytest.mark.django_db

MODELS = [Cluster, GpuModel, Switch, Link, NvlinkDomain, Node, Nic, Gpu]


def url(model, view: str, *args) -> str:
    return reverse(f"admin:topology_{model._meta.model_name}_{view}", args=args)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelist_add_and_change_pages_load(model, admin_client, pod256):
    assert admin_client.get(url(model, "changelist")).status_code == 200
    assert admin_client.get(url(model, "add")).status_code == 200
    obj = model.objects.first()
    page = admin_client.get(url(model, "change", obj.pk))
    assert page.status_code == 200
    assert str(obj) in page.content.decode()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelist_queries_do_not_grow_with_rows(
    model, admin_client, case44, import_example, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as small:
        admin_client.get(url(model, "changelist"))
    import_example("pod-256")
    import_example("su-h100")
    with django_assert_max_num_queries(len(small.captured_queries)):
        assert admin_client.get(url(model, "changelist")).status_code == 200


def test_changelist_filters_by_cluster_and_tier(admin_client, case44, pod256):
    page = admin_client.get(
        url(Switch, "changelist"), {"cluster__id__exact": pod256.pk, "tier__exact": "spine"}
    )
    assert page.context["cl"].result_count == 2
    nodes = admin_client.get(url(Node, "changelist"), {"q": "node-03"})
    assert sorted(n.name for n in nodes.context["cl"].result_list) == [f"node-03{i}" for i in range(3)]


def test_node_change_form_shows_its_gpus_and_nics_inline(admin_client, pod256):
    node = Node.objects.get(cluster=pod256, name="node-009")
    page = admin_client.get(url(Node, "change", node.pk))
    formsets = {fs.formset.prefix: fs.formset for fs in page.context["inline_admin_formsets"]}
    assert formsets["gpus"].initial_form_count() == 8
    assert formsets["nics"].initial_form_count() == 8
    nic_choices = formsets["gpus"].forms[0].fields["nic"].queryset
    assert set(nic_choices) == set(node.nics.all())
    leaf_choices = formsets["nics"].forms[0].fields["leaf"].queryset
    assert sorted(s.name for s in leaf_choices) == ["leaf-1", "leaf-2", "leaf-3", "leaf-4"]


def node_form_data(node: Node) -> dict:
    """The POST data of a node's change form with its current values and inlines."""
    data = {
        "cluster": node.cluster_id,
        "name": node.name,
        "gpu_model": node.gpu_model_id,
        "dcgm_url": node.dcgm_url,
        "position": node.position,
    }
    for prefix, rows, fields in (
        ("nics", list(node.nics.all()), ["name", "leaf", "bw_GBps", "latency_us"]),
        ("gpus", list(node.gpus.all()), ["index", "domain", "nic"]),
    ):
        data.update({f"{prefix}-TOTAL_FORMS": len(rows), f"{prefix}-INITIAL_FORMS": len(rows)})
        data.update({f"{prefix}-MIN_NUM_FORMS": 0, f"{prefix}-MAX_NUM_FORMS": 1000})
        for i, row in enumerate(rows):
            data[f"{prefix}-{i}-id"] = row.pk
            data[f"{prefix}-{i}-node"] = node.pk
            for field in fields:
                value = (
                    getattr(row, f"{field}_id", None)
                    if field in ("leaf", "domain", "nic")
                    else getattr(row, field)
                )
                data[f"{prefix}-{i}-{field}"] = value
    return data


def test_saving_a_node_edits_its_nic_and_touches_the_cluster(admin_client, case44):
    node = Node.objects.get(cluster=case44, name="node-b")
    stamp = Cluster.objects.get(pk=case44.pk).updated_at
    data = node_form_data(node)
    data["nics-0-bw_GBps"] = 25
    response = admin_client.post(url(Node, "change", node.pk), data)
    assert response.status_code == 302, response.context["errors"]
    assert Nic.objects.get(node=node).bw_GBps == 25
    assert Cluster.objects.get(pk=case44.pk).updated_at > stamp


def test_invalid_inline_value_is_shown_on_the_form_and_nothing_changes(admin_client, case44):
    node = Node.objects.get(cluster=case44, name="node-a")
    data = node_form_data(node)
    data["nics-0-bw_GBps"] = -1
    response = admin_client.post(url(Node, "change", node.pk), data)
    assert response.status_code == 200
    assert "must be a positive number, got -1" in response.content.decode()
    assert Nic.objects.get(node=node).bw_GBps == 11


def test_gpu_pointed_at_another_nodes_nic_is_refused_on_the_form(admin_client, case44):
    gpu = Gpu.objects.get(node__cluster=case44, node__name="node-a", index=0)
    other_nic = Nic.objects.get(node__cluster=case44, node__name="node-b")
    data = {"node": gpu.node_id, "index": 0, "domain": gpu.domain_id, "nic": other_nic.pk}
    response = admin_client.post(url(Gpu, "change", gpu.pk), data)
    assert response.status_code == 200
    assert "is on node &#x27;node-b&#x27;, not on &#x27;node-a&#x27;" in response.content.decode()
    gpu.refresh_from_db()
    assert gpu.nic.node.name == "node-a"


def test_link_added_under_a_switch_takes_its_cluster(admin_client, pod256):
    leaf = Switch.objects.get(cluster=pod256, name="leaf-1")
    spine = Switch.objects.get(cluster=pod256, name="spine-1")
    links = list(leaf.links_as_a.all())
    data = {"name": leaf.name, "tier": leaf.tier, "position": leaf.position, "cluster": pod256.pk}
    data.update({"links_as_a-TOTAL_FORMS": len(links) + 1, "links_as_a-INITIAL_FORMS": len(links)})
    data.update({"links_as_a-MIN_NUM_FORMS": 0, "links_as_a-MAX_NUM_FORMS": 1000})
    for i, lk in enumerate([*links, None]):
        if lk is not None:
            data[f"links_as_a-{i}-id"] = lk.pk
        data[f"links_as_a-{i}-a"] = leaf.pk
        data[f"links_as_a-{i}-b"] = lk.b_id if lk else spine.pk
        data[f"links_as_a-{i}-bw_GBps"] = lk.bw_GBps if lk else 100
        data[f"links_as_a-{i}-latency_us"] = lk.latency_us if lk else 1
        data[f"links_as_a-{i}-position"] = lk.position if lk else 99
    response = admin_client.post(url(Switch, "change", leaf.pk), data)
    assert response.status_code == 302, response.context["errors"]
    added = Link.objects.get(a=leaf, position=99)
    assert (added.cluster_id, added.b_id, added.bw_GBps) == (pod256.pk, spine.pk, 100)


def validate(admin_client, *clusters) -> list[tuple[str, str]]:
    response = admin_client.post(
        url(Cluster, "changelist"),
        {"action": "validate_against_spec", "_selected_action": [c.pk for c in clusters]},
        follow=True,
    )
    assert response.status_code == 200
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


def test_validate_action_reports_a_valid_cluster(admin_client, case44):
    assert validate(admin_client, case44) == [("success", "case-4-4: valid against spec v1")]


def test_validate_action_reports_each_problem(admin_client, case44, pod256):
    Gpu.objects.filter(node__cluster=case44, node__name="node-a", index=7).update(nic=None)
    leaf = Switch.objects.get(cluster=pod256, name="leaf-2")
    Link.objects.filter(cluster=pod256, a=leaf).delete()
    messages = validate(admin_client, case44, pod256)
    assert (
        "error",
        "case-4-4: nodes[0].nics: GPUs [7] of node 'node-a' have no NIC (mark the node standalone: true if intended)",
    ) in messages
    assert (
        "error",
        "pod-256: links: leaf 'leaf-2' has no path to leaf 'leaf-1' through spines and cores",
    ) in messages


def test_bulk_delete_from_the_changelist_touches_the_cluster(admin_client, pod256):
    stamp = Cluster.objects.get(pk=pod256.pk).updated_at
    links = Link.objects.filter(cluster=pod256, a__name="leaf-4")
    admin_client.post(
        url(Link, "changelist"),
        {"action": "delete_selected", "_selected_action": [lk.pk for lk in links], "post": "yes"},
    )
    assert not Link.objects.filter(cluster=pod256, a__name="leaf-4").exists()
    assert Cluster.objects.get(pk=pod256.pk).updated_at > stamp


def test_a_large_clusters_form_links_to_its_switches_instead_of_listing_them(admin_client, pod256):
    from apps.topology.admin import INLINE_SWITCHES_MAX
    from apps.topology.services import cluster_import

    gen = {
        "shape": "leaf-spine",
        "spines": 4,
        "leaves": INLINE_SWITCHES_MAX + 4,
        "nodes_per_leaf": 1,
        "gpus_per_node": 8,
        "gpu_model": "H100",
        "peak_tflops": 989,
        "nvlink_bw_GBps": 450,
        "nic_bw_GBps": 50,
        "nics_per_node": 8,
        "uplink_bw_GBps": 400,
    }
    big = cluster_import(data={"version": 1, "name": "wide", "generate": gen})
    page = admin_client.get(url(Cluster, "change", big.pk)).content.decode()
    assert 'name="switches-0-name"' not in page  # no inline row per switch
    leaves = f"{url(Switch, 'changelist')}?cluster__id__exact={big.pk}&amp;tier__exact=leaf"
    assert f'<a href="{leaves}">{INLINE_SWITCHES_MAX + 4} leaf switches</a>' in page
    assert f"?cluster__id__exact={big.pk}&amp;tier__exact=spine" in page
    # A small cluster still edits its switches inline.
    small = admin_client.get(url(Cluster, "change", pod256.pk)).content.decode()
    assert 'name="switches-0-name"' in small


@pytest.mark.parametrize("value", ["1e308", "2e6", "0.001"])
def test_the_node_form_refuses_a_bandwidth_outside_the_import_range(admin_client, case44, value):
    node = Node.objects.get(cluster=case44, name="node-a")
    data = node_form_data(node)
    data["nics-0-bw_GBps"] = value
    response = admin_client.post(url(Node, "change", node.pk), data)
    assert response.status_code == 200
    assert "must be between 0.01 and 1e+06 GB/s, as in a topology file" in response.content.decode()
    assert Nic.objects.get(node=node).bw_GBps == 11


def test_the_gpu_model_form_refuses_a_peak_of_1e308(admin_client, case44):
    model = GpuModel.objects.filter(cluster=case44).first()
    before = model.peak_tflops
    data = {"cluster": case44.pk, "name": model.name, "peak_tflops": "1e308"}
    response = admin_client.post(url(GpuModel, "change", model.pk), data)
    assert response.status_code == 200
    assert "must be between 0 and 100000 TFLOPS" in response.content.decode()
    model.refresh_from_db()
    assert model.peak_tflops == before
    # The cluster still plans and its page still answers.
    assert admin_client.get(f"/clusters/{case44.name}/").status_code == 200


def test_a_latency_past_a_second_is_refused_by_the_model_too(case44):
    from django.core.exceptions import ValidationError

    link_nic = Nic.objects.filter(node__cluster=case44).first()
    link_nic.latency_us = 1e308
    with pytest.raises(ValidationError) as err:
        link_nic.full_clean()
    assert "latency_us" in err.value.message_dict
