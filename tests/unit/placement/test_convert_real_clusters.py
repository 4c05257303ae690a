"""topograph models in every documented form, NVL72 racks as NVLink domains spanning nodes, and
Kubernetes node lists with block or rack labels only: nodes, GPUs, NVLink domains, NIC
affinity and a TP8 placement checked on each."""

from __future__ import annotations

import pytest

from apps.placement.convert import Defaults, Source, import_sources
from apps.placement.topology import SpecError

from .realfiles import SAMPLES, convert, domain_sizes, nic_gpus, tp8_domains

MODELS = SAMPLES / "topograph_models"


def test_topograph_nvl72_model_is_18_trays_of_4_gpus_per_72_gpu_domain():
    imported, topo = convert("topograph", "nvl72.yaml", data=MODELS)
    assert len(topo.nodes) == 72 and {n.gpus for n in topo.nodes} == {4}
    assert domain_sizes(topo) == [72, 72, 72, 72]
    assert {d.bw_GBps for d in topo.domains.values()} == {900.0}
    assert {len(d.nodes) for d in topo.domains.values()} == {18}
    assert any("GB200 NVL72 racks" in n for n in imported.notes)
    assert all(nic_gpus(n) == {"mlx5_0": (0, 1, 2, 3)} for n in topo.nodes)
    assert tp8_domains(topo) == 1


def test_topograph_capacity_blocks_form_gives_domains_from_attributes_and_blocks():
    imported, topo = convert("topograph", "topograph-capacity-blocks.yaml")
    assert len(topo.nodes) == 37
    # cb-rack1 by its attributes.nvlink, cb-rack2 by its id, spare01 by its own attributes.
    assert sorted(topo.domains) == ["cb-rack2", "nvl72-rack1", "spare-partition"]
    assert domain_sizes(topo) == [72, 72, 8]
    assert {s.name: s.tier for s in topo.switches}["spine-a"] == "spine"
    assert {s.name: s.tier for s in topo.switches}["core"] == "core"
    assert any(
        "GPUs per node assumed (gpus_per_node, not in the input): 1 nodes" in n for n in imported.notes
    )
    assert tp8_domains(topo) == 1


def test_topograph_annotated_node_form_imports_nodes_without_switches():
    imported, topo = convert("topograph", "topograph-annotated-nodes.yaml", gpus_per_node=8)
    assert [n.name for n in topo.nodes] == ["n1", "n2", "n3"]
    assert sorted(domain_sizes(topo)) == [8, 16]
    assert [s.name for s in topo.switches] == ["leaf-unswitched"]
    assert any("3 nodes on no switch" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_topograph_conflicting_capacity_blocks_name_the_node():
    text = "capacity_blocks:\n  cb1:\n    nodes: [n1]\nnodes:\n  n1:\n    capacity_block: cb2\n"
    with pytest.raises(SpecError) as exc:
        import_sources("topograph", [Source("m.yaml", text)])
    where, message = exc.value.errors[0]
    assert where == "m.yaml:6" and "capacity block 'cb2' here but in 'cb1'" in message


def test_topograph_accelerated_domain_annotations_name_the_innermost_domain():
    text = (
        "switches:\n  leaf:\n    switches: []\n"
        'blocks:\n- switch: leaf\n  nodes: ["t[1-4]"]\n  annotations:\n'
        "    accelerated.topology.nvidia.com/domain-1: rack-7\n"
        "    accelerated.topology.nvidia.com/domain-0: rack-7.part-a\n"
    )
    topo = import_sources("topograph", [Source("m.yaml", text)]).topology()
    assert list(topo.domains) == ["rack-7.part-a"] and len(topo.domains["rack-7.part-a"].nodes) == 4


def test_gke_nodes_with_block_labels_only_import_with_the_block_as_leaf():
    imported, topo = convert("kueue", "k8s-gke-block-labels-only.json")
    assert len(topo.nodes) == 8 and {n.gpus for n in topo.nodes} == {8}
    assert sorted(s.name for s in topo.switches if s.tier == "leaf") == ["block-0", "block-1"]
    assert domain_sizes(topo) == [8] * 8
    assert {n.gpu_model for n in topo.nodes} == {"nvidia-h100-mega-80gb"}
    assert any("from cloud.google.com/gce-topology-block up" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_rack_labels_and_cliques_give_racks_as_leaves_and_multi_node_domains():
    imported, topo = convert("kueue", "k8s-rack-labels-only.yaml")
    assert len(topo.nodes) == 8 and {n.gpus for n in topo.nodes} == {4}
    assert sorted(s.name for s in topo.switches if s.tier == "leaf") == ["rack-0", "rack-1"]
    assert domain_sizes(topo) == [16, 16]
    assert any("450 GB/s NVLink per GPU assumed" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_topograph_level_labels_and_accelerated_domains_import():
    nodes = [
        {
            "kind": "Node",
            "metadata": {
                "name": f"node10{i}",
                "labels": {
                    "network.topology.nvidia.com/level-0": "S2" if i < 2 else "S3",
                    "network.topology.nvidia.com/level-1": "S1",
                    "accelerated.topology.nvidia.com/level-0": "B1",
                },
            },
        }
        for i in range(4)
    ]
    import json

    source = Source("nodes.json", json.dumps({"items": nodes}))
    topo = import_sources("kueue", [source], Defaults.from_mapping({"gpus_per_node": 4})).topology()
    assert {s.name: s.tier for s in topo.switches} == {"S2": "leaf", "S3": "leaf", "S1": "spine"}
    assert list(topo.domains) == ["B1"] and domain_sizes(topo) == [16]
    assert tp8_domains(topo) == 1
