"""The simulator replays GPU-type constraints: Alibaba's `gpu_spec` becomes a trace job's GPU
models and its spec's `gpu_models`, held by every policy's placements."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from apps.placement.sim import SimConfig, TraceJob, TraceRead, read_trace, simulate
from apps.placement.sim.engine import Replay, ideal_steps
from apps.placement.sim.profiles import assign_profiles
from apps.placement.topology import load_topology

SHARED = Path("/work/shared/data/traces")
GPUSPEC = SHARED / "alibaba_v2023_openb_pod_list_gpuspec33.csv"
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def two_models():
    """Two leaves: four 8-GPU T4 nodes under one, four V100M32 nodes under the other."""
    nodes = []
    for i in range(8):
        model = "T4" if i < 4 else "V100M32"
        nodes.append(
            {
                "name": f"n{i}",
                "gpu_model": model,
                "gpus": 8,
                "nvlink": {"domain": f"n{i}", "bw_GBps": 300, "latency_us": 2.0},
                "nics": [
                    {
                        "name": "eth0",
                        "gpus": list(range(8)),
                        "leaf": f"leaf-{i // 4 + 1}",
                        "bw_GBps": 25,
                        "latency_us": 2.0,
                    }
                ],
            }
        )
    return load_topology(
        {
            "version": 1,
            "name": "two-models",
            "gpu_models": {"T4": {"peak_tflops": 65}, "V100M32": {"peak_tflops": 125}},
            "switches": [
                {"name": "leaf-1", "tier": "leaf"},
                {"name": "leaf-2", "tier": "leaf"},
                {"name": "spine-1", "tier": "spine"},
            ],
            "links": [{"a": f"leaf-{k}", "b": "spine-1", "bw_GBps": 100, "latency_us": 1.0} for k in (1, 2)],
            "nodes": nodes,
        }
    )


def test_gpu_spec_becomes_distinct_models_and_a_bad_name_is_a_malformed_row(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(
        HEADER + "p0,1000,1024,2,1000,P100|V100M16|V100M16,LS,Running,10,110,20\n"
        "p1,1000,1024,1,1000,,LS,Running,11,110,20\n"
        "p2,1000,1024,1,1000,T4|bad/name,LS,Running,12,110,20\n"
    )
    trace = read_trace(str(path))
    assert [(j.name, j.gpu_models) for j in trace.jobs] == [("p0", ("P100", "V100M16")), ("p1", ())]
    assert len(trace.malformed) == 1 and trace.malformed[0][0] == 4 and "gpu_spec" in trace.malformed[0][1]


def test_constrained_jobs_land_on_their_models_and_unknown_models_run_anywhere():
    topo = two_models()
    jobs = [
        TraceJob("t4", 0.0, 8, 100.0, gpu_models=("T4",)),
        TraceJob("v100", 0.0, 8, 100.0, gpu_models=("P100", "V100M32")),
        TraceJob("t4-late", 1.0, 16, 100.0, gpu_models=("T4",)),
        TraceJob("a100", 2.0, 8, 100.0, gpu_models=("A100",)),
    ]
    profiles = assign_profiles(jobs, topo, seed=1)
    assert [p.spec.gpu_models for p in profiles] == [("T4",), ("V100M32",), ("T4",), ()]
    for policy in ("topo", "first_fit", "naive", "tree_best_fit"):
        placed: dict[int, tuple[int, ...]] = {}
        replay = Replay(
            topo, profiles, [j.arrival_s for j in jobs], policy, SimConfig(), ideal_steps(topo, profiles)
        )
        start = replay._start

        def record(job, placement, t, changed, start=start, placed=placed):
            placed[job.job_id] = placement.gids
            return start(job, placement, t, changed)

        replay._start = record
        run = replay.run()
        assert len(run.outcomes) == 4 and not run.rejected
        model = np.array([topo.nodes[n].gpu_model for n in topo.gpu_node])
        assert set(model[list(placed[0])]) == {"T4"} and set(model[list(placed[2])]) == {"T4"}
        assert set(model[list(placed[1])]) == {"V100M32"}
        assert len(placed[2]) == 16 and not set(placed[0]) & set(placed[2])
    facts = simulate(topo, TraceRead("alibaba", jobs), ["topo"], seed=1).trace
    assert facts["gpu_model_constrained"] == 3 and facts["gpu_models_unknown"] == 1


@pytest.mark.skipif(not GPUSPEC.exists(), reason="the shared Alibaba traces are not on this machine")
def test_the_gpuspec_trace_constrains_about_a_third_of_its_gpu_pods_to_the_fleets_types():
    trace = read_trace(str(GPUSPEC))
    assert not trace.malformed
    constrained = [j for j in trace.jobs if j.gpu_models]
    assert 0.25 < len(constrained) / len(trace.jobs) < 0.45
    with open(SHARED / "alibaba_v2023_openb_node_list_gpu_node.csv", newline="") as fh:
        fleet = {row["model"] for row in csv.DictReader(fh)}
    assert {m for j in constrained for m in j.gpu_models} <= fleet
