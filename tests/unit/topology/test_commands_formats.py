"""`import_topology --format` and `export_topology --format` with other tools' formats."""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.topology.models import Cluster, Node

pytestmark = pytest.mark.django_db

CONF = "SwitchName=s0 Nodes=gpu[01-02]\nSwitchName=s1 Nodes=gpu[03-04]\nSwitchName=top Switches=s[0-1]\n"


def test_import_slurm_tree_with_set_values_and_notes(tmp_path):
    path = tmp_path / "topology.conf"
    path.write_text(CONF)
    out = io.StringIO()
    call_command(
        "import_topology",
        str(path),
        "--format",
        "slurm-tree",
        "--name",
        "lab",
        "--set",
        "gpus_per_node=4",
        stdout=out,
    )
    assert "note: values not in the input:" in out.getvalue()
    assert "Imported cluster lab: 4 nodes, 16 GPUs" in out.getvalue()


def test_import_reads_defaults_from_a_side_file(tmp_path):
    (tmp_path / "topology.conf").write_text(CONF)
    (tmp_path / "site.yaml").write_text("name: site\ngpus_per_node: 2\nnic_bw_GBps: 25\n")
    call_command(
        "import_topology",
        str(tmp_path / "topology.conf"),
        "--format",
        "slurm-tree",
        "--defaults",
        str(tmp_path / "site.yaml"),
        stdout=io.StringIO(),
    )
    node = Node.objects.get(cluster__name="site", name="gpu01")
    assert node.gpus.count() == 2 and node.nics.get().bw_GBps == 25


def test_a_bad_foreign_file_is_rejected_with_its_line_and_nothing_written(tmp_path):
    path = tmp_path / "topology.conf"
    path.write_text(CONF + "SwitchName=s9 Switches=nope\n")
    with pytest.raises(CommandError, match=r"topology.conf:4: switch 's9' lists unknown switch 'nope'"):
        call_command("import_topology", str(path), "--format", "slurm-tree", stdout=io.StringIO())
    assert not Cluster.objects.exists()


def test_export_in_another_format_re_imports(tmp_path):
    path = tmp_path / "topology.conf"
    path.write_text(CONF)
    call_command(
        "import_topology", str(path), "--format", "slurm-tree", "--name", "lab", stdout=io.StringIO()
    )
    out = io.StringIO()
    call_command("export_topology", "lab", "--format", "kueue", stdout=out)
    docs = list(yaml.safe_load_all(out.getvalue()))
    assert docs[0]["metadata"]["name"] == "lab" and len(docs) == 5
    back = tmp_path / "kueue.yaml"
    back.write_text(out.getvalue())
    call_command("import_topology", str(back), "--format", "kueue", "--replace", stdout=io.StringIO())
    assert Node.objects.filter(cluster__name="lab").count() == 4
    tree = io.StringIO()
    call_command("export_topology", "lab", "--format", "slurm-tree", stdout=tree)
    assert "SwitchName=s0 Nodes=gpu[01-02]" in tree.getvalue()


def test_intra_node_links_survive_the_database(tmp_path):
    from apps.topology import services

    matrix = (
        "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\n"
        "GPU0\t X \tPIX\tSYS\tSYS\tPIX\tSYS\n"
        "GPU1\tPIX\t X \tSYS\tSYS\tPIX\tSYS\n"
        "GPU2\tSYS\tSYS\t X \tPIX\tSYS\tPIX\n"
        "GPU3\tSYS\tSYS\tPIX\t X \tSYS\tPIX\n"
        "NIC0\tPIX\tPIX\tSYS\tSYS\t X \tSYS\n"
        "NIC1\tSYS\tSYS\tPIX\tPIX\tSYS\t X \n"
    )
    (tmp_path / "box.txt").write_text(matrix)
    call_command(
        "import_topology",
        str(tmp_path / "box.txt"),
        "--format",
        "nvidia-smi",
        "--name",
        "pcie",
        stdout=io.StringIO(),
    )
    topo = services.cluster_topology(cluster=Cluster.objects.get(name="pcie"), fresh=True)
    assert topo.path(0, 1).bw_GBps > topo.path(0, 2).bw_GBps
    out = io.StringIO()
    call_command("export_topology", "pcie", stdout=out)
    assert yaml.safe_load(out.getvalue())["nodes"][0]["intra"]["links"][0] == ["X", "PIX", "SYS", "SYS"]


DATA = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "converters"


def test_import_a_space_aligned_paste_with_a_nics_filter():
    out = io.StringIO()
    call_command(
        "import_topology",
        f"h20={DATA / 'nvsmi-h20-quoted-roce-frontend.txt'}",
        "--format",
        "nvidia-smi",
        "--name",
        "h20",
        "--nics",
        "mlx5_*",
        stdout=out,
    )
    node = Node.objects.get(cluster__name="h20", name="h20")
    assert sorted(node.nics.values_list("name", flat=True)) == [f"mlx5_{k}" for k in range(4)]
    assert "not in nics=mlx5_*" in out.getvalue()


def test_import_of_a_matrix_without_nic_columns_names_what_is_missing():
    with pytest.raises(CommandError, match="no NIC columns"):
        call_command(
            "import_topology",
            str(DATA / "nvsmi-gpus-only.txt"),
            "--format",
            "nvidia-smi",
            stdout=io.StringIO(),
        )
    assert not Cluster.objects.exists()
