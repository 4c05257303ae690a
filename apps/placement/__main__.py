"""Placement CLI: `python -m apps.placement {place,evaluate,bound} ...`, JSON out on stdout.

  place    --topology T --job J [--policy P] [--busy B] [--seed S]
  evaluate --topology T --job J --ranks R [--busy B]
  bound    --topology T --job J [--busy B]
  simulate --topology T --trace X [--policies P,Q] ... (see apps/placement/sim/cli.py)
  convert  --from F --to G IN... [-o OUT] [--defaults D] [--set KEY=VALUE]  (see convert/cli.py)

T and J are topology / job spec v1 files (YAML or JSON). B is a JSON list of {"node", "gpu"} that
are taken. R is a JSON file holding a placement output or just its `ranks` list. The output is the
placement output of job spec v1 plus `lower_bound` and `gap` (`bounds.gap`: predicted comm_ms /
bound comm_ms, 1.0 when both are 0, null when only the bound is 0); `place` adds `vs_naive`, the
naive policy's predicted times and their ratio to this placement's. With --busy, `lower_bound` and
`gap` are against the placements on the free GPUs only (`lower_bound(..., free=...)`), so `gap`
measures the placement rather than the fragmentation (`evaluate --busy` then refuses ranks on busy
GPUs); without it, against the empty cluster. `bound --busy` bounds the same free-set placements.
Exit status: 0 done, 1 the job does not fit (the reason is in the JSON), 2 bad input (one line on
stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from .bounds import gap, lower_bound
from .convert import cli as convert_cli
from .costmodel import Prediction, evaluate
from .costmodel.speed import check_job_models
from .jobs import JobSpec, load_job
from .sim import cli as sim_cli
from .solvers import POLICIES, NoFit, Placement, place, placement_output, prediction_output
from .topology import (
    JOB_LIMITS,
    TOPOLOGY_LIMITS,
    SpecError,
    SpecLimits,
    Topology,
    load_topology,
    read_spec_file,
)


class InputError(Exception):
    """Bad input the CLI reports on one line and exits 2 for."""


def _read_spec(path: str, flag: str, limits: SpecLimits = TOPOLOGY_LIMITS) -> Any:
    try:
        return _flagged(flag, read_spec_file, path, limits)
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from exc


def _read_json(path: str, flag: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag}: {path} is not valid JSON: {exc}") from exc


def _flagged(flag: str, fn, *args):
    """Run a loader; a SpecError becomes an InputError that names the file's flag."""
    try:
        return fn(*args)
    except SpecError as exc:
        raise InputError(f"{flag}: {exc}") from exc


def _clean(value: Any) -> Any:
    """JSON-safe copy: infinite or NaN numbers (unreachable GPUs) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _gpu_ref(topology: Topology, item: Any, path: str) -> int:
    """The gid of one {"node", "gpu"} entry; SpecError naming the entry's field otherwise."""
    if not isinstance(item, dict):
        raise SpecError([(path, f"must be an object with node and gpu, got {type(item).__name__}")])
    node, gpu = item.get("node"), item.get("gpu")
    if node not in topology.node_by_name:
        raise SpecError([(f"{path}.node", f"unknown node {node!r}")])
    if isinstance(gpu, bool) or not isinstance(gpu, int):
        raise SpecError([(f"{path}.gpu", f"must be a GPU index, got {gpu!r}")])
    try:
        return topology.gid(node, gpu)
    except KeyError:
        count = int(topology.node_gpu_count[topology.node_by_name[node]])
        raise SpecError([(f"{path}.gpu", f"node {node!r} has GPUs 0..{count - 1}, got {gpu}")]) from None


def busy_mask(topology: Topology, busy: Any):
    """Free mask from a --busy list of {"node", "gpu"} (each taken GPU listed once or more)."""
    if not isinstance(busy, list):
        raise SpecError([("busy", f"must be a list of {{node, gpu}}, got {type(busy).__name__}")])
    free = topology.free_mask()
    for i, item in enumerate(busy):
        free[_gpu_ref(topology, item, f"busy[{i}]")] = False
    return free


