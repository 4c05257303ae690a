"""TopoWeb's placement against three Slurm requests, on a real Slurm, at the same fragmentation.

Runs on any Slurm 22.05 with slurmrestd and auth/jwt that this host can reach as root (`sbatch`,
`squeue`, `scontrol` through --slurm-conf; slurmrestd on --socket; its jwt key): the nodes, their
GPUs and the leaf switches are read from that Slurm (slurmrestd's nodes and `scontrol show
topology`), as `manage.py slurm_connect` reads them. The local Slurm (`bash scripts/slurm-local.sh
start`: 16 nodes x 8 GPUs under 4 leaves) is the default; the script's header shows how to start a
second shape beside it. Creates a scratch Postgres database (dropped at the end) and works
in-process through TopoWeb's services.

1. Fragmentation: background jobs of 1 to 6 GPUs (at most a node's) are submitted straight to
   Slurm (`sbatch -w NODE`, seeded) until about --busy of the GPUs are taken; they run for the
   whole bench, and TopoWeb sees them as foreign allocations.
2. Workload: --jobs jobs of 8 to 64 GPUs with the simulator's trace profiles (dense LLMs with
   tp8 x pp x dp, MoE with ep8, data-parallel CNN/BERT; `apps.placement.sim.profiles`), none
   larger than the free GPUs.
3. Each job, alone on the fragmented cluster, is asked of Slurm three ways and run through
   TopoWeb:
   - plain: `sbatch --ntasks=G --gpus-per-task=1`;
   - topology-aware: `--switches=1` (all nodes under one leaf switch), and whole nodes when the
     job's TP group fills a node or more (`--nodes=G/K --ntasks-per-node=K --gres=gpu:K`, K the
     node's GPUs, when tp >= min(8, K) and K divides G), else `--ntasks=G --gpus-per-task=1`;
   - exclusive: `--ntasks=G --gpus-per-task=1 --exclusive` (nodes no other job uses);
   - TopoWeb: submitted to TopoWeb, placed by the cluster's policy (topo), submitted to Slurm by
     the Slurm executor; the GPUs each rank got are read back from Slurm.
   A Slurm request that has not started within --start-timeout is counted as not started (Slurm
   keeps a `--switches` job pending up to its max_switch_wait, 300 s by default, then runs it
   across more switches). In a started Slurm job every task reports (SLURM_PROCID, node,
   SLURM_LOCALID) and the job record's GRES IDX gives the granted GPUs: rank r's GPU is the
   LOCALID-th granted GPU of its node (LOCAL_RANK selects it, as frameworks do).
   Every allocation, as Slurm made it, is priced with the cost model (no other traffic).
Reported per request: how many jobs Slurm started, and over those the geomean of TopoWeb's comm
and step time over the request's, the worst comm ratio and how many jobs the request spread over
more leaf switches. Every run records the load average (the machine may be shared).

    .venv/bin/python bench/slurm_vs_topo.py [--slurm-conf PATH] [--socket PATH] [--jwt-key PATH]
        [--jobs 10] [--busy 0.4] [--seed 0] [--start-timeout 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import scratch_db
from figures import figure

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LOCAL_CONF = "/tmp/topoweb-slurm/etc/slurm.conf"  # scripts/slurm-local.sh
SIZES = (8, 16, 16, 24, 32, 32, 48, 64)
REQUESTS = ("plain", "topology", "exclusive")
ENV = dict(os.environ)


def sh(*args: str, check: bool = True) -> str:
    return subprocess.run(
        list(args), capture_output=True, text=True, env=ENV, check=check, timeout=120
    ).stdout


def squeue_state(job: int) -> str:
    return sh("squeue", "-h", "-j", str(job), "-o", "%T", check=False).strip()


def wait_running(job: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while squeue_state(job) != "RUNNING":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def fragment(busy: float, seed: int, nodes: dict[str, int]) -> list[int]:
    """Background sbatch jobs of 1-6 GPUs (at most a node's) until about `busy` of the GPUs are
    taken."""
    rng = random.Random(seed)
    names = sorted(nodes)
    total = sum(nodes.values())
    jobs, taken, tries = [], 0, 0
    while taken < busy * total and tries < 20 * len(names):
        tries += 1
        node = rng.choice(names)
        g = min(rng.choice((1, 2, 2, 3, 4, 6)), nodes[node])
        out = sh(
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-w",
            node,
            f"--gres=gpu:{g}",
            "--wrap",
            "sleep 3600",
            check=False,
        )
        if not out.strip():
            continue
        job = int(out.strip().split(";")[0])
        deadline = time.monotonic() + 5
        while squeue_state(job) == "PENDING" and time.monotonic() < deadline:
            time.sleep(0.1)
        if squeue_state(job) != "RUNNING":
            sh("scancel", str(job), check=False)  # that node is full: try another
            continue
        jobs.append(job)
        taken += g
    return jobs


def request_args(kind: str, spec, per_node: int) -> list[str]:
    """The sbatch options of request `kind` for `spec` on nodes of `per_node` GPUs."""
    g = spec.gpus
    per_task = [f"--ntasks={g}", "--gpus-per-task=1", "--cpus-per-task=1"]
    if kind == "plain":
        return per_task
    if kind == "exclusive":
        return [*per_task, "--exclusive"]
    if spec.tp >= min(8, per_node) and g % per_node == 0:
        whole = [
            f"--nodes={g // per_node}",
            f"--ntasks-per-node={per_node}",
            f"--gres=gpu:{per_node}",
            "--cpus-per-task=1",
        ]
        return ["--switches=1", *whole]
    return ["--switches=1", *per_task]


def slurm_request(kind: str, client, topology, spec, per_node: int, shared: Path, timeout: float):
    """Request `kind` of `spec.gpus` tasks with a GPU each; rank r's gid as Slurm laid it out, or
    None when Slurm did not start it within `timeout` seconds."""
    out = shared / f"{kind}-{spec.name}.ranks"
    script = f"srun bash -c 'echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID' > {out}\nsleep 600\n"
    job = int(
        sh("sbatch", "--parsable", "-o", "/dev/null", *request_args(kind, spec, per_node), "--wrap", script)
        .strip()
        .split(";")[0]
    )
    try:
        if not wait_running(job, timeout):
            return None
        deadline = time.monotonic() + 60
        while not out.exists() or len(out.read_text().split("\n")) <= spec.gpus:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm job {job}: its tasks did not all report")
            time.sleep(0.2)
        (record,) = client.job(job)
        granted = {node: sorted(idx) for node, idx in record.gpus.items()}
        gids = [0] * spec.gpus
        for line in out.read_text().split("\n"):
            if not line.strip():
                continue
            rank, node, local = line.split()
            gids[int(rank)] = topology.gid(node, granted[node][int(local)])
        return tuple(gids)
    finally:
        sh("scancel", str(job), check=False)
        while squeue_state(job) not in ("", "CANCELLED", "COMPLETED"):
            time.sleep(0.2)


def through_topoweb(cluster, user, spec_dict: dict) -> tuple[tuple[int, ...], object]:
    from apps.executors.slurm.sync import slurm_sync
    from apps.scheduling import snapshot as snap
    from apps.scheduling.choices import JobStatus
    from apps.scheduling.cycle import schedule_cluster
    from apps.scheduling.models import Allocation
    from apps.scheduling.services import job_cancel, job_submit

    job = job_submit(user=user, spec=spec_dict, cluster=cluster)
    schedule_cluster(cluster=cluster)
    deadline = time.monotonic() + 90
    while True:
        slurm_sync(executor=cluster.executor)
        job.refresh_from_db()
        if job.status == JobStatus.RUNNING:
            break
        if (
            job.status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.COMPLETED)
            or time.monotonic() > deadline
        ):
            raise RuntimeError(f"TopoWeb job {job.pk} is {job.status}: {job.pending_reason}")
        time.sleep(0.3)
    topology = snap.cluster_snapshot(cluster=cluster).topology
    rows = Allocation.objects.filter(job=job, generation=job.generation, live=True).order_by("rank")
    gids = tuple(topology.gid(a.node_name, a.gpu_index) for a in rows)
    job_cancel(job=job)
    # Its GPUs are free once a sync saw Slurm stop it (the next job is placed on a clean slate).
    deadline = time.monotonic() + 60
    while Allocation.objects.filter(job=job, live=True).exists() and time.monotonic() < deadline:
        time.sleep(0.3)
        slurm_sync(executor=cluster.executor)
    return gids, job


def leaves(topology, gids) -> int:
    return len({int(topology.gpu_leaf[g]) for g in gids})


def summarize(rows: list[dict], kind: str) -> dict:
    """Request `kind` over the jobs Slurm started: TopoWeb's comm and step over the request's."""
    started = [r for r in rows if r[kind] is not None]
    comm = [r["topo_comm_ms"] / r[kind]["comm_ms"] for r in started if r[kind]["comm_ms"] > 0]
    step = [r["topo_step_ms"] / r[kind]["step_ms"] for r in started]
    return {
        "started": len(started),
        "jobs": len(rows),
        "geomean_comm_ratio": geomean(comm),
        "worst_comm_ratio": max(comm) if comm else None,
        "geomean_step_ratio": geomean(step),
        "more_leaves": sum(r[kind]["leaves"] > r["topo_leaves"] for r in started),
        "fewer_leaves": sum(r[kind]["leaves"] < r["topo_leaves"] for r in started),
    }


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--slurm-conf", default=LOCAL_CONF, help="the Slurm's slurm.conf (default: the local Slurm's)"
    )
    ap.add_argument("--socket", help="slurmrestd's unix socket (default: rest/slurmrestd.sock beside etc/)")
    ap.add_argument("--jwt-key", help="the Slurm's jwt HS256 key (default: jwt_hs256.key beside slurm.conf)")
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--busy", type=float, default=0.4, help="share of GPUs the background jobs take")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--start-timeout", type=float, default=20.0, help="seconds a Slurm request may wait to start"
    )
    ap.add_argument("--json", help="write the results here")
    scratch_db.add_arguments(ap, "slurm")
    args = ap.parse_args()
    for name, value, low, high in (
        ("jobs", args.jobs, 1, 100),
        ("busy", args.busy, 0.0, 0.9),
        ("start-timeout", args.start_timeout, 1, 600),
    ):
        if not low <= value <= high:
            ap.error(f"--{name} must be within {low}..{high}")
    conf = Path(args.slurm_conf).resolve()
    if not conf.is_file():
        ap.error(f"--slurm-conf: no file {conf}")
    socket = args.socket or str(conf.parent.parent / "rest" / "slurmrestd.sock")
    socket = socket if socket.startswith("unix:") else f"unix:{socket}"
    key_path = Path(args.jwt_key) if args.jwt_key else conf.parent / "jwt_hs256.key"
    # Every Slurm command, the bench's and TopoWeb's (`connect.slurm_env`), talks to that Slurm.
    os.environ["SLURM_CONF"] = ENV["SLURM_CONF"] = str(conf)
    if "is UP" not in sh("scontrol", "ping", check=False):
        raise SystemExit(f"the Slurm of {conf} does not answer (scontrol ping)")
    load_before = os.getloadavg()[0]
    with scratch_db.in_process_django(args):
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth import get_user_model

        from apps.executors.slurm.connect import slurm_connect
        from apps.executors.slurm.rest import SlurmRest
        from apps.executors.slurm.sync import slurm_sync
        from apps.placement.costmodel import evaluate
        from apps.placement.jobs import job_to_spec
        from apps.placement.sim.profiles import assign_profiles
        from apps.placement.sim.traces import TraceJob
        from apps.scheduling.snapshot import cluster_snapshot

        key = key_path.read_bytes()
        client = SlurmRest(socket, user="slurm", jwt_key=key)
        # One 50 GB/s NIC per GPU (at most 8 per node), 400 GB/s leaf uplinks: the fabric Slurm
        # does not describe.
        counts = [n.gpus for n in client.nodes() if n.gpus]
        nics = min([8, *counts])
        defaults = {"nics_per_node": nics, "nic_bw_GBps": 50.0, "uplink_bw_GBps": 400.0}
        cluster, _ = slurm_connect(
            name="slurm-bench",
            url=socket,
            defaults=defaults,
            client=client,
            slurm_user="slurm",
            jwt_key=base64.b64encode(key).decode(),
        )
        user = get_user_model().objects.create_user("bench")
        topology = cluster_snapshot(cluster=cluster).topology
        nodes = {n.name: int(c) for n, c in zip(topology.nodes, topology.node_gpu_count, strict=True)}
        per_node = max(nodes.values())
        shape = (
            f"{len(nodes)} nodes, {topology.n_gpus} GPUs ({per_node} per node), "
            f"{len(topology.leaf_names)} leaves (read from {conf})"
        )
        print(shape, flush=True)
        background = fragment(args.busy, args.seed, nodes)
        slurm_sync(executor=cluster.executor)
        free = int(cluster_snapshot(cluster=cluster).free.sum())
        rng = random.Random(args.seed)
        sizes = [g for g in SIZES if g <= free] or [free]
        trace = [TraceJob(f"j{i:02d}", 0.0, rng.choice(sizes), 3600.0) for i in range(args.jobs)]
        profiles = assign_profiles(trace, topology, seed=args.seed)
        print(
            f"{topology.n_gpus - free} of {topology.n_gpus} GPUs taken by {len(background)} sbatch jobs",
            flush=True,
        )
        rows = []
        shared = Path(tempfile.mkdtemp(prefix="slurm-bench-", dir="/tmp"))
        shared.chmod(0o777)
        try:
            for prof in profiles:
                spec = prof.spec
                row = {
                    "job": spec.name,
                    "profile": prof.profile,
                    "gpus": spec.gpus,
                    "shape": f"tp{spec.tp} pp{spec.pp} dp{spec.dp} ep{spec.ep}",
                }
                for kind in REQUESTS:
                    gids = slurm_request(kind, client, topology, spec, per_node, shared, args.start_timeout)
                    if gids is None:
                        row[kind] = None
                        continue
                    p = evaluate(topology, spec, gids)
                    row[kind] = {"comm_ms": p.comm_ms, "step_ms": p.step_ms, "leaves": leaves(topology, gids)}
                data = job_to_spec(spec)
                data.update(cluster=cluster.name, command=["sleep", "600"], workdir=str(shared))
                t_gids, _ = through_topoweb(cluster, user, data)
                pt = evaluate(topology, spec, t_gids)
                row.update(
                    topo_comm_ms=pt.comm_ms, topo_step_ms=pt.step_ms, topo_leaves=leaves(topology, t_gids)
                )
                rows.append(row)
                cells = "  ".join(
                    f"{k} "
                    + (f"{row[k]['comm_ms']:8.2f} ms/{row[k]['leaves']}L" if row[k] else "   not started ")
                    for k in REQUESTS
                )
                print(
                    f"{row['job']} {row['profile']:>10} {row['gpus']:3d} GPUs {row['shape']:>18}: comm {cells}"
                    f"  topo {row['topo_comm_ms']:8.2f} ms/{row['topo_leaves']}L",
                    flush=True,
                )
        finally:
            sh("scancel", *map(str, background), check=False)
            shutil.rmtree(shared, ignore_errors=True)
    summary = {
        "cluster": shape,
        "jobs": len(rows),
        "busy": args.busy,
        "seed": args.seed,
        "start_timeout_s": args.start_timeout,
        "requests": {kind: summarize(rows, kind) for kind in REQUESTS},
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(summary, indent=2))
    print(
        "| request | jobs Slurm started | geomean comm topo/slurm | worst | geomean step | Slurm on more leaves (fewer) |"
    )
    print("|---|---|---|---|---|---|")
    for kind, r in summary["requests"].items():
        print(
            f"| {kind} | {r['started']} of {r['jobs']} | {ratio(r['geomean_comm_ratio'])} | {ratio(r['worst_comm_ratio'])}"
            f" | {ratio(r['geomean_step_ratio'])} | {r['more_leaves']} ({r['fewer_leaves']}) |"
        )
    tag = f"slurm_vs_topo.{len(nodes)}x{per_node}.busy{args.busy:g}"
    for kind, r in summary["requests"].items():
        figure(f"{tag}.{kind}.started", r["started"], "jobs")
        if r["geomean_comm_ratio"] is not None:
            figure(f"{tag}.{kind}.geomean_comm_ratio", r["geomean_comm_ratio"])
            figure(f"{tag}.{kind}.geomean_step_ratio", r["geomean_step_ratio"])
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "jobs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
