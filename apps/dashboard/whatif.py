"""What-if: every placement policy on a cluster's free GPUs (plus the job's own), priced.

Pure core calls over plain data; the job page renders the rows as the policy comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apps.placement.jobs import JobSpec
from apps.placement.solvers import POLICIES, NoFit, place
from apps.placement.topology import LEVEL_RANK, Topology


@dataclass(frozen=True, slots=True)
class WhatIfRow:
    """One policy's outcome: predicted step and comm time (ms), MFU (fraction), the highest
    level each group kind reaches, how many ranks would move, or why it does not fit."""

    policy: str
    fits: bool
    step_ms: float | None = None
    comm_ms: float | None = None
    mfu: float | None = None
    levels: str = ""
    moved_ranks: int | None = None
    compute_ms: float | None = None
    gain: float | None = None  # (current - this) / current step time
    reason: str = ""
    is_current: bool = False


def _levels(prediction) -> str:
    worst: dict[str, str] = {}
    for g in prediction.groups:
        if len(g.ranks) < 2:
            continue
        if g.group not in worst or LEVEL_RANK[g.level] > LEVEL_RANK[worst[g.group]]:
            worst[g.group] = g.level
    return ", ".join(f"{k}: {v}" for k, v in sorted(worst.items()))


def what_if(
    topo: Topology,
    job: JobSpec,
    *,
    free: np.ndarray,
    own_gids: Sequence[int] = (),
    link_load: Mapping[str, float] | None = None,
    own_flows: Mapping[str, float] | None = None,
    current_step_ms: float | None = None,
) -> list[WhatIfRow]:
    """Every policy of the core placed on `free` plus `own_gids` (bool mask over gids), with the
    other jobs' link load (`link_load` minus `own_flows`, offered GB/s per leaf name)."""
    mask = np.asarray(free, dtype=bool).copy()
    own = np.asarray(own_gids, dtype=np.int64)
    if own.size:
        mask[own] = True
    load = dict(link_load or {})
    for leaf, flows in (own_flows or {}).items():
        left = load.get(leaf, 0.0) - float(flows)
        if left > 1e-9:
            load[leaf] = left
        else:
            load.pop(leaf, None)
    rows = []
    for policy in POLICIES:
        result = place(topo, mask, load, job, policy=policy)
        if isinstance(result, NoFit):
            rows.append(WhatIfRow(policy=policy, fits=False, reason=result.reason))
            continue
        p = result.prediction
        gids = np.asarray(result.gids, dtype=np.int64)
        moved = int(np.count_nonzero(gids != own)) if own.size == gids.size else None
        gain = None
        if current_step_ms:
            gain = (current_step_ms - p.step_ms) / current_step_ms
        rows.append(
            WhatIfRow(
                policy=policy,
                fits=True,
                step_ms=float(p.step_ms),
                comm_ms=float(p.comm_ms),
                mfu=None if p.mfu is None else float(p.mfu),
                compute_ms=float(job.compute_ms),
                levels=_levels(p),
                moved_ranks=moved,
                gain=gain,
                is_current=moved == 0,
            )
        )
    return rows
