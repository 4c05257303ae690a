"""Node-level formats: `nvidia-smi topo -m` matrices and NCCL topology XML, merged into clusters."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.placement.convert import Defaults, Source, import_sources
from apps.placement.convert.nccl import parse_nccl
from apps.placement.convert.nvsmi import parse_matrix
from apps.placement.topology import SpecError

SAMPLES = Path(__file__).parent / "convert_samples"
SHARED = Path("/work/shared/data/topology")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared topology samples are not here")

SMALL = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tNV2\tPIX\tSYS\tPIX\tSYS\t0-7\t0\n"
    "GPU1\tNV2\t X \tPHB\tSYS\tPHB\tSYS\t0-7\t0\n"
    "GPU2\tPIX\tPHB\t X \tSYS\tPIX\tSYS\t0-7\t0\n"
    "GPU3\tSYS\tSYS\tSYS\t X \tSYS\tPIX\t8-15\t1\n"
    "NIC0\tPIX\tPHB\tPIX\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tSYS\tPIX\tSYS\t X \n"
    "\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
)


def test_matrix_gives_pair_classes_nic_names_and_numa():
    hw = parse_matrix(Source("box.txt", SMALL))
    assert hw.name == "box" and hw.gpus == 4
    assert hw.pairs[(0, 1)] == "NV2" and hw.pairs[(1, 2)] == "PHB" and hw.pairs[(3, 0)] == "SYS"
    assert hw.nics == ["mlx5_0", "mlx5_1"]
    assert hw.nic_class[("mlx5_1", 3)] == "PIX"
    assert hw.numa == {0: "0", 1: "0", 2: "0", 3: "1"}


def test_each_gpu_uses_its_nearest_nic():
    imported = import_sources("nvidia-smi", [Source("box.txt", SMALL)])
    topo = imported.topology()
    assert {n.name: n.gpus for n in topo.nodes[0].nics} == {"mlx5_0": (0, 1, 2), "mlx5_1": (3,)}
    assert topo.nodes[0].nics[1].leaf == "leaf-2"


def test_an_asymmetric_matrix_is_refused_at_its_line():
    bad = SMALL.replace("GPU2\tPIX\tPHB", "GPU2\tPIX\tPXB")
    with pytest.raises(SpecError) as exc:
        parse_matrix(Source("box.txt", bad))
    assert exc.value.errors[0][0] == "box.txt:3"
    assert "symmetric" in exc.value.errors[0][1]


def test_an_unknown_link_class_is_refused_at_its_line():
    with pytest.raises(SpecError) as exc:
        parse_matrix(Source("box.txt", SMALL.replace("GPU3\tSYS\tSYS\tSYS", "GPU3\tSYS\tSYS\tFOO")))
    assert exc.value.errors[0][0] == "box.txt:5"


def test_several_files_merge_into_one_cluster_named_per_file():
    sources = [Source("a.txt", SMALL, node="gpu-a"), Source("b.txt", SMALL, node="gpu-b")]
    topo = import_sources("nvidia-smi", sources, Defaults.from_mapping({"name": "lab"})).topology()
    assert topo.name == "lab" and [n.name for n in topo.nodes] == ["gpu-a", "gpu-b"]
    assert topo.path(0, 4).level == "leaf"
    with pytest.raises(SpecError, match="already described"):
        import_sources("nvidia-smi", [Source("a.txt", SMALL), Source("x/a.txt", SMALL)])


def test_nccl_xml_gives_nvswitch_links_nic_speed_and_affinity():
    source = Source("simai.xml", (SAMPLES / "nccl_topo_8xA100_4xCX6_aliyun_SimAI.xml").read_text())
    hw = parse_nccl(source, Defaults())
    assert hw.gpus == 8
    assert hw.pairs[(0, 7)] == "NV12"
    assert hw.nic_bw_GBps["mlx5_bond_1"] == 25.0
    imported = import_sources("nccl-xml", [source])
    topo = imported.topology()
    assert {n.name: n.gpus for n in topo.nodes[0].nics}["mlx5_bond_1"] == (0, 1)
    assert topo.domains["simai"].bw_GBps == 12 * 25.0
    assert any("mlx5_bond_0" in n for n in imported.notes)


def test_nccl_xml_refuses_entities_and_reports_the_line_of_bad_xml():
    with pytest.raises(SpecError, match="DOCTYPE"):
        parse_nccl(Source("x.xml", '<!DOCTYPE x [<!ENTITY a "aaaa">]>\n<system>&a;</system>'), Defaults())
    with pytest.raises(SpecError) as exc:
        parse_nccl(Source("x.xml", "<system>\n<cpu>\n</system>"), Defaults())
    assert exc.value.errors[0][0] == "x.xml:3"


@needs_shared
@pytest.mark.parametrize(
    ("name", "fmt", "nics", "nvlink_GBps"),
    [
        ("nvidia-smi-topo-m_DGX-A100_8gpu_12nic.txt", "nvidia-smi", 8, 300.0),
        ("nvidia-smi-topo-m_HGX-H200_8gpu_12nic.txt", "nvidia-smi", 8, 450.0),
        ("nvidia-smi-topo-m_8x-RTX4090-PCIe_2nic.txt", "nvidia-smi", 2, None),
        ("nvidia-smi-topo-mp_DGX-1-V100_8gpu_4nic_pcie-view.txt", "nvidia-smi", 4, None),
        ("nccl_topo_8xA100_4xCX6_aliyun_SimAI.xml", "nccl-xml", 4, 300.0),
        ("nccl_topo_Azure-NDv4-A100_azhpc-images.xml", "nccl-xml", 8, None),
        ("nccl_topo_Azure-NDv5-H100_azhpc-images.xml", "nccl-xml", 8, None),
        ("nccl_topo_IBM-Cloud-gx3d-8xH100_8xCX7-200G.xml", "nccl-xml", 8, 450.0),
    ],
)
def test_every_shared_node_sample_imports(name, fmt, nics, nvlink_GBps):
    imported = import_sources(fmt, [Source(name, (SHARED / name).read_text())])
    topo = imported.topology()
    node = topo.nodes[0]
    assert node.gpus == 8 and len(node.nics) == nics
    assert sorted(g for n in node.nics for g in n.gpus) == list(range(8))
    if nvlink_GBps is None:
        assert any("no NVLink" in n for n in imported.notes)
    else:
        assert topo.domains[node.domain].bw_GBps == nvlink_GBps


@needs_shared
def test_dgx1_pcie_view_pairs_each_nic_with_its_pix_gpus():
    name = "nvidia-smi-topo-mp_DGX-1-V100_8gpu_4nic_pcie-view.txt"
    topo = import_sources("nvidia-smi", [Source(name, (SHARED / name).read_text())]).topology()
    assert [n.gpus for n in topo.nodes[0].nics] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_the_pcie_lab_example_is_its_matrices_converted():
    from apps.placement.convert.base import yaml_documents
    from apps.placement.topology import load_topology_file, topology_to_spec

    lab = Path(__file__).resolve().parents[3] / "examples"
    site = yaml_documents(Source("site.yaml", (lab / "pcie-lab" / "site.yaml").read_text()))[0][0]
    files = [lab / "pcie-lab" / f"{name}.txt" for name in ("pcie-box", "mesh-box")]
    sources = [Source(str(p), p.read_text()) for p in files]
    converted = import_sources("nvidia-smi", sources, Defaults.from_mapping(site)).topology()
    example = load_topology_file(str(lab / "pcie-lab.yaml"))
    assert topology_to_spec(converted) == topology_to_spec(example)
    assert sorted(n.name for n in example.nodes if n.intra is not None) == ["mesh-box", "pcie-box"]


PEER_XML = """<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64">
    <pci busid="0000:10:00.0" class="0x060400" link_speed="8 GT/s" link_width="16">
      <pci busid="0000:11:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
        <gpu dev="0" sm="70" rank="0" gdr="1"><nvlink target="0000:12:00.0" count="2" tclass="0x030200"/></gpu>
      </pci>
      <pci busid="0000:12:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
        <gpu dev="1" sm="70" rank="1" gdr="1"><nvlink target="0000:11:00.0" count="2" tclass="0x030200"/></gpu>
      </pci>
      <pci busid="0000:13:00.0" class="0x020000"><nic><net name="mlx5_0" dev="0" speed="100000"/></nic></pci>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ff00" arch="x86_64">
    <pci busid="0000:20:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
      <gpu dev="2" sm="70" rank="2" gdr="1"/>
    </pci>
  </cpu>
</system>
"""


def test_nccl_peer_nvlinks_make_a_partial_mesh_with_intra_links():
    hw = parse_nccl(Source("peer.xml", PEER_XML), Defaults())
    assert hw.pairs[(0, 1)] == "NV2" and hw.pairs[(0, 2)] == "SYS"
    assert hw.nic_class[("mlx5_0", 0)] == "PIX" and hw.nic_class[("mlx5_0", 2)] == "SYS"
    assert hw.numa == {0: "0", 1: "0", 2: "1"}
    topo = import_sources("nccl-xml", [Source("peer.xml", PEER_XML)]).topology()
    assert topo.path(0, 1).bw_GBps == 50.0 and topo.path(0, 2).bw_GBps < 25
    assert topo.nodes[0].nics[0].bw_GBps == 12.5
