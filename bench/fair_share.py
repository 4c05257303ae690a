"""Fair share over a simulated day: two accounts with shares 1:3 submit the same stream of jobs.

Both accounts submit one copy of the same job every `--interval` seconds (by default each asks
for three quarters of the cluster, together one and a half times what it has), the production
planner schedules them by the production effective priority (`apps/placement/priority.py`:
requested + age + fair share over decayed use), and the replay counts each account's GPU-hours.
With shares 1:3 the GPU-hours should come out 1:3; the script prints the ratio, its distance
from 3 and each hour's split, and exits 1 when the ratio is more than `--tolerance` (10%) off.

    .venv/bin/python bench/fair_share.py [--hours 24] [--topology examples/pod-256.yaml]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from apps.placement.jobs import load_job  # noqa: E402
from apps.placement.planning import QosLimits  # noqa: E402
from apps.placement.sim.fairshare import replay_fair_share  # noqa: E402
from apps.placement.topology.io import load_topology_file  # noqa: E402


def stream_job(gpus: int, runtime_s: float):
    """The job every account submits: `gpus` ranks in tensor-parallel groups of up to 8."""
    tp = min(gpus, 8)
    return load_job(
        {
            "version": 1,
            "name": "stream",
            "user": "bench",
            "gpus": gpus,
            "parallelism": {"tp": tp, "pp": 1, "dp": gpus // tp},
            "step": {"compute_ms": 100},
            "comm": [{"group": "tp", "collective": "allreduce", "bytes": 1e8}],
            "estimated_runtime_s": runtime_s,
        }
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default=str(REPO / "examples" / "pod-256.yaml"))
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--gpus", type=int, default=8, help="GPUs per job")
    p.add_argument("--runtime", type=float, default=1800.0, help="each job's runtime, s")
    p.add_argument("--interval", type=float, default=None, help="s between an account's submissions")
    p.add_argument("--half-life-h", type=float, default=24.0)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument(
        "--qos",
        action="store_true",
        help="every job in a QOS `high` (priority term 50, at most 3/4 of the cluster's GPUs per account)",
    )
    args = p.parse_args(argv)
    topo = load_topology_file(args.topology)
    job = stream_job(args.gpus, args.runtime)
    interval = args.interval or args.gpus * args.runtime / (0.75 * topo.n_gpus)
    t0 = time.perf_counter()
    run = replay_fair_share(
        topo,
        job,
        shares={"a-share-1": 1, "b-share-3": 3},
        duration_s=args.hours * 3600.0,
        interval_s=interval,
        half_life_s=args.half_life_h * 3600.0,
        qos=QosLimits(1, "high", priority=50, max_running_gpus_per_account=topo.n_gpus * 3 // 4)
        if args.qos
        else None,
    )
    wall = time.perf_counter() - t0
    ratio = run.ratio("a-share-1", "b-share-3")
    off = abs(ratio - 3.0) / 3.0
    print(
        f"{topo.n_gpus} GPUs, jobs of {args.gpus} GPUs for {args.runtime:.0f} s, each account every {interval:.0f} s"
    )
    print(
        f"replayed {args.hours:g} h in {wall:.1f} s ({run.cycles} cycles)"
        + (", QOS high" if args.qos else "")
    )
    print("hour  a-share-1  b-share-3  (GPU-hours)")
    for h, (a, b) in enumerate(zip(run.hourly["a-share-1"], run.hourly["b-share-3"], strict=True)):
        print(f"{h:4d}  {a:9.1f}  {b:9.1f}")
    print(f"GPU-hours: {run.gpu_hours}; jobs started: {run.started}")
    print(f"FIGURE fair_share_ratio {ratio:.3f} (target 3, {off:.1%} off, tolerance {args.tolerance:.0%})")
    return 0 if off <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
