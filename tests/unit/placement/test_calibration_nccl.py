"""The cost model against published NCCL bus bandwidths (apps/placement/calibration/).

Each scenario is priced by `evaluate` on a topology written at line rates, as an operator would,
and its bus bandwidth (nccl-tests' definition) compared with the measured figure. Tolerances:
- NVLink rows within 30%: the model takes the NVLink line rate, where NCCL's ring reaches about
  80% of it (protocol overhead) and NVLS, reducing inside the switch, a little more than it;
- network rows within 15%: NICs reach 95% of their line rate, and at scale the pipelined ring
  over one channel per rail is what NCCL's measured bandwidth follows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from apps.placement.costmodel import evaluate
from apps.placement.jobs import load_job
from apps.placement.topology import load_topology

DATA = Path(__file__).resolve().parents[3] / "apps" / "placement" / "calibration"
NVLINK_TOLERANCE, NETWORK_TOLERANCE = 0.30, 0.15


def measured() -> dict[str, dict]:
    with open(DATA / "published_collective_bandwidths.csv", newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def cluster(
    nodes: int, gpus: int, nvlink_GBps: float, nic_GBps: float, nics: int, gpu_model: str = "H100-SXM5-80GB"
):
    """Leaf-spine at line rates: `nodes` nodes of `gpus` `gpu_model` GPUs and `nics` NICs,
    non-blocking uplinks. The model decides NVLS (`Topology.domain_nvls`): H100 boards of 8 run
    it, A100 and A800 boards (NVSwitch gen 2) do not."""
    per_leaf = 32
    leaves = -(-nodes // per_leaf)
    return load_topology(
        {
            "version": 1,
            "name": "calibration",
            "generate": {
                "shape": "leaf-spine",
                "spines": 4,
                "leaves": leaves,
                "nodes_per_leaf": min(nodes, per_leaf),
                "gpus_per_node": gpus,
                "gpu_model": gpu_model,
                "peak_tflops": 989,
                "nvlink_bw_GBps": nvlink_GBps,
                "nic_bw_GBps": nic_GBps,
                "nics_per_node": nics,
                "uplink_bw_GBps": per_leaf * nics * nic_GBps,
            },
        }
    )


def busbw(topo, collective: str, ranks: int, nbytes: float, group: str = "dp") -> float:
    """nccl-tests bus bandwidth (GB/s) of one collective over `ranks` ranks on the first GPUs."""
    parallelism = {"tp": 1, "pp": ranks, "dp": 1} if group == "pp" else {"tp": 1, "pp": 1, "dp": ranks}
    job = load_job(
        {
            "version": 1,
            "name": "nccl-test",
            "gpus": ranks,
            "parallelism": parallelism,
            "step": {"compute_ms": 0},
            "comm": [{"group": group, "collective": collective, "bytes": nbytes}],
        }
    )
    ms = evaluate(topo, job, np.arange(ranks)).comm_ms
    algbw = nbytes / (ms * 1e6)
    factor = {"allreduce": 2 * (ranks - 1) / ranks, "p2p": 1.0}.get(collective, (ranks - 1) / ranks)
    return algbw * factor


# (row id, topology, collective, ranks, bytes, group, tolerance); line rates per system.
H100 = {"nvlink_GBps": 450, "nic_GBps": 50, "nics": 8}
SCENARIOS = [
    ("C8", dict(nodes=1, gpus=8, **H100), "allreduce", 8, 1e9, "dp", NVLINK_TOLERANCE),
    ("C9", dict(nodes=1, gpus=8, **H100), "allreduce", 8, 1e9, "dp", NVLINK_TOLERANCE),
    ("C10", dict(nodes=1, gpus=8, **H100), "allreduce", 8, 1e9, "dp", NVLINK_TOLERANCE),
    ("C13", dict(nodes=1, gpus=8, **H100), "p2p", 2, 1e9, "pp", NVLINK_TOLERANCE),
    (
        "C15b",
        dict(nodes=1, gpus=8, nvlink_GBps=200, nic_GBps=25, nics=8, gpu_model="A800-SXM4-80GB"),
        "allreduce",
        8,
        1e9,
        "dp",
        NVLINK_TOLERANCE,
    ),
    (
        "C14",
        dict(nodes=2, gpus=8, nvlink_GBps=300, nic_GBps=25, nics=8, gpu_model="A100-SXM4-80GB"),
        "allreduce",
        16,
        1e9,
        "dp",
        NETWORK_TOLERANCE,
    ),
    (
        "C15a",
        dict(nodes=2, gpus=1, nvlink_GBps=300, nic_GBps=25, nics=1),
        "allreduce",
        2,
        1e9,
        "dp",
        NETWORK_TOLERANCE,
    ),
    (
        "C16",
        dict(nodes=2, gpus=1, nvlink_GBps=450, nic_GBps=50, nics=1),
        "allreduce",
        2,
        1e9,
        "dp",
        NETWORK_TOLERANCE,
    ),
    ("C18", dict(nodes=248, gpus=8, **H100), "allreduce", 1984, 512e6, "dp", NETWORK_TOLERANCE),
    (
        "C19",
        dict(nodes=8, gpus=1, nvlink_GBps=450, nic_GBps=50, nics=1),
        "alltoall",
        8,
        1e9,
        "dp",
        NETWORK_TOLERANCE,
    ),
]


@pytest.mark.parametrize("row,shape,collective,ranks,nbytes,group,tolerance", SCENARIOS)
def test_the_model_is_within_tolerance_of_the_measured_bus_bandwidth(
    row, shape, collective, ranks, nbytes, group, tolerance
):
    figure = measured()[row]
    assert figure["source"], f"{row} has no source"
    model = busbw(cluster(**shape), collective, ranks, nbytes, group)
    assert model == pytest.approx(float(figure["measured"]), rel=tolerance)


def test_an_allreduce_over_eight_nics_aggregates_them_as_nccl_does():
    # C14 is 8 NICs x C15a per NIC: the model's multi-node busbw is the rails' summed rate.
    rows = measured()
    eight = busbw(cluster(2, 8, 300, 25, 8), "allreduce", 16, 1e9)
    one = busbw(cluster(2, 1, 300, 25, 1), "allreduce", 2, 1e9)
    assert eight / one == pytest.approx(
        float(rows["C14"]["measured"]) / float(rows["C15a"]["measured"]), rel=0.05
    )


def test_an_alltoall_does_not_aggregate_nics():
    # C19: all-to-all runs at one NIC's rate per rank; 8 NICs per node do not add up for one rank.
    one_gpu_nodes = busbw(cluster(8, 1, 450, 50, 1), "alltoall", 8, 1e9)
    assert one_gpu_nodes == pytest.approx(50, rel=0.01)
