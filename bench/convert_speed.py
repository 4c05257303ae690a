"""Converter speed: a 16,384-GPU rail-optimized 3-tier cluster (16 pods of 4 units of 32 nodes of
8 GPUs, 8 rails, 8 spines per pod, 4 cores) written in every export format and read back
(import plus spec v1 validation), each timed. Printed: per format the export and import seconds,
the output size, and the target: every other format's export plus import of the 16,384-GPU
cluster in <= 10 s on the 2-core machine. The `topology-v1` row is the spec loader's own YAML
read and write (`parse_spec_text`, shared with `import_topology`), shown for scale.

    .venv/bin/python bench/convert_speed.py [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.placement.convert import EXPORTERS, Defaults, Source, export_topology, import_sources  # noqa: E402
from apps.placement.topology import load_topology  # noqa: E402

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
    out, times = None, []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a 1,024-GPU cluster, one run (smoke)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    args = p.parse_args()
    spec = cluster(32, 1) if args.quick else cluster(32, 16)
    runs = 1 if args.quick else args.runs
    topo, gen_s = timed(lambda: load_topology(spec), runs)
    print(
        f"cluster: {len(topo.nodes)} nodes, {topo.n_gpus} GPUs, {len(topo.switches)} switches, {len(topo.links)} links"
    )
    print(f"generate + validate spec v1: {gen_s:.2f} s")
    print(f"{'format':<12} {'export s':>9} {'import s':>9} {'total s':>8} {'size KiB':>9}")
    worst = 0.0
    for fmt in EXPORTERS:
        text, exp_s = timed(lambda fmt=fmt: export_topology(fmt, topo), runs)
        if fmt == "topograph":
            imp_s = 0.0  # graph JSON is written only; topograph's model YAML is what it reads
        else:
            defaults = {} if fmt == "topology-v1" else DEFAULTS
            back, imp_s = timed(
                lambda fmt=fmt, text=text, d=defaults: import_sources(
                    fmt, [Source(fmt, text)], Defaults.from_mapping(d)
                ).topology(),
                runs,
            )
            assert back.n_gpus == topo.n_gpus, fmt
        if fmt != "topology-v1":
            worst = max(worst, exp_s + imp_s)
        print(f"{fmt:<12} {exp_s:9.2f} {imp_s:9.2f} {exp_s + imp_s:8.2f} {len(text) / 1024:9.0f}")
    verdict = "met" if worst <= TARGET_S else "NOT met"
    print(f"slowest other format, export + import: {worst:.2f} s (target <= {TARGET_S:.0f} s): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
