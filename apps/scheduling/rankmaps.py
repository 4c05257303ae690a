"""Rank maps of a placed job for launchers: Open MPI appfile, Slurm (SLURM_HOSTFILE and a GPU
binding wrapper), torchrun, JSON.

All take the job's ranks as `{"rank", "node", "gpu", "nic"}` entries in rank order (see
`selectors.job_ranks`). Nodes are numbered (node rank) by their lowest rank.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Any

from apps.launch_contract import nccl_ib_hca

FORMATS = ("openmpi", "slurm", "slurm-hostfile", "torchrun", "json")
# How to use each file (the job page shows these).
USAGE = {
    "openmpi": "Open MPI appfile: mpirun --app FILE; line N is rank N with its GPU in CUDA_VISIBLE_DEVICES.",
    "slurm": "bash script for an allocation of these nodes: writes SLURM_HOSTFILE, runs srun"
    " --distribution=arbitrary with a wrapper binding each task's GPU by SLURM_PROCID.",
    "slurm-hostfile": "SLURM_HOSTFILE alone (one host per task, in rank order); bind GPUs yourself.",
    "torchrun": "one torchrun command per node; CUDA_VISIBLE_DEVICES in local-rank order, so"
    " torch.cuda.set_device(LOCAL_RANK) selects the planned GPU; RANK set from the plan.",
}
DEFAULT_MASTER_PORT = 29500


def _check(ranks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    ordered = sorted(ranks, key=lambda r: r["rank"])
    if [r["rank"] for r in ordered] != list(range(len(ordered))):
        raise ValueError("ranks: expected ranks 0..n-1, each once")
    return ordered


def nodes_in_rank_order(ranks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per node, in order of its lowest rank: node name, node rank, and its ranks' entries with
    their local rank (position on the node in rank order)."""
    nodes: dict[str, dict[str, Any]] = {}
    for r in _check(ranks):
        entry = nodes.setdefault(r["node"], {"node": r["node"], "node_rank": len(nodes), "ranks": []})
        entry["ranks"].append({**r, "local_rank": len(entry["ranks"])})
    return list(nodes.values())


def _q(value: Any) -> str:
    """One shell word: every value that goes into a command line is quoted."""
    return shlex.quote(str(value))


def _bash_array(values: Sequence[Any]) -> str:
    return "(" + " ".join(_q(v) if str(v) else "''" for v in values) + ")"


def _master_env(
    ordered: Sequence[dict[str, Any]], master_port: int | None, master_addr: str | None
) -> list[tuple[str, str]]:
    """MASTER_ADDR (`master_addr`, else the node of rank 0) and MASTER_PORT, when a port is given."""
    if master_port is None or not ordered:
        return []
    return [("MASTER_ADDR", str(master_addr or ordered[0]["node"])), ("MASTER_PORT", str(int(master_port)))]


def openmpi_appfile(
    ranks: Sequence[dict[str, Any]],
    *,
    entrypoint: str = "train.py",
    master_port: int | None = None,
    master_addr: str | None = None,
) -> str:
    """Open MPI appfile (`mpirun --app F`): one `-np 1 --host H -x CUDA_VISIBLE_DEVICES=G` line
    per rank, in rank order, so MPI_COMM_WORLD rank N is line N and sees only its planned GPU
    (device 0 inside the process). A rankfile's `slot=` would name CPU slots, not GPUs. With
    `master_port`, every line also exports MASTER_ADDR (rank 0's node) and MASTER_PORT."""
    ordered = _check(ranks)
    out = [
        f"# Open MPI appfile: {len(ordered)} ranks, one per line in rank order.\n",
        "# Run: mpirun --app this-file (each line is one process; its GPU via CUDA_VISIBLE_DEVICES).\n",
    ]
    program = " ".join(_q(a) for a in ("python", entrypoint))
    master = [f"-x {_q(f'{k}={v}')}" for k, v in _master_env(ordered, master_port, master_addr)]
    for r in ordered:
        env = [f"-x {_q('CUDA_VISIBLE_DEVICES=' + str(r['gpu']))}", *master]
        hca = nccl_ib_hca(r["nic"])
        if hca:
            env.append(f"-x {_q('NCCL_IB_HCA=' + hca)}")
        out.append(f"-np 1 --host {_q(r['node'])} {' '.join(env)} {program}\n")
    return "".join(out)


def slurm_hostfile(ranks: Sequence[dict[str, Any]]) -> str:
    """SLURM_HOSTFILE for `srun --distribution=arbitrary`: one host per line, in rank order."""
    return "".join(f"{r['node']}\n" for r in _check(ranks))


