"""One TopoWeb job generation as one Slurm submission (no Django).

The planned rank map decides everything: each node it uses becomes one component of a
heterogeneous job pinned to that node (every other node excluded) with as many tasks and GPUs as
the plan puts there, so Slurm allocates exactly the planned nodes and per-node GPU counts. The
batch script starts every component's tasks with one `srun`; each task's wrapper finds its rank
from (SLURMD_NODENAME, SLURM_LOCALID) in the embedded rank map and exports the launch contract
exactly as the node agent does (`apps.agent.env.plan_env`: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, NCCL_IB_HCA, TOPOWEB_JOB_ID,
TOPOWEB_NODE, TOPOWEB_GENERATION) before it execs the command.

GPUs: CUDA_VISIBLE_DEVICES lists the node's job GPUs in local-rank order, so
`torch.cuda.set_device(LOCAL_RANK)` selects the rank's planned GPU. Each GPU is named as the
step's processes see it: its global index, or under task/cgroup with ConstrainDevices=yes its
position among the GPUs Slurm granted the step (Slurm renumbers them from 0). When Slurm granted
other indexes than planned, the node's ranks take the granted GPUs in the order of their planned
indexes (`bind_granted`), and the server, reading the granted indexes back, records and re-prices
that binding.

Output: each task writes its rank's output (stdout and stderr) to its own file in the job's log
directory, `rank_log_name` (the node agent's rank logs, one file per rank); the Slurm sync reads
those files where the server reaches that directory and stores them as the agent's shipped logs
(apps/executors/slurm/output.py). The Slurm job's own output file keeps Slurm's and srun's
messages.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from apps.agent.env import DEFAULT_LOCALE, DEFAULT_PATH, plan_env
from apps.placement.convert.hostlist import compress

COMMENT_PREFIX = "topoweb"
_SAFE_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class RankSlot:
    """Rank `rank` planned on `node`, GPU index `gpu`, using NIC `nic` ("" for none)."""

    rank: int
    node: str
    gpu: int
    nic: str = ""


class Tag(NamedTuple):
    """What a TopoWeb comment says: which cluster, job and generation, and which TopoWeb server
    (its executor's `server_id`; "" in a comment written before servers were named)."""

    cluster: str
    job_id: int
    generation: int
    server: str = ""


def comment(cluster: str, job_id: int, generation: int, server: str = "") -> str:
    """The Slurm job comment that marks a job as TopoWeb's:
    "topoweb:CLUSTER:JOB:GENERATION:SERVER" (without ":SERVER" when `server` is empty)."""
    tag = f"{COMMENT_PREFIX}:{cluster}:{job_id}:{generation}"
    return f"{tag}:{server}" if server else tag


def parse_comment(text: str) -> Tag | None:
    """The Tag of a TopoWeb comment, None for any other."""
    parts = (text or "").split(":")
    if len(parts) not in (4, 5) or parts[0] != COMMENT_PREFIX or (len(parts) == 5 and not parts[4]):
        return None
    try:
        return Tag(parts[1], int(parts[2]), int(parts[3]), parts[4] if len(parts) == 5 else "")
    except ValueError:
        return None


RANK_LOG = "topoweb-{job}-{generation}-rank{rank}.out"


def rank_log_name(job_id: int, generation: int, rank: int) -> str:
    """The file, in the job's log directory, a Slurm task writes its rank's output to."""
    return RANK_LOG.format(job=int(job_id), generation=int(generation), rank=int(rank))


def node_order(slots: Sequence[RankSlot]) -> list[str]:
    """Nodes in the order of their lowest rank (the heterogeneous job's component order)."""
    out: list[str] = []
    for s in sorted(slots, key=lambda s: s.rank):
        if s.node not in out:
            out.append(s.node)
    return out


def bind_granted(planned: Sequence[int], granted: Sequence[int]) -> list[int]:
    """The GPU each of a node's ranks uses, given its planned indexes (in local-rank order) and
    the indexes Slurm granted: the planned ones when all were granted, else the granted indexes
    handed out in the order of the planned ones (the lowest planned index gets the lowest
    granted, and so on). ValueError when Slurm granted fewer GPUs than ranks."""
    if set(planned) <= set(granted):
        return list(planned)
    if len(granted) < len(planned):
        raise ValueError(f"Slurm granted {len(granted)} GPUs for {len(planned)} ranks")
    order = sorted(range(len(planned)), key=lambda i: (planned[i], i))
    out = [0] * len(planned)
    for pos, i in enumerate(order):
        out[i] = sorted(granted)[pos]
    return out


def granted_map(
    planned: Sequence[tuple[int, str, int]], granted: Mapping[str, Sequence[int]]
) -> dict[int, tuple[str, int]] | None:
    """Rank -> (node, GPU) as the task wrappers bind it, from the planned (rank, node, GPU) rows
    and the GPU indexes Slurm granted per node (`bind_granted` on each node): every rank stays
    on its planned node (each component of the job is pinned to one node), so a TP group planned
    in one node stays there. None when Slurm's record lacks a node's GPUs or has too few."""
    per_node: dict[str, list[tuple[int, int]]] = {}
    for rank, node, gpu in planned:
        per_node.setdefault(node, []).append((rank, gpu))
    out: dict[int, tuple[str, int]] = {}
    for node, items in per_node.items():
        got = granted.get(node)
        if not got:
            return None
        try:
            bound = bind_granted([g for _, g in items], got)
        except ValueError:
            return None
        for (rank, _), gpu in zip(items, bound, strict=True):
            out[rank] = (node, gpu)
    return out


# The task wrapper's run-time part: from the node's planned GPUs (PLANNED, local-rank order) and
# what Slurm granted the step (SLURM_STEP_GPUS: global indexes; CUDA_VISIBLE_DEVICES: the same GPUs
# as the step's processes name them, which task/cgroup with ConstrainDevices=yes renumbers from
# 0), CUDA_VISIBLE_DEVICES becomes the node's job GPUs in local-rank order, named as the step sees
# them. When Slurm granted other indexes than planned, the ranks take the granted ones in the
# order of their planned indexes (`bind_granted`).
_BIND_GPUS = r"""granted="${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}"
IFS=, read -r -a P <<<"$PLANNED"
IFS=, read -r -a G <<<"$granted"
IFS=, read -r -a S <<<"${CUDA_VISIBLE_DEVICES:-$granted}"
if [ "${#S[@]}" != "${#G[@]}" ]; then S=("${G[@]}"); fi
B=("${P[@]}")
if [ "${#G[@]}" -gt 0 ]; then
  all=1
  for p in "${P[@]}"; do case ",$granted," in *",$p,"*) ;; *) all=0 ;; esac; done
  if [ "$all" = 0 ]; then
    if [ "${#G[@]}" -lt "${#P[@]}" ]; then
      echo "topoweb: Slurm granted GPUs $granted for planned GPUs $PLANNED" >&2
      exit 98
    fi
    mapfile -t SG < <(printf '%s\n' "${G[@]}" | sort -n)
    mapfile -t O < <(for i in "${!P[@]}"; do echo "${P[$i]} $i"; done | sort -n -k1,1 -k2,2n | cut -d' ' -f2)
    for pos in "${!O[@]}"; do B[${O[$pos]}]=${SG[$pos]}; done
  fi
fi
vis=""
for b in "${B[@]}"; do
  name=$b
  for i in "${!G[@]}"; do if [ "${G[$i]}" = "$b" ]; then name=${S[$i]}; fi; done
  vis="$vis${vis:+,}$name"
done
unset GPU_DEVICE_ORDINAL ROCR_VISIBLE_DEVICES
U=$(id -un)
export USER="$U" LOGNAME="$U" HOME="$(getent passwd "$U" | cut -d: -f6)"
export CUDA_VISIBLE_DEVICES="$vis" TOPOWEB_SLURM_GRANTED_GPUS="$granted"
"""


def _wrapper(
    slots: Sequence[RankSlot],
    command: Sequence[str],
    world: int,
    master: str,
    port: int,
    job_id: int,
    generation: int,
    log_dir: str,
) -> str:
    """The bash text every task runs (given as `bash -c`): each rank's launch contract is
    `apps.agent.env.plan_env`'s, as the node agent sets it, but for CUDA_VISIBLE_DEVICES, which
    names the planned GPUs as Slurm exposes them (`_BIND_GPUS`); the rank's output goes to its
    own file in `log_dir` (`rank_log_name`; left to Slurm's output file when it cannot be
    written)."""
    by_rank = sorted(slots, key=lambda s: s.rank)
    nodes = node_order(by_rank)
    head, tail = RANK_LOG.format(job=int(job_id), generation=int(generation), rank="\0").split("\0")
    ranks = [{"rank": s.rank, "node": s.node, "gpu": s.gpu, "nic": s.nic} for s in by_rank]
    lines = ["set -e", 'case "${SLURMD_NODENAME}:${SLURM_LOCALID}" in']
    for node_rank, node in enumerate(nodes):
        work = {
            "job": job_id,
            "generation": generation,
            "world_size": world,
            "master_addr": master,
            "master_port": port,
            "node_rank": node_rank,
            "ranks": ranks,
        }
        for plan in plan_env(work, node):
            env = dict(plan.env)
            planned = env.pop("CUDA_VISIBLE_DEVICES")
            words = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
            lines.append(
                f"  {shlex.quote(f'{node}:{plan.local_rank}')}) export {words}; PLANNED={shlex.quote(planned)} ;;"
            )
    lines += [
        '  *) echo "topoweb: no rank planned for task ${SLURMD_NODENAME}:${SLURM_LOCALID}" >&2; exit 97 ;;',
        "esac",
        f'LOG={shlex.quote(log_dir.rstrip("/") + "/" + head)}"$RANK"{shlex.quote(tail)}',
        'if : 2>/dev/null >"$LOG"; then exec >>"$LOG" 2>&1; else echo "topoweb: cannot write $LOG" >&2; fi',
        _BIND_GPUS.rstrip("\n"),
        "exec " + " ".join(shlex.quote(a) for a in command),
    ]
    return "\n".join(lines) + "\n"


def submission(
    *,
    cluster: str,
    job_id: int,
    generation: int,
    name: str,
    slots: Sequence[RankSlot],
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    master_addr: str,
    master_port: int,
    all_nodes: Iterable[str],
    partition: str = "",
    output: str = "",
    time_limit_min: int | None = None,
    server: str = "",
    log_dir: str = "",
) -> dict[str, Any]:
    """The slurmrestd v0.0.38 submission body for one job generation (see the module doc).

    Every component carries the comment (so any record of the job says whose it is) and
    `no_requeue`: v0.0.38 reads `"requeue": false` as `--requeue` (its option parser sets the
    flag whatever the value), and only the undocumented `no_requeue` key turns Slurm's requeue
    off. TopoWeb requeues its jobs itself (`launch.requeue`)."""
    if not slots:
        raise ValueError("a job needs at least one rank")
    if not command:
        raise ValueError("launch.command is empty")
    ranks = sorted(s.rank for s in slots)
    if ranks != list(range(len(ranks))):
        raise ValueError("ranks must be 0..N-1, each once")
    for key in env:
        if not _SAFE_ENV.match(str(key)):
            raise ValueError(f"launch.env: {key!r} is not an environment variable name")
    nodes = node_order(slots)
    every = list(dict.fromkeys(all_nodes))
    missing = [n for n in nodes if n not in every]
    if missing:
        raise ValueError(f"nodes not in the Slurm cluster: {', '.join(missing)}")
    counts = {n: sum(1 for s in slots if s.node == n) for n in nodes}
    environment = {"PATH": DEFAULT_PATH, "LANG": DEFAULT_LOCALE, **{str(k): str(v) for k, v in env.items()}}
    environment["TOPOWEB_JOB_ID"] = str(job_id)
    environment["TOPOWEB_GENERATION"] = str(generation)
    tag = comment(cluster, job_id, generation, server)
    out = output or f"{workdir.rstrip('/') or ''}/topoweb-{job_id}-{generation}-%j.out"
    components = []
    for i, node in enumerate(nodes):
        others = [n for n in every if n != node]
        comp: dict[str, Any] = {
            "nodes": "1",
            "tasks": counts[node],
            "gres": f"gpu:{counts[node]}",
            "environment": environment,
            "comment": tag,
            "no_requeue": True,
        }
        if others:
            comp["exclude_nodes"] = compress(others)
        if partition:
            comp["partition"] = partition
        if i == 0:
            comp.update(
                {
                    "name": name,
                    "current_working_directory": workdir,
                    "standard_output": out,
                    "standard_error": out,
                }
            )
            if time_limit_min:
                comp["time_limit"] = int(time_limit_min)
        components.append(comp)
    logs = log_dir or out.rsplit("/", 1)[0] or "/"
    wrapper = _wrapper(slots, command, len(slots), master_addr, master_port, job_id, generation, logs)
    if len(components) == 1:
        srun = f'srun --kill-on-bad-exit=1 -n {counts[nodes[0]]} bash -c "$W" topoweb-rank'
    else:
        parts = [f'-n {counts[n]} --het-group={i} bash -c "$W" topoweb-rank' for i, n in enumerate(nodes)]
        srun = "srun --kill-on-bad-exit=1 " + " : ".join(parts)
    steps = [f"W={shlex.quote(wrapper)}", srun]
    script = "\n".join(
        [
            "#!/bin/bash",
            f"# TopoWeb job {job_id} generation {generation} on cluster {cluster}: {len(slots)} ranks on {', '.join(nodes)}",
            *steps,
            "",
        ]
    )
    body: dict[str, Any] = {"script": script}
    if len(components) == 1:
        body["job"] = components[0]
    else:
        body["jobs"] = components
    return body
