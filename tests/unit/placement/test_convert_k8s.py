"""Kubernetes and topograph formats: Kueue Topology and node labels, label import, topograph
models in and graph JSON out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from apps.placement.convert import Defaults, Source, export_topology, import_sources
from apps.placement.topology import SpecError, load_topology
from tests.unit.placement.specs import generated, switch_node_sets

SAMPLES = Path(__file__).parent / "convert_samples" / "topograph_models"


def _kubectl(nodes: dict[str, dict[str, str]]) -> str:
    items = [{"kind": "Node", "metadata": {"name": n, "labels": labels}} for n, labels in nodes.items()]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2)


def test_kueue_export_has_levels_top_down_and_labels_per_node():
    topo = load_topology(
        generated(spines=2, leaves=2, nodes_per_leaf=2, nvlink_domain_nodes=2, nics_per_node=1)
    )
    docs = list(yaml.safe_load_all(export_topology("kueue", topo)))
    assert docs[0]["kind"] == "Topology"
    assert [lv["nodeLabel"] for lv in docs[0]["spec"]["levels"]] == [
        "network.topology.nvidia.com/spine",
        "network.topology.nvidia.com/leaf",
        "network.topology.nvidia.com/accelerator",
        "kubernetes.io/hostname",
    ]
    labels = docs[1]["metadata"]["labels"]
    assert labels["network.topology.nvidia.com/leaf"] == "leaf-1"
    assert labels["network.topology.nvidia.com/accelerator"] == "node-001"
    assert len(docs) == 1 + len(topo.nodes)


def test_kueue_manifests_import_back_to_the_same_cluster_shape():
    topo = load_topology(
        generated(spines=2, leaves=3, nodes_per_leaf=2, nvlink_domain_nodes=2, nics_per_node=1)
    )
    back = import_sources("kueue", [Source("labels.yaml", export_topology("kueue", topo))]).topology()
    assert switch_node_sets(back) == switch_node_sets(topo)
    assert {d: set(v.nodes) for d, v in back.domains.items()} == {
        d: set(v.nodes) for d, v in topo.domains.items()
    }
    assert back.n_gpus == topo.n_gpus


@pytest.mark.parametrize(
    ("leaf", "up", "family"),
    [
        ("cloud.google.com/gce-topology-host", "cloud.google.com/gce-topology-subblock", "GKE"),
        ("topology.k8s.aws/network-node-layer-3", "topology.k8s.aws/network-node-layer-2", "AWS"),
        ("network.topology.nvidia.com/leaf", "network.topology.nvidia.com/spine", "topograph"),
    ],
)
def test_node_labels_of_each_family_import_with_cliques_as_nvlink_domains(leaf, up, family):
    nodes = {
        f"n{i}": {
            leaf: f"h{i // 2}",
            up: "b0",
            "nvidia.com/gpu.clique": f"uuid.{i // 2}",
            "nvidia.com/gpu.count": "4",
        }
        for i in range(4)
    }
    imported = import_sources("kueue", [Source("nodes.json", _kubectl(nodes))])
    topo = imported.topology()
    assert switch_node_sets(topo)["leaf"] == {frozenset({"n0", "n1"}), frozenset({"n2", "n3"})}
    assert sorted(topo.domains) == ["uuid.0", "uuid.1"]
    assert topo.n_gpus == 16
    assert family in imported.notes[0]


def test_a_node_without_topology_labels_is_named_with_its_line():
    text = _kubectl({"a": {"network.topology.nvidia.com/leaf": "l1"}, "b": {"kubernetes.io/hostname": "b"}})
    with pytest.raises(SpecError) as exc:
        import_sources("kueue", [Source("nodes.json", text)])
    where, message = exc.value.errors[0]
    assert "node 'b' has no topology label" in message
    # The error points at the line of node b's name.
    line = int(where.split(":")[1])
    assert text.splitlines()[line - 1].strip() == '"name": "b",'


@pytest.mark.parametrize("model", sorted(p.name for p in SAMPLES.glob("*.yaml")))
def test_every_topograph_model_imports(model):
    imported = import_sources("topograph", [Source(model, (SAMPLES / model).read_text())])
    topo = imported.topology()
    # NVL72 racks (18-node NVLink domains) have 4 GPUs per node; other nodes the default 8.
    per_node = 4 if model == "nvl72.yaml" else 8
    assert topo.n_gpus == per_node * len(topo.nodes) > 0
    assert any(len(d.nodes) > 1 for d in topo.domains.values())


def test_topograph_irregular_model_leaves_out_empty_racks():
    model = "dual-xclr-irregular.yaml"
    imported = import_sources("topograph", [Source(model, (SAMPLES / model).read_text())])
    topo = imported.topology()
    assert "rack-1-03" not in {s.name for s in topo.switches}
    assert any("rack-1-03" in n for n in imported.notes)
    # sw-01: 13 full racks and rack-1-04 with 7 nodes; sw-02: 14 full racks and rack-2-15 with 5.
    assert len(topo.nodes) == 13 * 9 + 7 + 14 * 9 + 5


def test_topograph_graph_json_nests_switches_down_to_nodes():
    model = "medium.yaml"
    topo = import_sources("topograph", [Source(model, (SAMPLES / model).read_text())]).topology()
    graph = json.loads(export_topology("topograph", topo))
    core = graph["tiers"]["vertices"]["sw3"]
    assert set(core["vertices"]) == {"sw21", "sw22"}
    assert set(core["vertices"]["sw21"]["vertices"]["sw11"]["vertices"]) == {"1101", "1102"}
    assert graph["domains"]["nvl1"] == ["1101", "1102"]


def test_topograph_errors_name_the_line():
    text = "switches:\n  s1:\n    switches: [s2]\nblocks:\n- switch: s2\n  nodes: ['n[1-']\n"
    with pytest.raises(SpecError) as exc:
        import_sources("topograph", [Source("m.yaml", text)], Defaults())
    assert exc.value.errors[0][0] == "m.yaml:5"


def test_yaml_aliases_are_refused():
    text = "switches:\n  s1: &a {switches: [s2]}\n  s3: *a\nblocks: []\n"
    with pytest.raises(SpecError, match="aliases"):
        import_sources("topograph", [Source("m.yaml", text)])


def test_nodes_labelled_with_nvlink_cliques_only_share_one_leaf_with_a_note():
    nodes = {
        f"gb{i}": {"nvidia.com/gpu.clique": f"c.{i // 2}", "nvidia.com/gpu.count": "4"} for i in range(4)
    }
    imported = import_sources("kueue", [Source("nodes.json", _kubectl(nodes))])
    topo = imported.topology()
    assert [s.name for s in topo.switches] == ["leaf-1"]
    assert sorted(topo.domains) == ["c.0", "c.1"]
    assert any("no network labels" in n for n in imported.notes)
