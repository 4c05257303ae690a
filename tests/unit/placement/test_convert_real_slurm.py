"""Slurm files as sites have them: a topology.yaml whose default is not the GPU fabric, block
files of NVL72 UltraServers, trees mixing CPU and GPU nodes with slurm.conf / gres.conf beside
them, GPU counts by hostlist; each checked for nodes, GPUs, NVLink domains and a TP8 placement."""

from __future__ import annotations

import pytest

from apps.placement.convert import Defaults
from apps.placement.topology import SpecError

from .realfiles import convert, domain_sizes, tp8_domains


def test_topology_yaml_imports_the_gpu_fabric_and_warns_that_the_default_is_not_it():
    imported, topo = convert("slurm-yaml", "slurm-multi-topology.yaml")
    notes = " ".join(imported.notes)
    assert "holds ethernet (tree), infiniband (tree), nvl72 (block), everything (flat)" in notes
    assert "warning: the cluster default topology 'ethernet' is not the GPU fabric" in notes
    assert sorted(s.name for s in topo.switches) == ["ib-leaf1", "ib-leaf2", "ib-spine"]
    assert len(topo.nodes) == 36 and not any(n.name.startswith("cpu") for n in topo.nodes)


def test_topology_yaml_keeps_the_block_topology_as_nvlink_domains_of_nvl72_racks():
    imported, topo = convert("slurm-yaml", "slurm-multi-topology.yaml")
    assert {n.gpus for n in topo.nodes} == {4}
    assert domain_sizes(topo) == [72, 72]
    assert sorted(topo.domains) == ["rack1", "rack2"]
    assert topo.domains["rack1"].bw_GBps == 900.0
    assert any("kept as NVLink domains: 2 blocks" in n for n in imported.notes)
    assert any("taken as GB200 NVL72 racks" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_topology_yaml_imports_the_default_when_asked():
    imported, topo = convert("slurm-yaml", "slurm-multi-topology.yaml", topology="ethernet")
    assert [s.name for s in topo.switches] == ["eth-sw1"] and len(topo.nodes) == 40
    assert not any("warning" in n for n in imported.notes)
    with pytest.raises(SpecError, match=r"is flat: it lists no switches or nodes; the others: ethernet"):
        convert("slurm-yaml", "slurm-multi-topology.yaml", topology="everything")


def test_slurm_conf_gres_gives_gpus_per_node_and_leaves_cpu_nodes_out():
    imported, topo = convert(
        "slurm-yaml", "slurm-multi-topology.yaml", "slurm-gb200.slurm.conf", topology="ethernet"
    )
    assert len(topo.nodes) == 36 and {n.gpus for n in topo.nodes} == {4}
    assert any("4 nodes without GPUs left out: cpu[01-04]" in n for n in imported.notes)
    assert not any("GPUs per node assumed" in n for n in imported.notes)


def test_gres_conf_counts_device_files_and_leaves_undescribed_nodes_out():
    imported, topo = convert("slurm-tree", "slurm-tree-mixed.conf", "slurm-tree-mixed.gres.conf")
    gpus = {n.name: n.gpus for n in topo.nodes}
    assert len(gpus) == 13 and gpus["gpu001"] == 4 and gpus["gpu009"] == 2
    notes = " ".join(imported.notes)
    assert "25 nodes without GPUs in the node descriptions given left out" in notes
    assert "1 gpu lines without NodeName=" in notes
    # Each node is its own NVLink domain: a TP4 box holds no TP8, so the job spans two domains.
    assert domain_sizes(topo)[0] == 4


def test_gpus_by_hostlist_set_counts_and_zero_leaves_nodes_out():
    imported, topo = convert(
        "slurm-tree",
        "slurm-tree-mixed.conf",
        **{"gpus[gpu[001-013]]": 8, "gpus[hpc[001-019],submit[1-2],master[1-2],xf11id-srv[2-3]]": 0},
    )
    assert len(topo.nodes) == 13 and {n.gpus for n in topo.nodes} == {8}
    assert any("25 nodes without GPUs left out" in n for n in imported.notes)
    assert not any("GPUs per node assumed" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_nics_by_hostlist():
    _, topo = convert(
        "slurm-tree", "slurm-tree-mixed.conf", "slurm-tree-mixed.gres.conf", **{"nics[gpu[001-008]]": 4}
    )
    nics = {n.name: len(n.nics) for n in topo.nodes}
    assert nics["gpu001"] == 4 and nics["gpu009"] == 1


def test_a_bad_per_host_value_names_the_key():
    with pytest.raises(SpecError) as exc:
        Defaults.from_mapping({"gpus[gpu[1-2]]": "many"})
    assert exc.value.errors[0][0] == "defaults.gpus[gpu[1-2]]"
    with pytest.raises(SpecError, match="bad hostlist"):
        Defaults.from_mapping({"gpus[gpu[2-1]]": 4})


def test_ultraserver_blocks_are_72_gpu_nvlink_domains_with_topograph_names():
    imported, topo = convert("slurm-block", "slurm-block-ultraservers.conf")
    assert len(topo.nodes) == 36 and {n.gpus for n in topo.nodes} == {4}
    assert sorted(topo.domains) == ["us-east-1a.ultraserver-0a1b", "us-east-1a.ultraserver-2c3d"]
    assert domain_sizes(topo) == [72, 72]
    assert tp8_domains(topo) == 1
    assert any("names taken from the file's comments" in n for n in imported.notes)


def test_the_gpu_count_given_overrides_the_nvl72_guess():
    _, topo = convert("slurm-block", "slurm-block-ultraservers.conf", gpus_per_node=8)
    assert {n.gpus for n in topo.nodes} == {8} and domain_sizes(topo) == [144, 144]


def test_two_topology_files_are_refused():
    with pytest.raises(SpecError, match="takes one topology file"):
        convert("slurm-tree", "slurm-tree-mixed.conf", "slurm-block-ultraservers.conf")


def test_a_bad_gres_count_names_its_line():
    from apps.placement.convert import Source, import_sources

    conf = "SwitchName=s0 Nodes=gpu[1-2]\n"
    gres = "# gres\nNodeName=gpu[1-2] Name=gpu Count=lots\n"
    with pytest.raises(SpecError) as exc:
        import_sources("slurm-tree", [Source("topology.conf", conf), Source("gres.conf", gres)])
    assert exc.value.errors[0][0] == "gres.conf:2" and "Count" in exc.value.errors[0][1]


def test_many_large_hostlists_in_a_node_file_are_refused_at_the_budget():
    import time

    from apps.placement.convert import Source, import_sources

    gres = "".join(f"NodeName=n[1-90000] Name=gpu File=/dev/nvidia{k}\n" for k in range(2000))
    started = time.thread_time()  # CPU time: the work done, not the wait for a core on a busy machine
    with pytest.raises(SpecError) as exc:
        import_sources(
            "slurm-tree", [Source("topology.conf", "SwitchName=s Nodes=n1\n"), Source("gres.conf", gres)]
        )
    # Refused at the fifth of 2,000 lines: the work stops at the budget (a loose bound: CI is shared).
    where, message = exc.value.errors[0]
    assert where == "gres.conf:5" and "more than 400000 nodes in all" in message
    assert time.thread_time() - started < 30


def test_a_flat_cluster_default_is_passed_over_with_a_warning_naming_it():
    from apps.placement.convert import Source, import_sources

    text = (
        "- topology: flat1\n  cluster_default: true\n  flat: true\n"
        "- topology: ib\n  tree:\n    switches:\n    - switch: s0\n      nodes: node[1-2]\n"
    )
    imported = import_sources("slurm-yaml", [Source("topology.yaml", text)])
    assert [n["name"] for n in imported.spec["nodes"]] == ["node1", "node2"]
    assert any("'flat1' is not the GPU fabric (it is flat)" in n for n in imported.notes)
    only_flat = "- topology: a\n  flat: true\n- topology: b\n  flat: true\n"
    with pytest.raises(SpecError, match=r"every topology is flat \(a \(flat\), b \(flat\)\)"):
        import_sources("slurm-yaml", [Source("topology.yaml", only_flat)])
