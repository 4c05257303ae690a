"""Slurm's own placement against TopoWeb's on the same real Slurm, at the same fragmentation.

Needs the local Slurm (`bash scripts/slurm-local.sh start`, root): 16 nodes x 8 GPUs under 4 leaf
switches (`topology/tree`). Creates a scratch Postgres database (dropped at the end) and works
in-process through TopoWeb's services, with the cluster connected to the Slurm as
`manage.py slurm_connect` does.

1. Fragmentation: background jobs of 1 to 6 GPUs are submitted straight to Slurm (`sbatch`,
   seeded sizes) until about --busy of the GPUs are taken; they keep running for the whole run,
   and TopoWeb sees them as foreign allocations.
2. Workload: --jobs jobs of 8 to 64 GPUs with the simulator's trace profiles (dense LLMs with
   tp8 x pp x dp, MoE with ep8, data-parallel CNN/BERT; `apps.placement.sim.profiles`).
   Jobs larger than the free GPUs are left out of the draw.
3. Each job, alone on the fragmented cluster, runs twice:
   - plain `sbatch --ntasks=G --gpus-per-task=1`: Slurm picks the nodes (topology/tree) and the
     GPUs, ranks in block order; every task reports (SLURM_PROCID, node, SLURM_LOCALID) and the
     job record's GRES IDX gives the granted GPUs, so rank r's GPU is the LOCALID-th granted GPU
     of its node (LOCAL_RANK selects it, as frameworks do);
   - through TopoWeb: submitted to TopoWeb, placed by the cluster's policy (topo), submitted
     to Slurm by the Slurm executor; the GPUs each rank got are read back from Slurm (the sync
     rebinds to the granted indexes) once Slurm runs it.
   Both allocations are then priced with the cost model (no other traffic): comm and step time.
Reported: per job both comm times, the ratio, leaf switches spanned; geomean comm ratio, worst
job, and how many jobs Slurm alone spread across more leaf switches. Every run records the load
average (the machine may be shared).

    .venv/bin/python bench/slurm_vs_topo.py [--jobs 12] [--busy 0.4] [--seed 0] [--json out.json]
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
SLURM_CONF = "/tmp/topoweb-slurm/etc/slurm.conf"
ENV = {**os.environ, "SLURM_CONF": SLURM_CONF}
SIZES = (8, 16, 16, 24, 32, 32, 48, 64)


def sh(*args: str, check: bool = True) -> str:
    return subprocess.run(
        list(args), capture_output=True, text=True, env=ENV, check=check, timeout=120
    ).stdout


def squeue_state(job: int) -> str:
    return sh("squeue", "-h", "-j", str(job), "-o", "%T", check=False).strip()


def wait_running(job: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while squeue_state(job) != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurm job {job} did not start ({squeue_state(job)})")
        time.sleep(0.2)


def fragment(busy: float, seed: int, total: int) -> list[int]:
    """Background sbatch jobs of 1-6 GPUs until about `busy` of the GPUs are taken."""
    rng = random.Random(seed)
    jobs, taken = [], 0
    while taken < busy * total:
        g = rng.choice((1, 2, 2, 3, 4, 6))
        node = f"gpu{rng.randint(1, 16):02d}"
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
    for job in jobs:
        wait_running(job)
    return jobs


def slurm_alone(client, topology, spec, shared: Path) -> tuple[int, ...]:
    """Plain sbatch of `spec.gpus` tasks with a GPU each; rank r's gid as Slurm laid it out."""
    out = shared / f"slurm-{spec.name}.ranks"
    script = (
        f"#!/bin/bash\nsrun bash -c 'echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID' > {out}\nsleep 600\n"
    )
    job = int(
        sh(
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            f"--ntasks={spec.gpus}",
            "--gpus-per-task=1",
            "--cpus-per-task=1",
            "--wrap",
            script.split("\n", 1)[1],
        )
        .strip()
        .split(";")[0]
    )
    try:
        wait_running(job)
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
    slurm_sync(executor=cluster.executor)
    return gids, job


