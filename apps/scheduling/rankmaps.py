"""Rank maps of a placed job for launchers: Open MPI rankfile, SLURM_HOSTFILE, torchrun, JSON.

All take the job's ranks as `{"rank", "node", "gpu", "nic"}` entries in rank order (see
`selectors.job_ranks`). Nodes are numbered (node rank) by their lowest rank.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

FORMATS = ("openmpi", "slurm-hostfile", "torchrun", "json")
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


def openmpi_rankfile(ranks: Sequence[dict[str, Any]]) -> str:
    """Open MPI rankfile (`mpirun --rankfile F`): one `rank N=host slot=G` line per rank, where G
    is the GPU index on the host that rank N drives."""
    return "".join(f"rank {r['rank']}={r['node']} slot={r['gpu']}\n" for r in _check(ranks))


def slurm_hostfile(ranks: Sequence[dict[str, Any]]) -> str:
    """SLURM_HOSTFILE for `srun --distribution=arbitrary`: one host per line, in rank order."""
    return "".join(f"{r['node']}\n" for r in _check(ranks))


def nccl_ib_hca(nic: str) -> str:
    """NCCL_IB_HCA value selecting exactly one HCA (a leading '=' turns off prefix matching, so
    mlx5_1 does not also pick mlx5_10); empty for a GPU without a NIC."""
    return f"={nic}" if nic else ""


def _comment(value: Any) -> str:
    """A value shown in a `#` comment line: control characters (a newline would end the comment
    and start a command) are written as escapes."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


def torchrun_commands(
    ranks: Sequence[dict[str, Any]],
    *,
    entrypoint: str = "train.py",
    master_port: int = DEFAULT_MASTER_PORT,
) -> str:
    """One torchrun command per node (`--nnodes --node-rank --nproc-per-node --master-addr`).

    Each local process is mapped to its planned global rank, GPU and NIC: a wrapper exports RANK,
    CUDA_VISIBLE_DEVICES (the rank's GPU only, so it is cuda:0 inside the process) and
    NCCL_IB_HCA from tables indexed by torchrun's LOCAL_RANK. The master is the node of rank 0.
    Every value in a command is shell-quoted and comments hold no control characters, whatever the
    names are (spec v1 names are host-name-like, but rows may predate that rule).
    """
    nodes = nodes_in_rank_order(ranks)
    if not nodes:
        return ""
    master = nodes[0]["node"]
    world = sum(len(n["ranks"]) for n in nodes)
    q = shlex.quote
    out = [
        f"# {world} ranks on {len(nodes)} nodes; run each block on its node;"
        f" master {_comment(master)}:{_comment(master_port)}\n"
    ]
    for n in nodes:
        local = n["ranks"]
        out.append(f"\n# node {_comment(n['node'])} (node rank {n['node_rank']}): {len(local)} processes\n")
        for r in local:
            hca = nccl_ib_hca(r["nic"])
            env = f"CUDA_VISIBLE_DEVICES={_comment(r['gpu'])}" + (
                f" NCCL_IB_HCA={_comment(hca)}" if hca else ""
            )
            out.append(f"#   local rank {r['local_rank']} -> rank {r['rank']}: {env}\n")
        rank_table = " ".join(q(str(r["rank"])) for r in local)
        gpu_table = " ".join(q(str(r["gpu"])) for r in local)
        hca_table = " ".join(shlex.quote(nccl_ib_hca(r["nic"])) or "''" for r in local)
        wrapper = (
            f"R=({rank_table}); G=({gpu_table}); H=({hca_table}); "
            "export RANK=${R[$LOCAL_RANK]} CUDA_VISIBLE_DEVICES=${G[$LOCAL_RANK]}; "
            '[ -n "${H[$LOCAL_RANK]}" ] && export NCCL_IB_HCA=${H[$LOCAL_RANK]}; '
            'exec "$@"'
        )
        out.append(
            "torchrun"
            f" --nnodes={len(nodes)}"
            f" --node-rank={n['node_rank']}"
            f" --nproc-per-node={len(local)}"
            f" --master-addr={q(str(master))}"
            f" --master-port={q(str(master_port))}"
            f" --no-python bash -c {q(wrapper)} _ python {q(entrypoint)}\n"
        )
    return "".join(out)


def rankmap_json(
    ranks: Sequence[dict[str, Any]], *, job: str = "", master_port: int = DEFAULT_MASTER_PORT
) -> dict:
    """The rank map as data: world size, master, per-node ranks and per-rank GPU, NIC and env."""
    nodes = nodes_in_rank_order(ranks)
    per_rank = []
    for n in nodes:
        for r in n["ranks"]:
            env = {"CUDA_VISIBLE_DEVICES": str(r["gpu"])}
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
        "master_addr": nodes[0]["node"] if nodes else None,
        "master_port": master_port,
        "nodes": [
            {"node": n["node"], "node_rank": n["node_rank"], "ranks": [r["rank"] for r in n["ranks"]]}
            for n in nodes
        ],
        "ranks": per_rank,
    }
