"""nvidia-smi matrices as people paste them and cloud NCCL files without NVLink: each converts
to the right nodes, NVLink domains and NIC affinity, and a TP8 job stays inside one domain."""

from __future__ import annotations

import pytest

from apps.placement.convert import Defaults, Source, import_sources
from apps.placement.convert.hardware import CUBE_MESH, gpu_kind, nic_fabric
from apps.placement.topology import SpecError

from .realfiles import DATA, SAMPLES, convert, domain_sizes, nic_gpus, tp8_domains


def test_a_space_aligned_paste_with_legend_and_gpu_names_converts():
    imported, topo = convert("nvidia-smi", "nvsmi-h100-spaces-legend.txt")
    node = topo.nodes[0]
    assert len(topo.nodes) == 1 and node.gpus == 8
    assert domain_sizes(topo) == [8]
    assert topo.domains[node.domain].bw_GBps == 450.0
    # The legend names the NICs; each GPU uses the rail under its own PCIe switch.
    assert nic_gpus(node) == {f"mlx5_{k}": (k,) for k in range(8)}
    # `nvidia-smi -L` lines pasted above the matrix name the GPU model.
    assert node.gpu_model == "H100-SXM5-80GB" and not any("GPU model" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_a_bonded_roce_front_end_is_not_a_rail():
    imported, topo = convert("nvidia-smi", "nvsmi-h100-spaces-legend.txt")
    assert "mlx5_bond_0" not in nic_gpus(topo.nodes[0])
    assert any("mlx5_bond_0 left out" in n and "front end" in n for n in imported.notes)


def test_a_quoted_h20_paste_keeps_its_roce_front_end_out_of_the_rails():
    imported, topo = convert("nvidia-smi", "nvsmi-h20-quoted-roce-frontend.txt")
    node = topo.nodes[0]
    assert nic_gpus(node) == {f"mlx5_{k}": (2 * k, 2 * k + 1) for k in range(4)}
    assert sorted(s.name for s in topo.switches if s.tier == "leaf") == [f"leaf-{k}" for k in range(1, 5)]
    assert any("rocep152s0f0" in n and "front end" in n for n in imported.notes)
    assert domain_sizes(topo) == [8] and tp8_domains(topo) == 1


def test_the_nics_filter_chooses_the_rails():
    imported, topo = convert("nvidia-smi", "nvsmi-h20-quoted-roce-frontend.txt", nics="mlx5_[01]")
    assert sorted(nic_gpus(topo.nodes[0])) == ["mlx5_0", "mlx5_1"]
    assert any("not in nics=mlx5_[01]" in n for n in imported.notes)
    with pytest.raises(SpecError, match="no NIC of node"):
        convert("nvidia-smi", "nvsmi-h20-quoted-roce-frontend.txt", nics="ib*")


def test_an_old_driver_matrix_with_device_columns_and_crlf_converts():
    imported, topo = convert("nvidia-smi", "nvsmi-a100-old-driver-crlf.txt")
    node = topo.nodes[0]
    assert node.gpus == 8 and domain_sizes(topo) == [8]
    assert topo.domains[node.domain].bw_GBps == 300.0
    assert nic_gpus(node) == {f"mlx5_{k}": (2 * k, 2 * k + 1) for k in range(4)}
    assert any("GPU model H100-SXM5-80GB assumed (gpu_model" in n for n in imported.notes)
    assert tp8_domains(topo) == 1


def test_the_same_matrix_tab_or_space_aligned_converts_alike():
    tabbed = (DATA / "nvsmi-a100-old-driver-crlf.txt").read_text()
    spaced = "\n".join("   ".join(c.strip() or "" for c in ln.split("\t")) for ln in tabbed.splitlines())
    a = import_sources("nvidia-smi", [Source("a.txt", tabbed)]).spec["nodes"][0]
    b = import_sources("nvidia-smi", [Source("a.txt", spaced)]).spec["nodes"][0]
    assert a == b


def test_a_matrix_without_nic_columns_is_refused_naming_what_is_missing():
    with pytest.raises(SpecError) as exc:
        convert("nvidia-smi", "nvsmi-gpus-only.txt")
    where, message = exc.value.errors[0]
    assert where == "nvsmi-gpus-only.txt:1" and "no NIC columns" in message


def test_a_matrix_without_nic_columns_imports_with_nics_per_node_given():
    imported, topo = convert("nvidia-smi", "nvsmi-gpus-only.txt", nics_per_node=2)
    assert nic_gpus(topo.nodes[0]) == {"nic0": (0, 1), "nic1": (2, 3)}
    assert "2 NICs per node assumed (nics_per_node): 1 nodes" in imported.notes
    assert domain_sizes(topo) == [4]


def test_a_lone_surrogate_is_a_spec_error_naming_the_line():
    text = (DATA / "nvsmi-gpus-only.txt").read_text().replace("CPU", "CP\udc80U")
    with pytest.raises(SpecError) as exc:
        import_sources("nvidia-smi", [Source("box.txt", text)])
    assert exc.value.errors[0][0] == "box.txt:1" and "surrogate" in exc.value.errors[0][1]
    # An undecodable file name is escaped: the node named after it is refused by the name rules.
    good = (DATA / "nvsmi-h20-quoted-roce-frontend.txt").read_text()
    imported = import_sources("nvidia-smi", [Source("b\udc80x.txt", good)])
    with pytest.raises(SpecError) as exc:
        imported.topology()
    assert exc.value.errors[0][0].startswith("b\\udc80x.txt")
    exc.value.errors[0][0].encode("utf-8")
    named = import_sources("nvidia-smi", [Source("b\udc80x.txt", good, node="box1")]).topology()
    assert named.nodes[0].name == "box1"
    with pytest.raises(SpecError, match="node name is not valid Unicode"):
        import_sources("nvidia-smi", [Source("box.txt", good, node="b\udc80x")])


def test_a_cloud_nccl_file_says_it_has_no_nvlink_and_takes_it_from_the_gpu_model():
    imported, topo = convert("nccl-xml", "nccl-p4d-efa-no-nvlink.xml")
    node = topo.nodes[0]
    assert any("this file has no NVLink information" in n and "A100-SXM4-40GB" in n for n in imported.notes)
    assert node.gpu_model == "A100-SXM4-40GB" and domain_sizes(topo) == [8]
    assert topo.domains[node.domain].bw_GBps == 300.0
    assert tp8_domains(topo) == 1


def test_efa_devices_are_named_and_priced_as_efa():
    _, topo = convert("nccl-xml", "nccl-p4d-efa-no-nvlink.xml")
    node = topo.nodes[0]
    assert nic_gpus(node) == {f"efa_{k}": (2 * k, 2 * k + 1) for k in range(4)}
    assert {n.bw_GBps for n in node.nics} == {12.5}


def test_nvlink_bandwidth_can_be_given_for_a_file_without_it():
    imported, topo = convert("nccl-xml", "nccl-p4d-efa-no-nvlink.xml", nvlink_bw_GBps=200)
    assert topo.domains[topo.nodes[0].domain].bw_GBps == 200.0
    assert any("NVLink from nvlink_bw_GBps=200" in n for n in imported.notes)


def test_an_nccl_file_without_gpu_ids_or_nvlink_stays_pcie_and_says_how_to_fix_it():
    text = (DATA / "nccl-p4d-efa-no-nvlink.xml").read_text().replace('device="0x20b0"', 'device="0x0000"')
    imported = import_sources("nccl-xml", [Source("vm.xml", text)])
    assert any("no NVLink information" in n and "Set gpu_model" in n for n in imported.notes)
    assert imported.topology().nodes[0].intra is not None
    given = import_sources("nccl-xml", [Source("vm.xml", text)], Defaults.from_mapping({"gpu_model": "B200"}))
    topo = given.topology()
    assert topo.domains["vm"].bw_GBps == 900.0 and topo.nodes[0].intra is None


def test_a_pcie_view_of_a_v100_sxm2_box_gets_the_hybrid_cube_mesh():
    from apps.placement.convert.node import nvlink_fallback
    from apps.placement.convert.nvsmi import parse_matrix

    text = (DATA / "nvsmi-a100-old-driver-crlf.txt").read_text()
    pcie = text.replace("NV12", "SYS") + "\nLegend:\n\n  X    = Self\n  SYS  = PCIe and SMP\n"
    hw = parse_matrix(Source("dgx1.txt", pcie))
    assert not hw.nvlink_known
    notes: list[str] = []
    nvlink_fallback(hw, Defaults.from_mapping({"gpu_model": "Tesla V100-SXM2-32GB"}), notes)
    assert {(i, j): hw.pairs[(i, j)] for (i, j) in CUBE_MESH} == {p: f"NV{k}" for p, k in CUBE_MESH.items()}
    assert hw.pairs[(0, 5)] == "SYS" and "cube-mesh" in notes[0]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA H200", "H200-SXM-141GB"),
        ("NVIDIA B200", "B200"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_models_are_known_by_name(model, expected):
    kind = gpu_kind(model=model)
    assert (kind.model if kind else None) == expected


def test_nic_fabric_by_name():
    assert nic_fabric("mlx5_0") == ""
    assert nic_fabric("mlx5_bond_0") == nic_fabric("rocep152s0f0") == nic_fabric("eth0") == "ethernet"
    assert nic_fabric("ibp24s0") == "infiniband" and nic_fabric("efa_0") == "efa"
    assert nic_fabric("mlx5_4", "RoCE front end") == "ethernet"


def test_the_simai_nccl_dump_keeps_its_bonded_nics_as_rails():
    # Every NIC of this box is a RoCE bond: they are the fabric, not front ends.
    _, topo = convert("nccl-xml", "nccl_topo_8xA100_4xCX6_aliyun_SimAI.xml", data=SAMPLES)
    node = topo.nodes[0]
    assert nic_gpus(node) == {f"mlx5_bond_{k + 1}": (2 * k, 2 * k + 1) for k in range(4)}
    assert domain_sizes(topo) == [8] and tp8_domains(topo) == 1


def test_a_legend_entry_with_a_description_names_the_nic_and_its_fabric():
    text = (DATA / "nvsmi-h20-quoted-roce-frontend.txt").read_text()
    text = text.replace("NIC4: rocep152s0f0", "NIC4: mlx5_4 (front end, RoCE)")
    imported = import_sources("nvidia-smi", [Source("h20.txt", text)])
    assert any("mlx5_4 left out: Ethernet/RoCE front end" in n for n in imported.notes)
    assert sorted(n["name"] for n in imported.spec["nodes"][0]["nics"]) == [f"mlx5_{k}" for k in range(4)]


def test_a_given_nvlink_bandwidth_wins_over_the_gpu_models_link_rate():
    text = (DATA / "nccl-p4d-efa-no-nvlink.xml").read_text().replace('device="0x20b0"', 'device="0x2901"')
    values = {"nvlink_bw_GBps": 210}
    topo = import_sources("nccl-xml", [Source("b200.xml", text)], Defaults.from_mapping(values)).topology()
    assert topo.domains["b200"].bw_GBps == pytest.approx(210.0)
    assert topo.nodes[0].gpu_model == "B200"


def test_a_matrix_pasted_as_a_markdown_table_converts():
    tabbed = (DATA / "nvsmi-a100-old-driver-crlf.txt").read_text().splitlines()
    rows = ["| " + " | ".join(c.strip() for c in ln.split("\t")) + " |" for ln in tabbed]
    table = "\n".join([rows[0], "|" + "---|" * 14, *rows[1:]])
    topo = import_sources("nvidia-smi", [Source("wiki.md", table)]).topology()
    assert topo.nodes[0].gpus == 8 and domain_sizes(topo) == [8]
    assert nic_gpus(topo.nodes[0]) == {f"mlx5_{k}": (2 * k, 2 * k + 1) for k in range(4)}