def leaves(topology, gids) -> int:
    return len({int(topology.gpu_leaf[g]) for g in gids})


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--busy", type=float, default=0.4, help="share of GPUs the background jobs take")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    scratch_db.add_arguments(ap, "slurm")
    args = ap.parse_args()
    if subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-local.sh"), "status"], capture_output=True
    ).returncode:
        raise SystemExit("the local Slurm is not running: bash scripts/slurm-local.sh start")
    load_before = os.getloadavg()[0]
    with scratch_db.in_process_django(args):
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth import get_user_model

        from apps.executors.slurm.connect import LOCAL_JWT_KEY, LOCAL_SOCKET, slurm_connect
        from apps.executors.slurm.rest import SlurmRest
        from apps.executors.slurm.sync import slurm_sync
        from apps.placement.costmodel import evaluate
        from apps.placement.jobs import job_to_spec
        from apps.placement.sim.profiles import assign_profiles
        from apps.placement.sim.traces import TraceJob

        key = Path(LOCAL_JWT_KEY).read_bytes()  # the local slurmrestd takes rest_auth/jwt
        client = SlurmRest(LOCAL_SOCKET, user="slurm", jwt_key=key)
        defaults = {"nics_per_node": 8, "nic_bw_GBps": 50.0, "uplink_bw_GBps": 400.0}
        cluster, _ = slurm_connect(
            name="slurm-bench",
            url=LOCAL_SOCKET,
            defaults=defaults,
            client=client,
            slurm_user="slurm",
            jwt_key=base64.b64encode(key).decode(),
        )
        user = get_user_model().objects.create_user("bench")
        from apps.scheduling.snapshot import cluster_snapshot

        topology = cluster_snapshot(cluster=cluster).topology
        background = fragment(args.busy, args.seed, topology.n_gpus)
        slurm_sync(executor=cluster.executor)
        free = int(cluster_snapshot(cluster=cluster).free.sum())
        rng = random.Random(args.seed)
        sizes = [g for g in SIZES if g <= free]
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
                s_gids = slurm_alone(client, topology, spec, shared)
                data = job_to_spec(spec)
                data.update(cluster=cluster.name, command=["sleep", "600"], workdir=str(shared))
                t_gids, _ = through_topoweb(cluster, user, data)
                ps, pt = evaluate(topology, spec, s_gids), evaluate(topology, spec, t_gids)
                rows.append(
                    {
                        "job": spec.name,
                        "profile": prof.profile,
                        "gpus": spec.gpus,
                        "shape": f"tp{spec.tp} pp{spec.pp} dp{spec.dp} ep{spec.ep}",
                        "slurm_comm_ms": ps.comm_ms,
                        "topo_comm_ms": pt.comm_ms,
                        "slurm_step_ms": ps.step_ms,
                        "topo_step_ms": pt.step_ms,
                        "slurm_leaves": leaves(topology, s_gids),
                        "topo_leaves": leaves(topology, t_gids),
                    }
                )
                r = rows[-1]
                print(
                    f"{r['job']} {r['profile']:>10} {r['gpus']:3d} GPUs {r['shape']:>18}: comm slurm"
                    f" {r['slurm_comm_ms']:8.2f} ms  topo {r['topo_comm_ms']:8.2f} ms  step"
                    f" {r['slurm_step_ms']:8.1f} / {r['topo_step_ms']:8.1f} ms  leaves"
                    f" {r['slurm_leaves']} / {r['topo_leaves']}",
                    flush=True,
                )
        finally:
            sh("scancel", *map(str, background), check=False)
            shutil.rmtree(shared, ignore_errors=True)
    with_comm = [r for r in rows if r["slurm_comm_ms"] > 0]
    ratios = [r["topo_comm_ms"] / r["slurm_comm_ms"] for r in with_comm]
    step = [r["topo_step_ms"] / r["slurm_step_ms"] for r in rows]
    summary = {
        "jobs": len(rows),
        "busy": args.busy,
        "seed": args.seed,
        "geomean_comm_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        "worst_comm_ratio": max(ratios) if ratios else None,
        "geomean_step_ratio": math.exp(sum(map(math.log, step)) / len(step)) if step else None,
        "slurm_more_leaves": sum(r["slurm_leaves"] > r["topo_leaves"] for r in rows),
        "topo_more_leaves": sum(r["topo_leaves"] > r["slurm_leaves"] for r in rows),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(summary, indent=2))
    if ratios:
        figure(f"slurm_vs_topo.busy{args.busy:g}.geomean_comm_ratio", summary["geomean_comm_ratio"])
        figure(f"slurm_vs_topo.busy{args.busy:g}.worst_comm_ratio", summary["worst_comm_ratio"])
    figure(f"slurm_vs_topo.busy{args.busy:g}.slurm_more_leaves", summary["slurm_more_leaves"], "jobs")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "jobs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
