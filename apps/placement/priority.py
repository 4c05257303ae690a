"""Accounts' use of a cluster, their fair-share factors and jobs' effective priorities, over plain data.

The effective priority of a job (higher runs first, and may preempt lower ones) is a weighted sum
of four terms, as in Slurm's multifactor priority:

    effective = W_requested * requested + W_age * age_factor + W_fair_share * fair_share_factor
                + W_qos * qos_priority

- `requested` is the job spec's `priority`, already bounded at submission by the account's or the
  role's maximum.
- `age_factor` = min(waited / AGE_MAX_S, 1): 0 at submission, 1 after a week.
- `fair_share_factor` = 2 ** -(usage_share / shares_share): 1 for an account that has used
  nothing recently, 0.5 for one that used exactly its share of the recent GPU-seconds, towards 0
  the more it used beyond that. `usage_share` is the account's decayed GPU-seconds on the cluster
  over every account's; a GPU-second `t` seconds ago counts 2 ** -(t / half_life_s). A job
  without an account gets no better than an account at its share, nor than any account on the
  cluster: the lowest of 0.5 and every account's factor (`no_account_factor`).
- `qos_priority` is the priority of the job's QOS (0 for `normal`).

No Django here: the control plane (`apps/scheduling/accounts.py`) and the fair-share benchmark
hand in the same plain data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

DEFAULT_HALF_LIFE_S = 24 * 3600.0
AGE_MAX_S = 7 * 24 * 3600.0
NEUTRAL_FAIR_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    """The weights of the effective priority's terms (see the module docstring)."""

    requested: float = 1.0
    age: float = 10.0
    fair_share: float = 100.0
    qos: float = 1.0


@dataclass(frozen=True, slots=True)
class Usage:
    """`gpus` GPUs of account `account` held from `begin` to `end` (None: still held)."""

    account: int
    gpus: int
    begin: datetime
    end: datetime | None


@dataclass(frozen=True, slots=True)
class PriorityTerms:
    """A job's effective priority and its weighted terms (the sum of the four is `effective`)."""

    requested: float
    age: float
    fair_share: float
    age_factor: float
    fair_share_factor: float
    qos: float = 0.0
    qos_priority: int = 0

    @property
    def effective(self) -> float:
        return round(self.requested + self.age + self.fair_share + self.qos, 6)


def decayed_gpu_seconds(usage: Iterable[Usage], *, now: datetime, half_life_s: float) -> dict[int, float]:
    """Each account's GPU-seconds up to `now`, a second `t` s ago weighing 2 ** -(t / half_life_s)."""
    rate = math.log(2) / half_life_s
    out: dict[int, float] = {}
    for u in usage:
        end = now if u.end is None or u.end > now else u.end
        if end <= u.begin:
            continue
        # The integral of gpus * exp(-rate * (now - t)) dt from begin to end.
        ago_end = (now - end).total_seconds()
        ago_begin = (now - u.begin).total_seconds()
        part = (math.exp(-rate * ago_end) - math.exp(-rate * ago_begin)) / rate
        out[u.account] = out.get(u.account, 0.0) + u.gpus * part
    return out


def fair_share_factors(used: Mapping[int, float], shares: Mapping[int, float]) -> dict[int, float]:
    """2 ** -(usage_share / shares_share) per account of `shares` (accounts with share 0 get 0)."""
    total_used = sum(max(v, 0.0) for v in used.values())
    total_shares = sum(max(s, 0.0) for s in shares.values())
    out: dict[int, float] = {}
    for account, share in shares.items():
        if share <= 0 or total_shares <= 0:
            out[account] = 0.0
            continue
        usage_share = max(used.get(account, 0.0), 0.0) / total_used if total_used > 0 else 0.0
        out[account] = 2.0 ** -(usage_share / (share / total_shares))
    return out


def no_account_factor(factors: Mapping[int, float]) -> float:
    """The fair-share factor of jobs without an account: no better than an account at its share
    (0.5), nor than the lowest account's on the cluster."""
    return min([NEUTRAL_FAIR_SHARE, *factors.values()])


def priority_terms(
    *,
    requested: int,
    submitted_at: datetime,
    now: datetime,
    fair_share_factor: float | None,
    weights: PriorityWeights = PriorityWeights(),  # noqa: B008  (frozen, shared safely)
    qos_priority: int = 0,
) -> PriorityTerms:
    """The effective priority's terms for a job (`fair_share_factor` None: 0.5, see
    `no_account_factor` for jobs without an account)."""
    waited_s = max((now - submitted_at).total_seconds(), 0.0)
    age_factor = min(waited_s / AGE_MAX_S, 1.0)
    fs = NEUTRAL_FAIR_SHARE if fair_share_factor is None else fair_share_factor
    return PriorityTerms(
        requested=weights.requested * requested,
        age=weights.age * age_factor,
        fair_share=weights.fair_share * fs,
        age_factor=age_factor,
        fair_share_factor=fs,
        qos=weights.qos * qos_priority,
        qos_priority=qos_priority,
    )
