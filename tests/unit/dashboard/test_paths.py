"""The path view: hops that add up to the core's path model, endpoint parsing, the leaf matrix,
and the JSON views with their 400s."""

import re

import pytest

from apps.dashboard.layout import cluster_layout
from apps.dashboard.paths import EndpointError, endpoints_path, gpu_path, leaf_matrix, parse_endpoint
from apps.placement.topology import load_topology

from .conftest import generated


@pytest.fixture(scope="module")
def two_pods():
    spec = generated("leaf-spine", leaves=4, nodes_per_leaf=2, spines=4, pods=2, cores=2)
    return cluster_layout(load_topology(spec))


@pytest.mark.parametrize(
    ("g", "h", "levels"),
    [(0, 5, ["nvlink"]), (0, 8, ["leaf", "leaf"]), (0, 16, ["leaf", "spine", "spine", "leaf"])],
)
def test_hops_add_up_to_the_core_path(leafspine, g, h, levels):
    lay = cluster_layout(leafspine)
    out = gpu_path(lay, g, h)
    path = leafspine.path(g, h)
    assert [hop["level"] for hop in out["hops"]] == levels
    assert min(hop["bw_GBps"] for hop in out["hops"]) == pytest.approx(path.bw_GBps)
    assert sum(hop["latency_us"] for hop in out["hops"]) == pytest.approx(path.latency_us)
    assert out["bw_GBps"] == pytest.approx(path.bw_GBps)
    assert out["hops"][out["bottleneck"]]["bw_GBps"] == pytest.approx(path.bw_GBps)


def test_a_path_across_pods_climbs_to_a_core_and_names_each_uplink(two_pods):
    topo = two_pods.topology
    g, h = 0, topo.n_gpus - 1
    out = gpu_path(two_pods, g, h)
    assert [hop["level"] for hop in out["hops"]] == ["leaf", "spine", "core", "core", "spine", "leaf"]
    assert sum(hop["latency_us"] for hop in out["hops"]) == pytest.approx(topo.path(g, h).latency_us)
    # Each switch hop is a drawn uplink, each end a NIC cable.
    assert "nic" in out["hops"][0]["link"] and "nic" in out["hops"][-1]["link"]
    assert all(hop["link"]["uplink"] is not None for hop in out["hops"][1:-1])
    assert out["hops"][2]["to"].startswith("core")


def test_node_to_node_pairs_gpus_of_the_same_index(rail):
    lay = cluster_layout(rail)
    a = parse_endpoint(rail, "a", rail.nodes[0].name)
    b = parse_endpoint(rail, "b", rail.nodes[-1].name)
    out = endpoints_path(lay, a, b)
    assert len(out["pairs"]) == rail.nodes[0].gpus
    assert [p["a"].split(" GPU ")[1] for p in out["pairs"]] == [
        p["b"].split(" GPU ")[1] for p in out["pairs"]
    ]
    assert out["bw_GBps"] == min(p["bw_GBps"] for p in out["pairs"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "give a node name"),
        ("nope", "no node named 'nope'"),
        ("node-001:99", "not 99"),
        ("a b", "expected"),
    ],
)
def test_bad_endpoints_name_the_problem(leafspine, text, message):
    with pytest.raises(EndpointError) as e:
        parse_endpoint(leafspine, "b", text)
    assert e.value.field == "b" and message in str(e.value)


def test_leaf_matrix_lists_every_node_pair_under_the_leaf(leafspine):
    out = leaf_matrix(cluster_layout(leafspine), "leaf-1")
    assert out["nodes"] == ["node-001", "node-002"]
    assert out["level"] == [["nvlink", "leaf"], ["leaf", "nvlink"]]
    assert out["bw_GBps"][0][1] == 50 and out["bw_GBps"][0][0] == 450
    assert out["truncated"] is False


def test_path_view_answers_json_and_400s_naming_the_field(client, people, case44_db):
    client.force_login(people["alice"])
    ok = client.get("/clusters/case-4-4/path/", {"a": "node-a:0", "b": "node-b:1"})
    assert ok.status_code == 200
    body = ok.json()
    assert body["a"] == "node-a GPU 0" and body["hops"] and body["bottleneck"] is not None
    bad = client.get("/clusters/case-4-4/path/", {"a": "node-a:0", "b": "x" * 500})
    assert bad.status_code == 400 and "b" in bad.json()
    matrix = client.get("/clusters/case-4-4/leaf-matrix/", {"leaf": "nope"})
    assert matrix.status_code == 400 and "leaf" in matrix.json()
    assert client.get("/clusters/nope/path/", {"a": "x", "b": "y"}).status_code == 404


def test_measured_link_values_map_nic_counters_to_the_graphs_nic_numbers(client, people, case44_db):
    from django.utils import timezone

    from apps.metrics.models import NicLatest
    from apps.topology.models import Node

    now = timezone.now()
    node_b = Node.objects.get(cluster=case44_db, name="node-b")
    NicLatest.objects.create(node=node_b, device="mlx5_0", port="1", at=now, tx_Bps=5.5e9)
    NicLatest.objects.create(node=node_b, device="mlx5_0", port="2", at=now, tx_Bps=0.5e9)
    client.force_login(people["alice"])
    body = client.get("/clusters/case-4-4/measured/").json()
    # node-b's one NIC is NIC number 1 (node-a's is 0); its two ports add up, in GB/s.
    assert body["nic_GBps"] == {"1": 6.0}
    assert body["leaf_uplink"] == {}  # one leaf, no uplinks


@pytest.mark.django_db
def test_the_job_page_links_to_a_path_between_two_of_its_gpus_the_cluster_page_fills_in(
    client, people, naive_case44
):
    client.force_login(people["alice"])
    html = client.get(f"/jobs/{naive_case44.pk}/").content.decode()
    # The naive placement spans both nodes: rank 0's GPU and the first rank on the other node.
    link = re.search(
        r'id="job-path"><a href="([^"]+)">Path between rank 0 \((node-\w:\d)\) and rank (\d+)', html
    )
    assert link is not None
    url, a = link.group(1).replace("&amp;", "&"), link.group(2)
    assert url.startswith("/clusters/case-4-4/?path_a=") and "&path_b=node-" in url
    page = client.get(url).content.decode()
    assert 'id="path-a" name="a"' in page and f'value="{a}"' in page
    b = re.search(r"path_b=([^&#]+)", url).group(1).replace("%3A", ":")
    assert b.split(":")[0] != a.split(":")[0] and f'value="{b}"' in page
    # Anything but a node[:gpu] is not put in the form.
    page = client.get('/clusters/case-4-4/?path_a="><script>&path_b=node-a:99999').content.decode()
    assert (
        'id="path-a" name="a" type="text" list="node-names" placeholder="node or node:gpu" maxlength="200" required value=""'
        in page
    )
    assert "<script>&" not in page and 'value="node-a:99999"' not in page
