"""Rank-map formats for launchers (pure functions over rank entries)."""

from __future__ import annotations

import shlex

import pytest

from apps.scheduling import rankmaps

# A naive-style placement: ranks alternate between two nodes in blocks of two, NICs per GPU pair.
RANKS = [
    {"rank": 0, "node": "node-a", "gpu": 0, "nic": "mlx5_0"},
    {"rank": 1, "node": "node-a", "gpu": 1, "nic": "mlx5_0"},
    {"rank": 2, "node": "node-b", "gpu": 6, "nic": "mlx5_3"},
    {"rank": 3, "node": "node-b", "gpu": 7, "nic": "mlx5_3"},
    {"rank": 4, "node": "node-a", "gpu": 2, "nic": "mlx5_1"},
    {"rank": 5, "node": "node-a", "gpu": 3, "nic": "mlx5_1"},
]


def test_openmpi_rankfile_has_one_line_per_rank_with_host_and_gpu_slot():
    assert rankmaps.openmpi_rankfile(RANKS).splitlines() == [
        "rank 0=node-a slot=0",
        "rank 1=node-a slot=1",
        "rank 2=node-b slot=6",
        "rank 3=node-b slot=7",
        "rank 4=node-a slot=2",
        "rank 5=node-a slot=3",
    ]


def test_slurm_hostfile_lists_one_host_per_rank_in_rank_order():
    assert rankmaps.slurm_hostfile(RANKS) == "node-a\nnode-a\nnode-b\nnode-b\nnode-a\nnode-a\n"


def test_nodes_are_numbered_by_their_lowest_rank():
    nodes = rankmaps.nodes_in_rank_order(list(reversed(RANKS)))
    assert [(n["node"], n["node_rank"], [r["rank"] for r in n["ranks"]]) for n in nodes] == [
        ("node-a", 0, [0, 1, 4, 5]),
        ("node-b", 1, [2, 3]),
    ]


def test_torchrun_has_one_command_per_node_with_rendezvous_flags():
    text = rankmaps.torchrun_commands(RANKS, entrypoint="pretrain.py", master_port=29999)
    commands = [line for line in text.splitlines() if line.startswith("torchrun")]
    assert len(commands) == 2
    a, b = (shlex.split(c) for c in commands)
    assert a[:6] == [
        "torchrun",
        "--nnodes=2",
        "--node-rank=0",
        "--nproc-per-node=4",
        "--master-addr=node-a",
        "--master-port=29999",
    ]
    assert b[1:5] == ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2", "--master-addr=node-a"]
    assert a[-2:] == ["python", "pretrain.py"]


def test_torchrun_wrapper_maps_each_local_process_to_its_rank_gpu_and_nic():
    text = rankmaps.torchrun_commands(RANKS)
    node_a = next(line for line in text.splitlines() if line.startswith("torchrun"))
    wrapper = shlex.split(node_a)[shlex.split(node_a).index("-c") + 1]
    assert "R=(0 1 4 5)" in wrapper
    assert "G=(0 1 2 3)" in wrapper
    assert "H==mlx5_0 =mlx5_0 =mlx5_1 =mlx5_1)" in wrapper.replace("H=(", "H=")
    assert "#   local rank 2 -> rank 4: CUDA_VISIBLE_DEVICES=2 NCCL_IB_HCA==mlx5_1" in text


def test_nccl_ib_hca_selects_exactly_one_hca():
    assert rankmaps.nccl_ib_hca("mlx5_1") == "=mlx5_1"
    assert rankmaps.nccl_ib_hca("") == ""


def test_json_rankmap_has_per_rank_env_and_node_ranks():
    out = rankmaps.rankmap_json(RANKS, job="j")
    assert out["world_size"] == 6 and out["master_addr"] == "node-a"
    assert out["ranks"][2] == {
        "rank": 2,
        "node": "node-b",
        "gpu": 6,
        "nic": "mlx5_3",
        "node_rank": 1,
        "local_rank": 0,
        "env": {"CUDA_VISIBLE_DEVICES": "6", "NCCL_IB_HCA": "=mlx5_3"},
    }


def test_ranks_with_gaps_are_refused():
    with pytest.raises(ValueError, match="ranks"):
        rankmaps.openmpi_rankfile([RANKS[0], RANKS[2]])
