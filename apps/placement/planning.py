"""The plain data a scheduling cycle plans over: a cluster snapshot, its active and queued jobs.

The control plane fills these from ORM rows (`apps/scheduling/snapshot.py`); the simulator fills
them from a trace. Both hand them to the same planner (`apps.placement.planner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from .jobs import JobSpec
from .topology import Topology


@dataclass(frozen=True, slots=True)
class GpuIndex:
    """gid <-> Gpu row id for one cluster, plus each gid's NIC name ("" for standalone nodes)."""

    gpu_pk: tuple[int, ...]
    gid_of_pk: Mapping[int, int]
    nic_name: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ActiveJob:
    """A job holding GPUs: its ranks' gids, its own flows per leaf and when it should end."""

    job_id: int
    priority: int
    gids: tuple[int, ...]
    flows: Mapping[str, float]
    begin: datetime | None
    expected_end: datetime | None
    running: bool
    started_at: datetime | None
    estimated_runtime_s: float | None
    overdue: bool = False
    # Its processes run under node agents: its GPUs free up only when they exited.
    launched: bool = False
    # Between two generations (old ranks stopping, new GPUs waiting): never a preemption victim.
    migrating: bool = False
    # Its account (None: none); placed beyond its account's running-GPU limit on idle capacity.
    account: int | None = None
    borrowed: bool = False
    submitted_at: datetime | None = None
    # The effective priority (see `apps.placement.priority`); None: the requested priority.
    effective: float | None = None
    # Its owner's user id and its QOS id (None: none, no QOS limits).
    owner: int | None = None
    qos: int | None = None
    # When its time limit runs out (begin + time_limit_min, else + estimated_runtime_s): what the
    # GPU-hour budgets charge it up to. None: `expected_end`.
    limit_end: datetime | None = None

    @property
    def rank(self) -> float:
        return float(self.priority) if self.effective is None else self.effective

    @property
    def charged_until(self) -> datetime | None:
        return self.limit_end if self.limit_end is not None else self.expected_end


def time_limit_s(spec: JobSpec) -> float | None:
    """A job's time limit in seconds, as the budgets charge it and a QOS's max wall time bounds
    it: its `time_limit_min` when set (what the agents and Slurm enforce), else its
    `estimated_runtime_s`; None without either."""
    minutes = spec.launch.time_limit_min
    return minutes * 60.0 if minutes is not None else spec.estimated_runtime_s


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A waiting job as the planner sees it."""

    job_id: int
    priority: int
    submitted_at: datetime
    spec: JobSpec
    policy: str | None
    pending_reason: str
    account: int | None = None
    effective: float | None = None
    owner: int | None = None
    qos: int | None = None

    @property
    def rank(self) -> float:
        return float(self.priority) if self.effective is None else self.effective


@dataclass(frozen=True, slots=True)
class AccountQuota:
    """An account's limits on one cluster and its use of them: at most `max_running_gpus` GPUs and
    `max_running_jobs` jobs held at once (None: no limit), at most `gpu_hours` GPU-hours in the trailing `period_h` hours (None:
    no limit) of which `used_gpu_hours` are spent; `may_borrow`: beyond its running limit it may
    take GPUs that are idle, as preemptible borrowed capacity."""

    account_id: int
    name: str
    max_running_gpus: int | None = None
    max_running_jobs: int | None = None
    gpu_hours: float | None = None
    period_h: float = 24.0
    used_gpu_hours: float = 0.0
    may_borrow: bool = False


@dataclass(frozen=True, slots=True)
class QosLimits:
    """A QOS's limits on its cluster (None: no limit) and how its jobs share capacity: GPUs per
    job, the longest time limit, GPUs and jobs held at once by all its jobs, per user and per account,
    `gpu_hours` in the trailing `period_h` hours (`used_gpu_hours` spent); `may_borrow`: beyond its
    running limits its jobs may run on idle GPUs as borrowed capacity; `preemptible`: jobs of a
    QOS that is not may preempt its jobs, whatever the priorities."""

    qos_id: int
    name: str
    priority: int = 0
    max_gpus_per_job: int | None = None
    max_wall_s: float | None = None
    max_running_gpus: int | None = None
    max_running_jobs: int | None = None
    max_running_gpus_per_user: int | None = None
    max_running_jobs_per_user: int | None = None
    max_running_gpus_per_account: int | None = None
    max_running_jobs_per_account: int | None = None
    gpu_hours: float | None = None
    period_h: float = 24.0
    used_gpu_hours: float = 0.0
    may_borrow: bool = False
    preemptible: bool = False


@dataclass(slots=True)
class ClusterSnapshot:
    """What a cycle plans against: topology, free mask over gids, link loads per leaf (sum of the
    active jobs' flows), and the active jobs. `stopping` (None: none) marks busy GPUs whose rank
    processes are being stopped (a preempted, cancelled or failed job's, an older generation's):
    they free up once those processes exited."""

    cluster_id: int
    topology: Topology
    index: GpuIndex
    free: np.ndarray
    link_load: dict[str, float]
    active: list[ActiveJob] = field(default_factory=list)
    stopping: np.ndarray | None = None
