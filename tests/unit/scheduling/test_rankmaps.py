"""Rank-map formats for launchers (pure functions over rank entries)."""

from __future__ import annotations

import shlex
import subprocess

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


def appfile_lines(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line and not line.startswith("#")]


def test_openmpi_appfile_gives_rank_n_its_host_and_only_its_gpu():
    lines = appfile_lines(rankmaps.openmpi_appfile(RANKS, entrypoint="pretrain.py"))
    # mpirun --app numbers MPI_COMM_WORLD ranks in line order, one process per `-np 1` line.
    assert len(lines) == len(RANKS)
    for r, words in zip(RANKS, lines, strict=True):
        assert words[:4] == ["-np", "1", "--host", r["node"]]
        exported = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "-x")
        assert exported == {"CUDA_VISIBLE_DEVICES": str(r["gpu"]), "NCCL_IB_HCA": "=" + r["nic"]}
        assert words[-2:] == ["python", "pretrain.py"]
    assert "slot=" not in rankmaps.openmpi_appfile(RANKS)


def run_wrapper(command_line: str, env: dict[str, str]) -> dict[str, str]:
    """Run a generated `bash -c WRAPPER _ python ...` with `env -0` in place of the program and
    return what the program would see."""
    words = shlex.split(command_line)
    start = words.index("bash")
    wrapper = words[start + 2]
    out = subprocess.run(
        ["bash", "-c", wrapper, "_", "env"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_slurm_script_writes_the_hostfile_and_binds_each_task_to_its_gpu():
    text = rankmaps.slurm_script(RANKS, entrypoint="pretrain.py", job="bert 16")
    hosts = text.split("<<'TOPOWEB_HOSTS'\n", 1)[1].split("TOPOWEB_HOSTS\n", 1)[0]
    assert hosts.splitlines() == [r["node"] for r in RANKS]
    srun = next(line for line in text.splitlines() if line.startswith("srun"))
    words = shlex.split(srun)
    assert words[:3] == ["srun", "--ntasks=6", "--distribution=arbitrary"]
    assert words[-2:] == ["python", "pretrain.py"]
    for r in RANKS:
        seen = run_wrapper(srun, {"SLURM_PROCID": str(r["rank"])})
        assert seen["CUDA_VISIBLE_DEVICES"] == str(r["gpu"])
        assert seen["NCCL_IB_HCA"] == "=" + r["nic"]
    assert "export SLURM_HOSTFILE=" in text and "topoweb-hosts-bert_16.txt" in text


def test_slurm_hostfile_lists_one_host_per_rank_in_rank_order():
    assert rankmaps.slurm_hostfile(RANKS) == "node-a\nnode-a\nnode-b\nnode-b\nnode-a\nnode-a\n"


def test_nodes_are_numbered_by_their_lowest_rank():
    nodes = rankmaps.nodes_in_rank_order(list(reversed(RANKS)))
    assert [(n["node"], n["node_rank"], [r["rank"] for r in n["ranks"]]) for n in nodes] == [
        ("node-a", 0, [0, 1, 4, 5]),
        ("node-b", 1, [2, 3]),
    ]


def torchrun_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#") and "torchrun" in line]


def test_torchrun_has_one_command_per_node_with_rendezvous_flags():
    text = rankmaps.torchrun_commands(RANKS, entrypoint="pretrain.py", master_port=29999)
    commands = torchrun_lines(text)
    assert len(commands) == 2
    a, b = (shlex.split(c) for c in commands)
    assert a[:7] == [
        "CUDA_VISIBLE_DEVICES=0,1,2,3",
        "torchrun",
        "--nnodes=2",
        "--node-rank=0",
        "--nproc-per-node=4",
        "--master-addr=node-a",
        "--master-port=29999",
    ]
    assert b[0] == "CUDA_VISIBLE_DEVICES=6,7"
    assert b[2:6] == ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2", "--master-addr=node-a"]
    assert a[-2:] == ["python", "pretrain.py"]


def test_torchrun_local_rank_th_visible_device_is_the_planned_gpu():
    """What torchrun documents: it sets LOCAL_RANK per process; the program calls
    torch.cuda.set_device(LOCAL_RANK), i.e. takes the LOCAL_RANK-th visible device."""
    for line, node in zip(
        torchrun_lines(rankmaps.torchrun_commands(RANKS)), ("node-a", "node-b"), strict=True
    ):
        visible = shlex.split(line)[0].split("=", 1)[1].split(",")
        local = [r for r in RANKS if r["node"] == node]
        for local_rank, r in enumerate(local):
            seen = run_wrapper(line, {"LOCAL_RANK": str(local_rank)})
            assert seen["RANK"] == str(r["rank"])
            assert int(visible[local_rank]) == r["gpu"]
            assert seen["NCCL_IB_HCA"] == "=" + r["nic"]


def test_every_value_is_shell_quoted():
    hostile = [
        {"rank": 0, "node": "node a;touch /tmp/x", "gpu": 0, "nic": "mlx5 $(id)"},
        {"rank": 1, "node": "node'b", "gpu": 1, "nic": ""},
    ]
    for text in (
        rankmaps.torchrun_commands(hostile, entrypoint="train $HOME.py"),
        rankmaps.slurm_script(hostile, entrypoint="train $HOME.py"),
    ):
        line = next(line for line in text.splitlines() if line.startswith(("srun", "CUDA_VISIBLE_DEVICES")))
        assert shlex.split(line)[-1] == "train $HOME.py"
    words = appfile_lines(rankmaps.openmpi_appfile(hostile))
    assert words[0][3] == "node a;touch /tmp/x" and words[1][3] == "node'b"
    assert "NCCL_IB_HCA==mlx5 $(id)" in words[0]
    torch = shlex.split(torchrun_lines(rankmaps.torchrun_commands(hostile))[0])
    assert "--master-addr=node a;touch /tmp/x" in torch
    seen = run_wrapper(torchrun_lines(rankmaps.torchrun_commands(hostile))[0], {"LOCAL_RANK": "0"})
    assert seen["NCCL_IB_HCA"] == "=mlx5 $(id)"


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
        "env": {"CUDA_VISIBLE_DEVICES": "6,7", "LOCAL_RANK": "0", "NCCL_IB_HCA": "=mlx5_3"},
    }


def test_ranks_with_gaps_are_refused():
    with pytest.raises(ValueError, match="ranks"):
        rankmaps.openmpi_appfile([RANKS[0], RANKS[2]])
