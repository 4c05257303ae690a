"""The simulated cluster behind `fake_dcgm` (no Django): what each GPU and NIC would measure while
the placed jobs run, driven by the cost model, written as real dcgm-exporter and node-exporter text.

The simulated network delivers `nic_efficiency` of its nominal NIC and uplink bandwidth (NCCL over
InfiniBand reaches roughly 75-90% of line rate), NVLink its nominal rate; each job's true step is the
cost model's step on that network. Per GPU of a job, per step of `step` ms with `compute` ms of
compute:
- GPU_UTIL: a kernel runs the whole step (NCCL kernels count as busy), so ~0.97 whether the step
  is compute or waiting on the network; this is why utilisation alone hides bad placements;
- PIPE_TENSOR_ACTIVE: the job's true MFU, `flops / (step x GPUs x peak)`;
- NVLink bytes: each comm entry's per-rank ring traffic (2(n-1)/n of the bytes for an allreduce,
  (n-1)/n for the other collectives, all of it for p2p and volume), the share of ring hops that
  stay on the node, divided by the step time;
- NIC bytes: what the job's prediction says each rank sends over its NIC (`traffic`: the job's
  stored prediction when given, else the cost model's on the nominal network), slowed by the
  true step: the same bytes per step over a longer step. Where the prediction is right the
  counters read what it predicted, so measured link load checks the predicted one;
- power and temperature follow utilisation and tensor activity.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apps.placement.costmodel import evaluate
from apps.placement.groups import rank_groups
from apps.placement.jobs import JobSpec
from apps.placement.topology import Topology, load_topology, topology_to_spec

from .exposition import IB_RX, IB_TX, exposition_lines
from .traffic import rank_network_rates

DEFAULT_NIC_EFFICIENCY = 0.75
BUSY_UTIL = 0.97
IDLE_POWER_W = 65.0
RING_FACTOR = {"allreduce": 2.0, "allgather": 1.0, "reducescatter": 1.0, "alltoall": 1.0}


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job as the simulation sees it: its spec, its ranks' gids and, when known, its stored
    prediction (the placement output's `predicted` block)."""

    spec: JobSpec
    gids: tuple[int, ...]
    predicted: Mapping | None = None


@dataclass(slots=True)
class GpuState:
    """What one GPU measures now (fractions, bytes per second, watts)."""

    util: float = 0.0
    tensor: float = 0.0
    nvlink_Bps: float = 0.0
    nic_Bps: float = 0.0


def network_scaled(topology: Topology, efficiency: float) -> Topology:
    """The same cluster whose NICs and switch links deliver `efficiency` of their nominal rate."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"nic_efficiency: must lie in (0, 1], got {efficiency!r}")
    spec = topology_to_spec(topology)
    for link in spec["links"]:
        link["bw_GBps"] *= efficiency
    for node in spec["nodes"]:
        for nic in node.get("nics", ()):
            nic["bw_GBps"] *= efficiency
    return load_topology(spec)


def _nvlink_bytes(topology: Topology, job: RunningJob) -> np.ndarray:
    """Bytes each rank moves per step over NVLink (its ring hops that stay on the node)."""
    nvlink = np.zeros(job.spec.gpus)
    groups = rank_groups(job.spec)
    for entry in job.spec.comm:
        for ranks in groups.get(entry.group, ()):
            n = len(ranks)
            if n < 2:
                continue
            factor = RING_FACTOR.get(entry.collective, float(n) / (n - 1)) * (n - 1) / n
            nodes = [int(topology.gpu_node[job.gids[r]]) for r in ranks]
            ring = list(zip(nodes, nodes[1:] + nodes[:1], strict=True))
            crossing = sum(1 for a, b in ring if a != b) / n
            per_rank = factor * entry.bytes * entry.count
            for r in ranks:
                nvlink[r] += per_rank * (1.0 - crossing)
    return nvlink


def gpu_states(
    topology: Topology, true_topology: Topology, jobs: Sequence[RunningJob], link_load
) -> list[GpuState]:
    """Every GPU's measurements (indexed by gid) with the jobs running on the scaled network."""
    states = [GpuState() for _ in range(topology.n_gpus)]
    for job in jobs:
        pred = evaluate(true_topology, job.spec, job.gids, link_load, detail=False)
        step_s = max(pred.step_ms, 1e-6) / 1e3
        peak = float(true_topology.node_peak_tflops[true_topology.gpu_node[list(job.gids)]].sum()) * 1e12
        if job.spec.flops_per_step:
            tensor = min(job.spec.flops_per_step / (step_s * peak), 1.0)
        else:  # no FLOPs given: tensor pipes busy half of the compute time
            tensor = 0.5 * job.spec.compute_ms / pred.step_ms
        nvlink = _nvlink_bytes(topology, job)
        nic_GBps, predicted_step_ms = _predicted_nic_rates(topology, job, link_load)
        slowed = predicted_step_ms / pred.step_ms if predicted_step_ms and pred.step_ms > 0 else 0.0
        for rank, gid in enumerate(job.gids):
            s = states[gid]
            s.util, s.tensor = BUSY_UTIL, tensor
            s.nvlink_Bps, s.nic_Bps = nvlink[rank] / step_s, nic_GBps[rank] * 1e9 * slowed
    return states


