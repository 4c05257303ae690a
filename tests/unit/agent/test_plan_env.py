"""plan_env: each local rank's environment from the server's work description (no processes)."""

from __future__ import annotations

import pytest

from apps.agent.env import plan_env
from apps.agent.gpus import parse_inventory

# The seed's interleaved mapping of case 4.4: ranks 0-3 on node-a GPUs 0-3, 4-7 on node-b 0-3,
# 8-11 on node-a 4-7, 12-15 on node-b 4-7.
INTERLEAVED = [
    {
        "rank": r,
        "node": "node-a" if (r // 4) % 2 == 0 else "node-b",
        "gpu": (r % 4) + 4 * (r // 8),
        "nic": "mlx5_0",
    }
    for r in range(16)
]


def work(ranks, **extra):
    return {
        "job": 7,
        "generation": 2,
        "world_size": len(ranks),
        "master_addr": "node-a",
        "master_port": 29511,
        "node_rank": 1,
        "env": {"NCCL_DEBUG": "INFO"},
        "ranks": ranks,
        **extra,
    }


def test_local_rank_th_visible_device_is_the_planned_gpu_on_an_interleaved_map():
    plans = plan_env(work(INTERLEAVED), "node-b")
    assert [p.rank for p in plans] == [4, 5, 6, 7, 12, 13, 14, 15]
    for p in plans:
        visible = p.env["CUDA_VISIBLE_DEVICES"].split(",")
        planned = next(r["gpu"] for r in INTERLEAVED if r["rank"] == p.rank)
        assert int(visible[int(p.env["LOCAL_RANK"])]) == planned
        assert p.env["RANK"] == str(p.rank)
    assert plans[0].env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_world_master_job_and_generation_are_set_for_every_rank():
    plans = plan_env(work(INTERLEAVED), "node-a")
    for p in plans:
        assert p.env["WORLD_SIZE"] == "16"
        assert p.env["LOCAL_WORLD_SIZE"] == "8"
        assert p.env["MASTER_ADDR"] == "node-a"
        assert p.env["MASTER_PORT"] == "29511"
        assert p.env["TOPOWEB_JOB_ID"] == "7"
        assert p.env["TOPOWEB_GENERATION"] == "2"
        assert p.env["NODE_RANK"] == "1"
        assert p.env["NCCL_DEBUG"] == "INFO"


def test_nccl_ib_hca_selects_exactly_the_ranks_nic():
    ranks = [
        {"rank": 0, "node": "n", "gpu": 3, "nic": "mlx5_1"},
        {"rank": 1, "node": "n", "gpu": 1, "nic": "mlx5_10"},
        {"rank": 2, "node": "n", "gpu": 0, "nic": ""},
    ]
    plans = plan_env(work(ranks), "n")
    assert plans[0].env["NCCL_IB_HCA"] == "=mlx5_1"
    assert plans[1].env["NCCL_IB_HCA"] == "=mlx5_10"
    assert "NCCL_IB_HCA" not in plans[2].env
    assert plans[0].env["CUDA_VISIBLE_DEVICES"] == "3,1,0"


def test_reserved_variables_win_over_the_jobs_env():
    plans = plan_env(work(INTERLEAVED[:1], env={"RANK": "99"}), "node-a")
    assert plans[0].env["RANK"] == "0"


@pytest.mark.parametrize("node", ["node-c"])
def test_a_node_without_ranks_gets_none(node):
    assert plan_env(work(INTERLEAVED), node) == []


def test_nvidia_smi_inventory_is_parsed():
    text = "0, GPU-aaa, NVIDIA H100 80GB HBM3\n1, GPU-bbb, NVIDIA H100 80GB HBM3\nbad line\n"
    assert parse_inventory(text) == [
        {"index": 0, "uuid": "GPU-aaa", "name": "NVIDIA H100 80GB HBM3"},
        {"index": 1, "uuid": "GPU-bbb", "name": "NVIDIA H100 80GB HBM3"},
    ]


def test_a_ranks_environment_is_clean_and_keeps_the_contract():
    from apps.agent.env import DEFAULT_PATH, clean_env

    ranks = [{"rank": 0, "node": "node-a", "gpu": 3, "nic": ""}]
    job_env = {"LD_PRELOAD": "/tmp/x.so", "CUDA_VISIBLE_DEVICES": "0-7", "PATH": "/tmp", "MY_FLAG": "1"}
    (plan,) = plan_env(work(ranks, env=job_env), "node-a")
    env = clean_env(plan.env, home="/home/alice", user="alice")
    assert env["PATH"] == DEFAULT_PATH and env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "LD_PRELOAD" not in env and env["MY_FLAG"] == "1"
    assert env["HOME"] == "/home/alice" and env["USER"] == "alice" and env["TOPOWEB_NODE"] == "node-a"
    # Nothing of the agent's own environment.
    assert set(env) <= set(plan.env) | {"PATH", "LANG", "HOME", "USER", "LOGNAME"}


def test_the_launch_contract_is_what_the_agent_sets_and_what_a_job_spec_is_refused():
    from apps.launch_contract import LAUNCH_CONTRACT, LAUNCH_CONTRACT_PREFIX
    from apps.placement.jobs import load_job
    from apps.placement.topology import SpecError

    (plan,) = plan_env(work([{"rank": 0, "node": "n", "gpu": 2, "nic": "mlx5_0"}], env={}), "n")
    assert {name for name in plan.env if not name.startswith(LAUNCH_CONTRACT_PREFIX)} == LAUNCH_CONTRACT
    spec = {
        "version": 1,
        "name": "j",
        "gpus": 2,
        "parallelism": {"dp": 2},
        "step": {"compute_ms": 1},
        "comm": [],
        "env": dict.fromkeys(plan.env, "1"),
    }
    with pytest.raises(SpecError) as info:
        load_job(spec)
    reserved = ["is set per rank by the node agent and cannot be overridden"]
    assert info.value.as_dict() == {f"env.{name}": reserved for name in plan.env}
