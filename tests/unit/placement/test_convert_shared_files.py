"""The real files of the shared data set whose licence keeps them out of the repository (Slurm
documentation, site files, vendor NCCL files): read from /work/shared/data when it is present."""

from __future__ import annotations

from pathlib import Path

import pytest

from .realfiles import convert, domain_sizes, nic_gpus, tp8_domains

SHARED = Path("/work/shared/data")
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared data set is not here")
TOPOLOGY, SLURM = SHARED / "topology", SHARED / "slurm"


def test_azure_ndv4_file_says_it_has_no_nvlink_and_takes_the_a100_table_when_named():
    name = "nccl_topo_Azure-NDv4-A100_azhpc-images.xml"
    imported, topo = convert("nccl-xml", name, data=TOPOLOGY)
    assert any("this file has no NVLink information" in n for n in imported.notes)
    assert topo.nodes[0].intra is not None
    imported, topo = convert("nccl-xml", name, data=TOPOLOGY, gpu_model="A100-SXM4-80GB")
    node = topo.nodes[0]
    assert node.gpus == 8 and domain_sizes(topo) == [8]
    assert topo.domains[node.domain].bw_GBps == 300.0
    # Each GPU uses the NIC under its own PCIe bridge (2 GPUs and 2 NICs per bridge).
    assert sorted(len(g) for g in nic_gpus(node).values()) == [1] * 8
    assert tp8_domains(topo) == 1


def test_dgx1_pcie_view_gets_the_hybrid_cube_mesh_from_its_gpu_model():
    name = "nvidia-smi-topo-mp_DGX-1-V100_8gpu_4nic_pcie-view.txt"
    imported, topo = convert("nvidia-smi", name, data=TOPOLOGY, gpu_model="V100-SXM2-32GB")
    assert any("V100-SXM2-32GB" in n and "cube-mesh" in n for n in imported.notes)
    assert topo.path(0, 3).bw_GBps == 50.0 and topo.path(0, 1).bw_GBps == 25.0
    assert topo.path(0, 5).bw_GBps < 25.0
    assert nic_gpus(topo.nodes[0]) == {f"mlx5_{k}": (2 * k, 2 * k + 1) for k in range(4)}


def test_hgx_h200_matrix_keeps_eight_rails_and_leaves_the_storage_nics_out():
    imported, topo = convert("nvidia-smi", "nvidia-smi-topo-m_HGX-H200_8gpu_12nic.txt", data=TOPOLOGY)
    node = topo.nodes[0]
    assert len(node.nics) == 8 and all(len(g) == 1 for g in nic_gpus(node).values())
    assert topo.domains[node.domain].bw_GBps == 450.0
    assert tp8_domains(topo) == 1


def test_the_slurm_manual_topology_yaml_keeps_its_blocks_as_domains():
    imported, topo = convert("slurm-yaml", "slurm_docs_topology.yaml.5_example.yaml", data=SLURM)
    assert len(topo.nodes) == 4 and list(topo.domains) == ["b1"]
    assert any("holds topo1 (tree), topo2 (block), topo3 (flat)" in n for n in imported.notes)


def test_a_mixed_site_file_with_cpu_nodes_given_zero_gpus():
    imported, topo = convert(
        "slurm-tree",
        "real_topology.conf_maatthias_slurm-cluster.conf",
        data=SLURM,
        **{"gpus[gpu[001-013]]": 4, "gpus[hpc[001-019],submit[1-2],master[1-2],xf11id-srv[2-3],saturn4]": 0},
    )
    assert len(topo.nodes) == 13 and {n.gpus for n in topo.nodes} == {4}
    assert any("26 nodes without GPUs left out" in n for n in imported.notes)
