"""Converter speed: a 16,384-GPU rail-optimized 3-tier cluster (16 pods of 4 units of 32 nodes of
8 GPUs, 8 rails, 8 spines per pod, 4 cores) written in every export format and read back
(import plus spec v1 validation), each timed. Printed: per format the export and import seconds,
the output size, and the target: every other format's export plus import of the 16,384-GPU
cluster in <= 10 s on the 2-core machine. The `topology-v1` row is the spec loader's own YAML
read and write (`parse_spec_text`, shared with `import_topology`), shown for scale, and the
`topology-v1 json` row the same spec as JSON (read with the stdlib's decoder).

    .venv/bin/python bench/convert_speed.py [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.convert import EXPORTERS, Defaults, Source, export_topology, import_sources  # noqa: E402
from apps.placement.topology import load_topology, topology_to_spec  # noqa: E402

TARGET_S = 10.0
# What the Slurm and Kubernetes formats lack, given as an operator would.
DEFAULTS = {"gpus_per_node": 8, "gpu_model": "H100-SXM5-80GB", "peak_tflops": 989}


def cluster(nodes_per_leaf: int, pods: int) -> dict:
    """A rail-optimized 3-tier spec: `pods` pods of 4 units x `nodes_per_leaf` nodes, 8 rails."""
    return {
        "version": 1,
        "name": "rail-3tier",
        "generate": {
            "shape": "rail-optimized",
            "spines": 8,
            "leaves": 32,
            "nodes_per_leaf": nodes_per_leaf,
            "gpus_per_node": 8,
            "gpu_model": "H100-SXM5-80GB",
            "peak_tflops": 989,
            "nvlink_bw_GBps": 450,
            "nic_bw_GBps": 50,
            "nics_per_node": 8,
            "uplink_bw_GBps": 400,
            "pods": pods,
            "cores": 4,
            "core_uplink_bw_GBps": 800,
        },
    }


def timed(fn, runs: int):
    """(result, median wall seconds, median CPU seconds of this process)."""
    out, wall, cpu = None, [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return out, statistics.median(wall), statistics.median(cpu)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a 1,024-GPU cluster, one run (smoke)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    args = p.parse_args()
    spec = cluster(32, 1) if args.quick else cluster(32, 16)
    runs = 1 if args.quick else args.runs
    topo, gen_s, gen_cpu = timed(lambda: load_topology(spec), runs)
    print(f"cluster: {len(topo.nodes)} nodes, {topo.n_gpus} GPUs, {len(topo.switches)} switches")
    print(f"generate + validate spec v1: {gen_s:.2f} s ({gen_cpu:.2f} s CPU)")
    print("seconds, wall (CPU of this process): the machine may be shared")
    print(f"{'format':<16} {'export':>14} {'import':>14} {'size KiB':>9}")
    worst = 0.0
    rows = [(fmt, lambda fmt=fmt: export_topology(fmt, topo)) for fmt in EXPORTERS]
    rows.append(("topology-v1 json", lambda: json.dumps(topology_to_spec(topo))))
    for label, write in rows:
        fmt = label.split()[0]
        text, exp_s, exp_cpu = timed(write, runs)
        imp_s = imp_cpu = 0.0
        # topograph's graph JSON is written only; its model YAML is what it reads.
        if fmt != "topograph":
            defaults = {} if fmt == "topology-v1" else DEFAULTS
            back, imp_s, imp_cpu = timed(
                lambda fmt=fmt, text=text, d=defaults: import_sources(
                    fmt, [Source(fmt, text)], Defaults.from_mapping(d)
                ).topology(),
                runs,
            )
            assert back.n_gpus == topo.n_gpus, fmt
        if fmt != "topology-v1":
            worst = max(worst, exp_s + imp_s)
        print(
            f"{label:<16} {exp_s:7.2f} ({exp_cpu:4.2f}) {imp_s:7.2f} ({imp_cpu:4.2f}) {len(text) / 1024:9.0f}"
        )
    verdict = "met" if worst <= TARGET_S else "NOT met"
    print(
        f"slowest other format, export + import: {worst:.2f} s wall (target <= {TARGET_S:.0f} s): {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
