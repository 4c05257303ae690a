"""Each rank's environment, computed from the server's work description (pure, no processes).

A rank starts from a clean environment: the job's `env`, the launch contract (RANK,
CUDA_VISIBLE_DEVICES, ...), a default PATH, a locale and its account's HOME, USER and LOGNAME;
nothing of the agent's. Variables that could redirect code or devices are denied in the job's
`env` (`apps.launch_contract.denied_env`): the server refuses them at submission and the agent
drops them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apps.launch_contract import denied_env, nccl_ib_hca

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LOCALE = "C.UTF-8"


def clean_env(plan_env: Mapping[str, str], *, home: str, user: str) -> dict[str, str]:
    """A rank's whole environment: default PATH and locale, the account's HOME/USER/LOGNAME,
    then the rank's planned environment (`RankPlan.env`: the job's env less denied names, and the
    launch contract)."""
    env = {"PATH": DEFAULT_PATH, "LANG": DEFAULT_LOCALE, "HOME": home, "USER": user, "LOGNAME": user}
    env.update(plan_env)
    return env


@dataclass(frozen=True, slots=True)
class RankPlan:
    """One local rank to start: its global rank, local rank, planned GPU index and environment."""

    rank: int
    local_rank: int
    gpu: int
    env: dict[str, str]


def plan_env(work: Mapping[str, Any], node: str) -> list[RankPlan]:
    """The ranks of `work` that run on `node`, in local-rank order, each with its environment.

    `work` is one job generation as the server sends it: `job`, `generation`, `world_size`,
    `master_addr`, `master_port`, `node_rank` and `ranks` (entries `{"rank", "node", "gpu", "nic"}`;
    entries of other nodes are ignored), plus the job's own `env`. Local ranks number this node's
    ranks by global rank; CUDA_VISIBLE_DEVICES lists the node's planned GPUs in local-rank order,
    so `torch.cuda.set_device(LOCAL_RANK)` selects the rank's planned GPU.
    """
    local: Sequence[Mapping[str, Any]] = sorted(
        (r for r in work["ranks"] if r.get("node", node) == node), key=lambda r: int(r["rank"])
    )
    visible = ",".join(str(int(r["gpu"])) for r in local)
    common = {str(k): str(v) for k, v in (work.get("env") or {}).items() if denied_env(str(k)) is None}
    common.update(
        {
            "WORLD_SIZE": str(int(work["world_size"])),
            "LOCAL_WORLD_SIZE": str(len(local)),
            "MASTER_ADDR": str(work["master_addr"]),
            "MASTER_PORT": str(int(work["master_port"])),
            "NODE_RANK": str(int(work.get("node_rank", 0))),
            "GROUP_RANK": str(int(work.get("node_rank", 0))),
            "CUDA_VISIBLE_DEVICES": visible,
            "TOPOWEB_JOB_ID": str(work["job"]),
            "TOPOWEB_NODE": node,
            "TOPOWEB_GENERATION": str(int(work["generation"])),
        }
    )
    plans = []
    for local_rank, r in enumerate(local):
        env = dict(common, RANK=str(int(r["rank"])), LOCAL_RANK=str(local_rank))
        hca = nccl_ib_hca(str(r.get("nic") or ""))
        if hca:
            env["NCCL_IB_HCA"] = hca
        plans.append(RankPlan(int(r["rank"]), local_rank, int(r["gpu"]), env))
    return plans
