"""Cluster-scale evidence: replay real traces under every policy and compare JCT and fragmentation.

Traces: the Philly multi-GPU jobs (philly_pollux_derived_multigpu_all_chrono.csv, 5,620 jobs of
2-128 GPUs) and Alibaba 2023 openb multigpu50 (GPU pods; 2-, 4- and 8-GPU pods oversampled).
Clusters: pod-256 (examples/pod-256.yaml) and a 1,024-GPU rail-optimized SuperPOD (4 scalable
units, as in bench/placement_quality.py). Arrival times are scaled so that the offered load is
--load of the cluster (default 0.6): the GPU-time the jobs ask for inside the arrival window (the
1st to 99th percentile of arrivals; a job running past it counts only inside), over the window's
GPU-time (`apps.placement.sim.offered_load`, bisected on the scale). The raw traces offer very
different loads to different clusters, see the printed `offered`. Workload profiles are the
simulator's seeded mix.

Printed, in one run: every policy's metrics per (trace, cluster), with utilisation over the
makespan (`util`), over the arrival window (`util win`, to set beside the offered load), while
some job waits (`busy|wait`), and the replay's speed (jobs per CPU second); topo's ratios of mean JCT to
naive and to tree_best_fit and of fragmentation to tree_best_fit, against the targets (<= 0.7,
<= 0.9, < 1); a cross-check of the Philly replay against AcmeTrace's Philly summary (job count,
mean GPUs per job, mean and median runtime, mean queueing), with the differences; and, with
--scaling, the wall time of 10,000 Philly jobs (topo) on 1,024 GPUs and on 16,384 GPUs. The
figures also go out as FIGURE lines (bench/figures.py) for bench/ab.py, which reads older
versions' tables into the same names.

    .venv/bin/python bench/simulate_traces.py [--quick] [--seed N] [--load L] [--cluster C] [--trace T]
                                              [--limit N]
                                              [--scaling]

--quick is a smoke run (the first 100 jobs of each trace, pod-256 only). Without --limit every job
is replayed: 5 to 26 min wall per trace and cluster for the four policies on the shared 2-core
machine (the printed jobs per CPU second say how fast each policy's replay ran).

Traces are read from ../shared/data/traces (or --traces DIR); the benchmark exits 0 with a note
when they are absent.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from figures import figure  # noqa: E402
from placement_quality import clusters as quality_clusters  # noqa: E402

from apps.placement.sim import SimConfig, read_trace, simulate  # noqa: E402
from apps.placement.sim.engine import Replay, ideal_steps  # noqa: E402
from apps.placement.sim.profiles import assign_profiles  # noqa: E402
from apps.placement.topology import load_topology_file  # noqa: E402

POLICIES = ["topo", "tree_best_fit", "first_fit", "naive"]
TRACES = {
    "philly-multigpu": ("philly_pollux_derived_multigpu_all_chrono.csv", "philly"),
    "alibaba-multigpu50": ("alibaba_v2023_openb_pod_list_multigpu50.csv", "alibaba"),
}
ACME = "acmetrace_cluster_summary_seren_kalos_philly_helios_pai.csv"
NAIVE_TARGET, TREE_TARGET = 0.7, 0.9


def _clusters(quick: bool):
    """The replay clusters by name, and the 16,384-GPU cluster of the scaling run (None if quick)."""
    pod = load_topology_file(str(ROOT / "examples" / "pod-256.yaml"))
    if quick:
        return {"pod-256": pod}, None
    every = quality_clusters(False)
    return {"pod-256": pod, "rail-1024": every["superpod-1024"]}, every["3tier-16384"]


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:9.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _jobs_per_cpu_s(summary: dict, run) -> float | None:
    """How fast one policy's replay ran: jobs done or rejected per second of its CPU (None
    without a CPU time)."""
    return (summary["jobs"] + summary["rejected"]) / run.cpu_s if run.cpu_s > 0 else None


def _figures(name: str, summaries: dict[str, dict], runs: dict, ratios: dict[str, float]) -> None:
    """FIGURE lines of one replay (`name`: trace.cluster): each policy's mean JCT and jobs per CPU
    second, and topo's ratios (the names bench/ab.py also reads from older versions' tables)."""
    for p, s in summaries.items():
        if s["jct_s"]["mean"] is not None:
            figure(f"{name}.{p}.jct_mean_h", s["jct_s"]["mean"] / 3600, "h")
        speed = _jobs_per_cpu_s(s, runs[p])
        if speed is not None:
            figure(f"{name}.{p}.jobs_per_cpu_s", speed, "1/s")
    for key, value in ratios.items():
        figure(f"{name}.{key}", value)


def _print_table(summaries: dict[str, dict], runs: dict) -> None:
    print(
        f"  {'policy':<14}{'jobs':>6} {'JCT mean h':>10} {'median h':>9} {'p95 h':>9} {'queue h':>9}"
        f" {'makespan h':>10} {'comm GPU-h':>11} {'MFU':>6} {'util':>6} {'util win':>8} {'busy|wait':>9}"
        f" {'frag':>6} {'stretch':>8} {'jobs/s CPU':>10}"
    )
    for p, s in summaries.items():
        rate = _jobs_per_cpu_s(s, runs[p])
        speed = f"{'-':>10}" if rate is None else f"{rate:10.0f}"
        print(
            f"  {p:<14}{s['jobs']:>6} {_h(s['jct_s']['mean']):>10} {_h(s['jct_s']['median']):>9}"
            f" {_h(s['jct_s']['p95']):>9} {_h(s['queueing_s']['mean']):>9} {_h(s['makespan_s']):>10}"
            f" {s['comm_gpu_hours']:>11.0f} {s['effective_mfu']:>6.1%} {s['utilisation']:>6.1%}"
            f" {_pct(s['utilisation_window']):>8} {_pct(s['busy_while_waiting']):>9}"
            f" {s['fragmentation']:>6.1%} {s['runtime_stretch']['mean']:>8.3f} {speed}"
        )


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a == 0 else math.inf)


def _acme_philly(folder: Path) -> dict | None:
    path = folder / ACME
    if not path.exists():
        return None
    with open(path, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["id"] == "Philly":
                return row
    return None


def _crosscheck(folder: Path, replay: dict, jobs) -> None:
    acme = _acme_philly(folder)
    if acme is None:
        print("  (AcmeTrace summary absent: no cross-check)")
        return
    full = read_trace(str(folder / "philly_pollux_derived_first40000_chrono.csv"))
    runtimes = sorted(j.duration_s for j in full.jobs)
    rows = [
        ("jobs", float(acme["gpu_job_num"]), float(len(full.jobs)), "first 40,000 of 82,247 derived rows"),
        ("mean GPUs/job", float(acme["avg_gpu_num"]), sum(j.gpus for j in full.jobs) / len(full.jobs), ""),
        ("mean runtime s", float(acme["avg_run_time_gpu"]), sum(runtimes) / len(runtimes), ""),
        ("median runtime s", float(acme["med_run_time_gpu"]), runtimes[len(runtimes) // 2], ""),
        (
            "multi-GPU mean GPUs/job",
            float("nan"),
            sum(j.gpus for j in jobs) / len(jobs),
            "the replayed multi-GPU trace",
        ),
        (
            "mean queueing s (topo)",
            float(acme["avg_que_time_gpu"]),
            replay["queueing_s"]["mean"],
            "replay at the scaled load, pod-256",
        ),
    ]
    print(f"  {'quantity':<26}{'AcmeTrace':>12}{'ours':>12}{'ours/acme':>11}  note")
    for name, ref, ours, note in rows:
        ratio = "" if math.isnan(ref) else f"{ours / ref:>11.2f}"
        ref_text = "" if math.isnan(ref) else f"{ref:>12.1f}"
        print(f"  {name:<26}{ref_text:>12}{ours:>12.1f}{ratio:>11}  {note}")


def _scaling(folder: Path, big, rail, seed: int) -> None:
    trace = read_trace(str(folder / "philly_pollux_derived_first40000_chrono.csv"), limit=10_000)
    for topology in (rail, big):
        profiles = assign_profiles(trace.jobs, topology, seed=seed)
        started, cpu = time.perf_counter(), time.process_time()
        ideal = ideal_steps(topology, profiles)
        run = Replay(topology, profiles, [j.arrival_s for j in trace.jobs], "topo", SimConfig(), ideal).run()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        # CPU time too: on a shared machine the wall time mostly measures the other processes.
        print(
            f"  10,000 Philly jobs, topo, {topology.name} ({topology.n_gpus} GPUs): {wall:.1f} s wall,"
            f" {cpu:.1f} s CPU, {run.cycles} cycles, {len(run.outcomes)} jobs done"
        )
        figure(f"scaling.{topology.name}.cpu_s", cpu, "s")
        figure(f"scaling.{topology.name}.wall_s", wall, "s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: the first 100 jobs of each trace on pod-256"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, default=0.6, help="offered load the arrivals are scaled to")
    ap.add_argument("--cluster", choices=("pod-256", "rail-1024"), help="replay on this cluster only")
    ap.add_argument("--limit", type=int, help="replay the first N jobs of each trace (default: all)")
    ap.add_argument("--trace", choices=tuple(TRACES), help="replay this trace only")
    ap.add_argument("--scaling", action="store_true", help="also time 10,000 jobs on 1,024 and 16,384 GPUs")
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "data" / "traces"))
    args = ap.parse_args()
    folder = Path(args.traces)
    if not folder.exists():
        folder = Path("/work/shared/data/traces")
    if not folder.exists():
        print(f"traces not found under {args.traces}: nothing to replay")
        return 0
    limit = 100 if args.quick else args.limit
    topologies, big = _clusters(args.quick)
    if args.cluster:
        topologies = {args.cluster: topologies[args.cluster]}
    verdicts = []
    philly_topo = None
    philly_jobs = None
    for trace_name, (file, fmt) in TRACES.items():
        if args.trace and trace_name != args.trace:
            continue
        trace = read_trace(str(folder / file), fmt, limit=limit, seed=args.seed)
        for cluster, topology in topologies.items():
            started = time.perf_counter()
            result = simulate(topology, trace, POLICIES, seed=args.seed, load=args.load)
            wall = time.perf_counter() - started
            facts = result.trace
            print(
                f"\n{trace_name} on {cluster}: {facts['jobs']} jobs, mean {facts['mean_gpus']:.2f} GPUs,"
                f" offered load {facts['offered_load']:.3f}, arrivals x{facts['arrival_scale']:.4g} for"
                f" {facts['scaled_load']:.3f} (asked {args.load:.2f}); profiles {facts['profiles']};"
                f" {wall:.1f} s wall for {len(POLICIES)} policies"
            )
            s = result.summaries
            _print_table(s, result.runs)
            jct = {p: s[p]["jct_s"]["mean"] or 0.0 for p in POLICIES}
            vs_naive = _ratio(jct["topo"], jct["naive"])
            vs_tree = _ratio(jct["topo"], jct["tree_best_fit"])
            frag = _ratio(s["topo"]["fragmentation"], s["tree_best_fit"]["fragmentation"])
            verdicts.append((trace_name, cluster, vs_naive, vs_tree, frag))
            print(
                f"  topo mean JCT / naive {vs_naive:.3f} (target <= {NAIVE_TARGET}),"
                f" / tree_best_fit {vs_tree:.3f} (target <= {TREE_TARGET});"
                f" fragmentation / tree_best_fit {frag:.3f} (target < 1)"
            )
            ratios = {
                "topo_jct_vs_naive": vs_naive,
                "topo_jct_vs_tree_best_fit": vs_tree,
                "topo_frag_vs_tree_best_fit": frag,
            }
            _figures(f"{trace_name}.{cluster}", s, result.runs, ratios)
            if trace_name == "philly-multigpu" and cluster == "pod-256":
                philly_topo, philly_jobs = s["topo"], trace.jobs
    print(
        "\nTargets (topo mean JCT <= 0.7 x naive and <= 0.9 x tree_best_fit; fragmentation below tree_best_fit)"
    )
    for trace_name, cluster, vs_naive, vs_tree, frag in verdicts:
        ok = [vs_naive <= NAIVE_TARGET, vs_tree <= TREE_TARGET, frag < 1]
        marks = " ".join("met" if m else "MISSED" for m in ok)
        print(f"  {trace_name:<20}{cluster:<11} {vs_naive:6.3f} {vs_tree:6.3f} {frag:6.3f}  {marks}")
    print("\nCross-check against AcmeTrace's Philly summary (InternLM/AcmeTrace, CC BY 4.0)")
    if philly_topo is not None:
        _crosscheck(folder, philly_topo, philly_jobs)
    if args.scaling and big is not None:
        print("\nScaling")
        _scaling(folder, big, _clusters(False)[0]["rail-1024"], args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