def slurm_script(
    ranks: Sequence[dict[str, Any]],
    *,
    entrypoint: str = "train.py",
    job: str = "job",
    master_port: int | None = None,
    master_addr: str | None = None,
) -> str:
    """A bash script for a Slurm allocation holding the job's nodes: it writes SLURM_HOSTFILE
    (task N on the host of rank N) and runs `srun --distribution=arbitrary` through a wrapper that
    binds each task to its planned GPU and NIC by SLURM_PROCID (`--gpu-bind=map_gpu:` maps by
    local task id with one list for every node, which an irregular placement cannot express)."""
    ordered = _check(ranks)
    hostfile = f"topoweb-hosts-{re.sub(r'[^A-Za-z0-9._-]', '_', job) or 'job'}.txt"
    gpus = _bash_array([r["gpu"] for r in ordered])
    hcas = _bash_array([nccl_ib_hca(r["nic"]) for r in ordered])
    wrapper = (
        f"G={gpus}; H={hcas}; "
        "export CUDA_VISIBLE_DEVICES=${G[$SLURM_PROCID]}; "
        '[ -n "${H[$SLURM_PROCID]}" ] && export NCCL_IB_HCA=${H[$SLURM_PROCID]}; '
        'exec "$@"'
    )
    lines = [
        "#!/usr/bin/env bash\n",
        f"# {len(ordered)} tasks, task N on the host of rank N with its planned GPU. Run inside an\n",
        "# allocation of these nodes (sbatch/salloc --nodelist=...). The hostfile alone: ?format=slurm-hostfile\n",
        "set -euo pipefail\n",
        f"cat > {_q(hostfile)} <<'TOPOWEB_HOSTS'\n",
        slurm_hostfile(ordered),
        "TOPOWEB_HOSTS\n",
        f'export SLURM_HOSTFILE="$PWD"/{_q(hostfile)}\n',
        *(f"export {k}={_q(v)}\n" for k, v in _master_env(ordered, master_port, master_addr)),
        f"srun --ntasks={len(ordered)} --distribution=arbitrary"
        f" bash -c {_q(wrapper)} _ python {_q(entrypoint)}\n",
    ]
    return "".join(lines)


def _comment(value: Any) -> str:
    """A value shown in a `#` comment line: control characters (a newline would end the comment
    and start a command) are written as escapes."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


def torchrun_commands(
    ranks: Sequence[dict[str, Any]],
    *,
    entrypoint: str = "train.py",
    master_port: int = DEFAULT_MASTER_PORT,
    master_addr: str | None = None,
) -> str:
    """One torchrun command per node (`--nnodes --node-rank --nproc-per-node --master-addr`).

    CUDA_VISIBLE_DEVICES lists the node's planned GPUs in local-rank order, so that
    `torch.cuda.set_device(LOCAL_RANK)` selects the planned GPU; a wrapper exports each local
    process's planned global RANK and NCCL_IB_HCA from tables indexed by torchrun's LOCAL_RANK.
    The master is the node of rank 0. Every value in a command is shell-quoted and comments hold no
    control characters, whatever the names are (spec v1 names are host-name-like, but rows may
    predate that rule).
    """
    nodes = nodes_in_rank_order(ranks)
    if not nodes:
        return ""
    master = master_addr or nodes[0]["node"]
    world = sum(len(n["ranks"]) for n in nodes)
    out = [
        f"# {world} ranks on {len(nodes)} nodes; run each block on its node;"
        f" master {_comment(master)}:{_comment(master_port)}\n"
    ]
    for n in nodes:
        local = n["ranks"]
        visible = ",".join(str(r["gpu"]) for r in local)
        out.append(f"\n# node {_comment(n['node'])} (node rank {n['node_rank']}): {len(local)} processes\n")
        for r in local:
            hca = nccl_ib_hca(r["nic"])
            env = f"GPU {_comment(r['gpu'])} (cuda:{r['local_rank']})" + (
                f" NCCL_IB_HCA={_comment(hca)}" if hca else ""
            )
            out.append(f"#   local rank {r['local_rank']} -> rank {r['rank']}: {env}\n")
        wrapper = (
            f"R={_bash_array([r['rank'] for r in local])}; H={_bash_array([nccl_ib_hca(r['nic']) for r in local])}; "
            "export RANK=${R[$LOCAL_RANK]}; "
            '[ -n "${H[$LOCAL_RANK]}" ] && export NCCL_IB_HCA=${H[$LOCAL_RANK]}; '
            'exec "$@"'
        )
        out.append(
            f"CUDA_VISIBLE_DEVICES={_q(visible)} torchrun"
            f" --nnodes={len(nodes)}"
            f" --node-rank={n['node_rank']}"
            f" --nproc-per-node={len(local)}"
            f" --master-addr={_q(master)}"
            f" --master-port={int(master_port)}"
            f" --no-python bash -c {_q(wrapper)} _ python {_q(entrypoint)}\n"
        )
    return "".join(out)


def rankmap_json(
    ranks: Sequence[dict[str, Any]],
    *,
    job: str = "",
    master_port: int = DEFAULT_MASTER_PORT,
    master_addr: str | None = None,
) -> dict:
    """The rank map as data: world size, master, per-node ranks and per-rank GPU, NIC and env."""
    nodes = nodes_in_rank_order(ranks)
    per_rank = []
    for n in nodes:
        visible = ",".join(str(r["gpu"]) for r in n["ranks"])
        for r in n["ranks"]:
            # As the node agent sets it: the node's GPUs in local-rank order.
            env = {"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": str(r["local_rank"])}
            if r["nic"]:
                env["NCCL_IB_HCA"] = nccl_ib_hca(r["nic"])
            per_rank.append(
                {
                    "rank": r["rank"],
                    "node": r["node"],
                    "gpu": r["gpu"],
                    "nic": r["nic"],
                    "node_rank": n["node_rank"],
                    "local_rank": r["local_rank"],
                    "env": env,
                }
            )
    per_rank.sort(key=lambda r: r["rank"])
    return {
        "job": job,
        "world_size": len(per_rank),
        "master_addr": (master_addr or nodes[0]["node"]) if nodes else None,
        "master_port": master_port,
        "nodes": [
            {"node": n["node"], "node_rank": n["node_rank"], "ranks": [r["rank"] for r in n["ranks"]]}
            for n in nodes
        ],
        "ranks": per_rank,
    }
