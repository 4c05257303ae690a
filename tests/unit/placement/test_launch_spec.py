"""Job spec v1 launch fields: command, env, workdir, requeue, max_requeues, stop_grace_s, pids_max,
memory_mb, each bounded."""

from __future__ import annotations

import pytest

from apps.placement.jobs import job_to_spec, load_job
from apps.placement.topology import SpecError

BASE = {
    "version": 1,
    "name": "j",
    "gpus": 2,
    "parallelism": {"dp": 2},
    "step": {"compute_ms": 1},
    "comm": [],
}


def errors(**fields) -> dict:
    with pytest.raises(SpecError) as info:
        load_job({**BASE, **fields})
    return info.value.as_dict()


def test_launch_fields_round_trip():
    job = load_job(
        {
            **BASE,
            "command": ["python", "train.py", "--lr", "3e-4"],
            "env": {"NCCL_DEBUG": "INFO", "SEED": 3, "FLAG": True},
            "workdir": "/scratch/run",
            "requeue": True,
            "max_requeues": 0,
            "stop_grace_s": 120,
            "pids_max": 64,
            "memory_mb": 4_194_304,
        }
    )
    assert (job.launch.max_requeues, job.launch.pids_max, job.launch.memory_mb) == (0, 64, 4_194_304)
    assert job.launch.command == ("python", "train.py", "--lr", "3e-4")
    assert dict(job.launch.env) == {"NCCL_DEBUG": "INFO", "SEED": "3", "FLAG": "true"}
    assert load_job(job_to_spec(job)) == job


def test_a_spec_without_launch_fields_keeps_its_old_form():
    assert "command" not in job_to_spec(load_job(BASE))


def test_requeues_default_to_five_and_limits_to_the_agents():
    launch = load_job(BASE).launch
    assert (launch.max_requeues, launch.pids_max, launch.memory_mb) == (5, None, None)
    assert not {"max_requeues", "pids_max", "memory_mb"} & set(job_to_spec(load_job(BASE)))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": []}, "command"),
        ({"command": "python train.py"}, "command"),
        ({"command": ["python", 3]}, "command[1]"),
        ({"command": ["x" * 5000]}, "command[0]"),
        ({"command": ["a"] * 300}, "command"),
        ({"command": ["python", "a\x00b"]}, "command[1]"),
        ({"env": {"RANK": "1"}}, "env.RANK"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
        ({"env": {"TOPOWEB_JOB_ID": "1"}}, "env.TOPOWEB_JOB_ID"),
        ({"env": {"BAD NAME": "1"}}, "env"),
        ({"env": {"X": "v" * 5000}}, "env.X"),
        ({"env": {f"V{i}": "1" for i in range(200)}}, "env"),
        ({"env": ["A=1"]}, "env"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "env.LD_PRELOAD"),
        ({"env": {"PATH": "/tmp"}}, "env.PATH"),
        ({"env": {"PYTHONPATH": "/tmp"}}, "env.PYTHONPATH"),
        ({"env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}, "env.CUDA_DEVICE_ORDER"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "env.NVIDIA_VISIBLE_DEVICES"),
        ({"env": {"ROCR_VISIBLE_DEVICES": "0"}}, "env.ROCR_VISIBLE_DEVICES"),
        ({"env": {"HIP_VISIBLE_DEVICES": "0"}}, "env.HIP_VISIBLE_DEVICES"),
        ({"env": {"GPU_DEVICE_ORDINAL": "0"}}, "env.GPU_DEVICE_ORDINAL"),
        ({"env": {"NCCL_IB_HCA": "mlx5_0"}}, "env.NCCL_IB_HCA"),
        ({"workdir": "relative/dir"}, "workdir"),
        ({"workdir": "/home/alice/../bob"}, "workdir"),
        ({"workdir": "/" + "d" * 2000}, "workdir"),
        ({"requeue": "yes"}, "requeue"),
        ({"stop_grace_s": -1}, "stop_grace_s"),
        ({"stop_grace_s": 1e9}, "stop_grace_s"),
        ({"stop_grace_s": float("nan")}, "stop_grace_s"),
        ({"max_requeues": -1}, "max_requeues"),
        ({"max_requeues": 101}, "max_requeues"),
        ({"max_requeues": 2.5}, "max_requeues"),
        ({"max_requeues": True}, "max_requeues"),
        ({"pids_max": 63}, "pids_max"),
        ({"pids_max": 1_048_577}, "pids_max"),
        ({"pids_max": "4096"}, "pids_max"),
        ({"memory_mb": 63}, "memory_mb"),
        ({"memory_mb": 4_194_305}, "memory_mb"),
        ({"memory_mb": 1e3}, "memory_mb"),
    ],
)
def test_bad_launch_fields_are_named(fields, field):
    assert field in errors(**fields)
