"""A generated 1,024-GPU rail-optimized cluster through every format that can hold it, and the
`convert` command of the placement CLI."""

from __future__ import annotations

import json

import pytest
import yaml

from apps.placement.__main__ import main
from apps.placement.convert import Defaults, Source, export_topology, import_sources
from apps.placement.topology import load_topology, topology_to_spec
from tests.scripts import run_script
from tests.unit.placement.specs import switch_node_sets

SU_1024 = {
    "version": 1,
    "name": "rail-1024",
    "generate": {
        "shape": "rail-optimized",
        "spines": 4,
        "leaves": 32,
        "nodes_per_leaf": 32,
        "gpus_per_node": 8,
        "gpu_model": "H100-SXM5-80GB",
        "peak_tflops": 989,
        "nvlink_bw_GBps": 450,
        "nic_bw_GBps": 50,
        "nics_per_node": 8,
        "uplink_bw_GBps": 400,
    },
}
# What the Slurm and Kubernetes formats do not hold, as an operator would give it.
DEFAULTS = {"name": "rail-1024", "gpus_per_node": 8, "gpu_model": "H100-SXM5-80GB", "peak_tflops": 989}


@pytest.fixture(scope="module")
def rail1024():
    topo = load_topology(SU_1024)
    assert topo.n_gpus == 1024
    return topo


def test_spec_v1_round_trips_exactly(rail1024):
    text = export_topology("topology-v1", rail1024)
    back = import_sources("topology-v1", [Source("rail.yaml", text)]).topology()
    assert topology_to_spec(back) == topology_to_spec(rail1024)


@pytest.mark.parametrize("fmt", ["slurm-tree", "slurm-yaml", "kueue"])
def test_tree_formats_round_trip_switch_to_node_sets_and_gpus(rail1024, fmt):
    text = export_topology(fmt, rail1024)
    back = import_sources(fmt, [Source(f"rail.{fmt}", text)], Defaults.from_mapping(DEFAULTS)).topology()
    assert [n.name for n in back.nodes] == [n.name for n in rail1024.nodes]
    assert back.n_gpus == 1024
    assert switch_node_sets(back) == switch_node_sets(rail1024)
    # Each scalable unit is one Slurm leaf: 4 of them, under spines that hold all 128 nodes.
    assert len(switch_node_sets(back)["leaf"]) == 4


def test_block_format_round_trips_the_units_as_blocks(rail1024):
    text = export_topology("slurm-block", rail1024)
    assert "BlockSizes=32,64,128" in text
    back = import_sources("slurm-block", [Source("b.conf", text)], Defaults.from_mapping(DEFAULTS)).topology()
    assert switch_node_sets(back)["leaf"] == switch_node_sets(rail1024)["leaf"]
    assert back.n_gpus == 1024


def test_topograph_graph_holds_every_node_under_its_unit(rail1024):
    graph = json.loads(export_topology("topograph", rail1024))
    spine = graph["tiers"]["vertices"]["spine-1"]
    assert sum(len(leaf["vertices"]) for leaf in spine["vertices"].values()) == 128


def test_cli_converts_files_and_reports_defaults(tmp_path, capsys):
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "SwitchName=s0 Nodes=gpu[01-02]\nSwitchName=s1 Nodes=gpu[03-04]\nSwitchName=top Switches=s[0-1]\n"
    )
    out = tmp_path / "kueue.yaml"
    status = main(
        [
            "convert",
            "--from",
            "slurm-tree",
            "--to",
            "kueue",
            str(conf),
            "-o",
            str(out),
            "--set",
            "gpus_per_node=4",
            "--name",
            "lab",
        ]
    )
    err = capsys.readouterr().err
    assert status == 0
    assert "gpus_per_node=4," in err and "nic_bw_GBps=50.0 (default)" in err
    back = import_sources("kueue", [Source("k.yaml", out.read_text())]).topology()
    assert back.name == "lab" and back.n_gpus == 16


def test_cli_reports_bad_input_with_file_and_line(tmp_path, capsys):
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s0 Nodes=gpu[01-02]\nSwitchName=s1 Nodes=gpu[03-\n")
    assert main(["convert", "--from", "slurm-tree", "--to", "slurm-block", str(conf)]) == 2
    assert f"error: {conf}:2:" in capsys.readouterr().err
    assert (
        main(
            ["convert", "--from", "slurm-tree", "--to", "slurm-block", str(conf), "--set", "gpus_per_node=-1"]
        )
        == 2
    )
    assert "--set.gpus_per_node" in capsys.readouterr().err


def test_cli_reads_a_directory_of_node_files(tmp_path, capsys):
    matrix = "\tGPU0\tGPU1\tNIC0\nGPU0\t X \tNV4\tPIX\nGPU1\tNV4\t X \tPIX\nNIC0\tPIX\tPIX\t X \n"
    for name in ("node-b", "node-a"):
        (tmp_path / f"{name}.txt").write_text(matrix)
    assert main(["convert", "--from", "nvidia-smi", "--to", "topology-v1", str(tmp_path)]) == 0
    spec = __import__("yaml").safe_load(capsys.readouterr().out)
    assert [n["name"] for n in spec["nodes"]] == ["node-a", "node-b"]
    assert spec["nodes"][0]["nvlink"]["bw_GBps"] == 100.0


def test_defaults_refuse_unknown_keys_and_out_of_range_values():
    with pytest.raises(Exception, match="unknown default"):
        Defaults.from_mapping({"gpus_per_nod": 8})
    with pytest.raises(Exception, match="0..1e7"):
        Defaults.from_mapping({"nic_bw_GBps": "inf"})


def test_convert_benchmark_quick_run_prints_its_table():
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = run_script([sys.executable, str(root / "bench" / "convert_speed.py"), "--quick"], cpu_s=60)
    assert done.returncode == 0, done.stderr
    assert "slurm-tree" in done.stdout and "slowest other format" in done.stdout


def test_cli_nics_flag_chooses_the_rails(capsys):
    from tests.unit.placement.realfiles import DATA

    src = str(DATA / "nvsmi-h20-quoted-roce-frontend.txt")
    assert main(["convert", "--from", "nvidia-smi", "--to", "topology-v1", src, "--nics", "mlx5_[0-1]"]) == 0
    captured = capsys.readouterr()
    nics = yaml.safe_load(captured.out)["nodes"][0]["nics"]
    assert [n["name"] for n in nics] == ["mlx5_0", "mlx5_1"]
    assert "not in nics=mlx5_[0-1]" in captured.err