def _predicted_nic_rates(topology: Topology, job: RunningJob, link_load) -> tuple[np.ndarray, float]:
    """(per rank: predicted NIC send rate in GB/s, the predicted step in ms) from the job's stored
    prediction, or the cost model's on the nominal network when it has none."""
    predicted = job.predicted
    if not predicted or not predicted.get("groups") or not predicted.get("step_ms"):
        cost = evaluate(topology, job.spec, job.gids, link_load, detail=True)
        predicted = {"groups": cost.groups, "step_ms": cost.step_ms}
    step_ms = float(predicted["step_ms"])
    nic, _ = rank_network_rates(topology, job.gids, predicted["groups"], step_ms)
    return nic, step_ms


def _tdp_W(peak_tflops: float) -> float:
    # Hopper-class parts (peak near 1,000 TFLOPS) draw up to 700 W, Ampere-class 400 W.
    return 700.0 if peak_tflops > 500 else 400.0


def node_pages(topology: Topology, states: Sequence[GpuState], *, seed: int = 0) -> dict[str, str]:
    """dcgm-exporter text for every node (its GPUs' fields, with ~1% jitter per scrape), without
    the InfiniBand counters (see `ib_text`)."""
    rng = random.Random(seed)
    pages = {}
    for n, node in enumerate(topology.nodes):
        first = int(topology.node_first_gid[n])
        tdp = _tdp_W(float(topology.node_peak_tflops[n]))
        rows: dict[str, list] = {name: [] for name in FIELD_HELP}
        for index in range(node.gpus):
            s = states[first + index]
            jitter = 1.0 + rng.uniform(-0.01, 0.01)
            labels = {
                "gpu": str(index),
                "UUID": f"GPU-{node.name}-{index}",
                "device": f"nvidia{index}",
                "modelName": node.gpu_model,
                "Hostname": node.name,
            }
            busy = s.util > 0
            power = IDLE_POWER_W + (tdp - IDLE_POWER_W) * (0.35 * s.util + 0.65 * s.tensor) * jitter
            values = {
                "DCGM_FI_DEV_GPU_UTIL": round(100 * min(s.util * jitter, 1.0)),
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": min(s.util * 0.99 * jitter, 1.0),
                "DCGM_FI_PROF_SM_ACTIVE": min((s.tensor * 1.2 + (0.15 if busy else 0.0)) * jitter, 1.0),
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": min(s.tensor * jitter, 1.0),
                "DCGM_FI_PROF_DRAM_ACTIVE": min((0.2 + 0.5 * s.tensor) * jitter, 1.0) if busy else 0.0,
                "DCGM_FI_PROF_PCIE_TX_BYTES": (s.nic_Bps + 2e7) * jitter,
                "DCGM_FI_PROF_PCIE_RX_BYTES": (s.nic_Bps + 5e7) * jitter,
                "DCGM_FI_PROF_NVLINK_TX_BYTES": s.nvlink_Bps * jitter,
                "DCGM_FI_PROF_NVLINK_RX_BYTES": s.nvlink_Bps * jitter,
                "DCGM_FI_DEV_POWER_USAGE": power,
                "DCGM_FI_DEV_GPU_TEMP": round(32 + 45 * (power / tdp)),
                "DCGM_FI_DEV_XID_ERRORS": 0,
            }
            for name, value in values.items():
                rows[name].append((labels, value))
        pages[node.name] = "".join(
            exposition_lines(name, rows[name], FIELD_HELP[name]) for name in FIELD_HELP
        )
    return pages


FIELD_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_PROF_SM_ACTIVE": "The ratio of cycles an SM has at least 1 warp assigned.",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles the tensor (HMMA) pipe is active.",
    "DCGM_FI_PROF_DRAM_ACTIVE": "Ratio of cycles the device memory interface is active sending or receiving data.",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "The rate of data transmitted over the PCIe bus in bytes per second.",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "The rate of data received over the PCIe bus in bytes per second.",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "The rate of data transmitted over NVLink in bytes per second.",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "The rate of data received over NVLink in bytes per second.",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
}


class NicCounters:
    """Cumulative InfiniBand byte counters per (node, NIC) that advance at the NICs' current rates."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.tx: dict[tuple[str, str], float] = {}
        self.rx: dict[tuple[str, str], float] = {}

    def advance(self, states: Sequence[GpuState], seconds: float) -> None:
        """Add `seconds` of traffic at the GPUs' NIC rates (a NIC carries its GPUs' traffic)."""
        topo = self.topology
        for n, node in enumerate(topo.nodes):
            first = int(topo.node_first_gid[n])
            for nic in node.nics:
                rate = sum(states[first + g].nic_Bps for g in nic.gpus)
                key = (node.name, nic.name)
                self.tx[key] = self.tx.get(key, 0.0) + rate * seconds
                self.rx[key] = self.rx.get(key, 0.0) + rate * seconds

    def text(self, node: str) -> str:
        """node-exporter's InfiniBand counter lines of one node."""
        nics = self.topology.nodes[self.topology.node_by_name[node]].nics
        out = []
        for metric, counters, help_text in (
            (IB_TX, self.tx, "Number of data octets transmitted on all links"),
            (IB_RX, self.rx, "Number of data octets received on all links"),
        ):
            out.append(f"# HELP {metric} {help_text}\n# TYPE {metric} counter\n")
            for nic in nics:
                value = counters.get((node, nic.name), 0.0)
                out.append(f'{metric}{{device="{nic.name}",port="1"}} {math.floor(value)}\n')
        return "".join(out)
