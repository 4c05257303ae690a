"""The launch contract: the environment every launcher sets for each rank (stdlib only).

The node agent (`apps.agent.env.plan_env`), the Slurm job script (`apps.executors.slurm.script`)
and the rank maps shown to users (`apps.scheduling.rankmaps`) all set these names the same way;
the job spec (`apps.placement.launch`) refuses them in a job's `env`, and with them the names that
could redirect the code or devices a rank uses (`denied_env`). One module, imported by each, so
the launchers and the spec cannot disagree, and the placement core need not import the agent.
"""

from __future__ import annotations

# Set for each rank by every launcher, besides TOPOWEB_JOB_ID, TOPOWEB_NODE and
# TOPOWEB_GENERATION under LAUNCH_CONTRACT_PREFIX. A job's env may not set them.
LAUNCH_CONTRACT = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "NCCL_IB_HCA",
    }
)
LAUNCH_CONTRACT_PREFIX = "TOPOWEB_"
# Names a job's env may not set: the launch contract, the account's identity, and those that
# redirect the code run (loader, PATH, Python path) or the devices used.
DENIED_ENV = LAUNCH_CONTRACT | {
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "GPU_DEVICE_ORDINAL",
    "HOME",
    "USER",
    "LOGNAME",
}
DENIED_ENV_PREFIXES = (LAUNCH_CONTRACT_PREFIX, "LD_", "CUDA_", "NVIDIA_", "ROCR_", "HIP_")


def denied_env(name: str) -> str | None:
    """Why a job's env may not set `name` (None: it may)."""
    if name in DENIED_ENV or name.startswith(DENIED_ENV_PREFIXES):
        return "is set by the node agent or could redirect the code or devices a rank uses"
    return None


def nccl_ib_hca(nic: str) -> str:
    """NCCL_IB_HCA selecting exactly one HCA ('=' turns off prefix matching, so mlx5_1 does not
    also pick mlx5_10); empty for a GPU without a NIC."""
    return f"={nic}" if nic else ""