def ranks_gids(topology: Topology, job: JobSpec, data: Any) -> tuple[list[int], str | None]:
    """(gids by rank, policy if given) from a placement output or its `ranks` list."""
    policy = None
    if isinstance(data, dict):
        policy = data.get("policy") if isinstance(data.get("policy"), str) else None
        if "ranks" not in data:
            raise SpecError([("ranks", "a placement output needs a ranks list")])
        data = data["ranks"]
    if not isinstance(data, list):
        raise SpecError([("ranks", f"must be a list of {{rank, node, gpu}}, got {type(data).__name__}")])
    if len(data) != job.gpus:
        raise SpecError([("ranks", f"job {job.name!r} has {job.gpus} ranks, got {len(data)} entries")])
    gids: list[int | None] = [None] * job.gpus
    owner: dict[int, int] = {}
    for i, item in enumerate(data):
        path = f"ranks[{i}]"
        rank = item.get("rank") if isinstance(item, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < job.gpus:
            raise SpecError([(f"{path}.rank", f"must be a rank in 0..{job.gpus - 1}, got {rank!r}")])
        if gids[rank] is not None:
            raise SpecError([(f"{path}.rank", f"rank {rank} is listed twice")])
        gid = _gpu_ref(topology, item, path)
        if gid in owner:
            node, index = topology.gpu_key(gid)
            raise SpecError([(path, f"{node} GPU {index} is already rank {owner[gid]}'s")])
        owner[gid] = rank
        gids[rank] = gid
    return [int(g) for g in gids], policy


def _bound_fields(prediction: Prediction, bound: Prediction) -> dict:
    # An infinite gap (only the bound is 0) becomes null in the JSON, like other infinities.
    return {
        "lower_bound": {"comm_ms": bound.comm_ms, "step_ms": bound.step_ms},
        "gap": gap(prediction.comm_ms, bound.comm_ms),
    }


def _gap_bound(topology: Topology, job: JobSpec, args: argparse.Namespace, free) -> Prediction:
    """The bound `gap` is against: over the free GPUs with --busy, else the empty cluster."""
    return lower_bound(topology, job) if args.busy is None else lower_bound(topology, job, free=free)


def _ratio(a: float, b: float) -> float | None:
    if b > 0:
        return a / b
    return 1.0 if a == 0 else None


def _free(topology: Topology, args: argparse.Namespace):
    """The free mask: every GPU, less those in --busy when it is given."""
    if args.busy is None:
        return topology.free_mask()
    return _flagged("--busy", busy_mask, topology, _read_json(args.busy, "--busy"))


def _read_topology(path: str, flag: str) -> Topology:
    """A topology spec file read and validated; InputError naming `flag` otherwise."""
    return _flagged(flag, load_topology, _read_spec(path, flag))


def cmd_place(topology: Topology, job: JobSpec, args: argparse.Namespace) -> tuple[dict, int]:
    free = _free(topology, args)
    policy = args.policy or job.policy or "topo"
    result = place(topology, free, None, job, policy=policy, seed=args.seed)
    if isinstance(result, NoFit):
        return {"job": job.name, "policy": policy, "no_fit": result.reason}, 1
    out = placement_output(topology, job, result)
    out.update(_bound_fields(result.prediction, _gap_bound(topology, job, args, free)))
    naive = result if policy == "naive" else place(topology, free, None, job, policy="naive")
    if isinstance(naive, Placement):
        p, q = result.prediction, naive.prediction
        out["vs_naive"] = {
            "policy": "naive",
            "comm_ms": q.comm_ms,
            "step_ms": q.step_ms,
            "step_ratio": _ratio(q.step_ms, p.step_ms),
            "comm_ratio": _ratio(q.comm_ms, p.comm_ms),
        }
    return out, 0


def cmd_evaluate(topology: Topology, job: JobSpec, args: argparse.Namespace) -> tuple[dict, int]:
    gids, policy = _flagged("--ranks", ranks_gids, topology, job, _read_json(args.ranks, "--ranks"))
    free = _free(topology, args)
    for rank, gid in enumerate(gids):
        # The free-set bound holds for placements on free GPUs only.
        if not free[gid]:
            node, index = topology.gpu_key(gid)
            raise InputError(f"--ranks: rank {rank} is on {node} GPU {index}, which --busy lists as taken")
    prediction = evaluate(topology, job, gids)
    out = placement_output(topology, job, Placement(policy or "given", tuple(gids), prediction))
    out.update(_bound_fields(prediction, _gap_bound(topology, job, args, free)))
    return out, 0


def cmd_bound(topology: Topology, job: JobSpec, args: argparse.Namespace) -> tuple[dict, int]:
    if args.busy is None:
        bound = lower_bound(topology, job)
    else:
        free = _free(topology, args)
        n_free = int(free.sum())
        # A job larger than the free GPUs has no placement to bound.
        if job.gpus > n_free:
            return {"job": job.name, "no_fit": f"needs {job.gpus} GPUs, {n_free} are free"}, 1
        bound = lower_bound(topology, job, free=free)
    return {"job": job.name, "lower_bound": prediction_output(bound)}, 0


def parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m apps.placement",
        description="Place, price and bound training jobs on a topology (JSON out).",
        epilog="exit status: 0 done, 1 the job does not fit (the reason is in the JSON), 2 bad input",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("place", "place a job by a policy and price it"),
        ("evaluate", "price a given rank-to-GPU mapping"),
        ("bound", "the lower bound of a job's communication on a topology"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--topology", required=True, help="topology spec v1 file (YAML or JSON)")
        s.add_argument("--job", required=True, help="job spec v1 file (YAML or JSON)")
        if name in ("place", "evaluate", "bound"):
            s.add_argument("--busy", help='JSON file: list of {"node", "gpu"} already taken')
        if name == "place":
            s.add_argument("--policy", choices=POLICIES, help="default: the job's policy, else topo")
            s.add_argument("--seed", type=int, default=0, help="seed of the random policy")
        if name == "evaluate":
            s.add_argument("--ranks", required=True, help="JSON file: a placement output or its ranks list")
    sim_cli.add_parser(sub)
    convert_cli.add_parser(sub)
    return p


COMMANDS = {"place": cmd_place, "evaluate": cmd_evaluate, "bound": cmd_bound}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 done, 1 no fit, 2 bad input)."""
    args = parser().parse_args(argv)
    if args.command == "convert":
        return convert_cli.run(args)
    try:
        if args.command == "simulate":
            return sim_cli.run(args, _read_topology)
        topology = _flagged("--topology", load_topology, _read_spec(args.topology, "--topology"))
        job = _flagged("--job", load_job, _read_spec(args.job, "--job", JOB_LIMITS))
        _flagged("--job", check_job_models, topology, job)
        out, status = COMMANDS[args.command](topology, job, args)
    except InputError as exc:
        message = " ".join(str(exc).split())
        print(f"error: {message}", file=sys.stderr)
        return 2
    json.dump(_clean(out), sys.stdout, allow_nan=False)
    sys.stdout.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
