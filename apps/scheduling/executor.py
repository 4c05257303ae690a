"""The executor port: what scheduling asks of whoever runs the placed ranks.

Scheduling never imports an executor. Each executor (`apps.executors.agents`, `apps.executors.slurm`)
implements `Executor` and registers itself when Django starts (`register`); scheduling asks the
registry which one runs a cluster (`executor_for`). Every call is cheap and must not raise for
an executor's own trouble (a broker or slurmrestd that is away is logged, and the executor's
periodic `reconcile` converges later). Each acts on `wake` and `stop` only once the caller's
transaction commits.

    wake(cluster_id, nodes)   something was placed (or changed) on those nodes: start it soon
    stop(cluster_id, job_id)  the job left a generation (finished, requeued, migrating): stop its
                              ranks; their GPUs are released as the executor confirms the exits
    can_migrate(cluster_id)   may a running job be moved to other GPUs (a new generation)?
    reconcile(cluster)        converge actual on desired state; run by beat and the embedded
                              scheduler every few seconds
    foreign(cluster)          GPUs its other work holds (jobs TopoWeb did not submit), out of
                              the free set
    check(cluster)            what does not converge, for `manage.py reconcile --check`: a list
                              of `Finding`s, each naming what is wrong
    set_node(cluster_id, node, state, reason)
                              an operator drains ("drain", with a reason) or resumes ("resume")
                              a node: done where the executor keeps node states (Slurm), before
                              TopoWeb records it; raises `Refused` (a 409 to the operator, saying
                              how to do it there) when the executor cannot
    owner_refusal(cluster_id, user_id, username)
                              why a job of that user cannot run on the cluster as their Unix
                              account ("" when it can): asked at submission, so the user gets
                              a 400 naming the owner instead of a job that fails later (an
                              executor that checks nothing reads nothing)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Refused(Exception):
    """The executor cannot do what an operator asked (its words say how to do it instead)."""


@dataclass(frozen=True, slots=True)
class ForeignHold:
    """A GPU that work the executor runs but TopoWeb did not place holds (a job submitted straight
    to Slurm): `holder` tells such jobs apart, `gbps_per_gpu` is its assumed traffic per GPU on
    the leaf uplinks when it spans leaves (0: none assumed)."""

    node: str
    gpu_index: int
    holder: int
    gbps_per_gpu: float = 0.0


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing `check` found that should not be: `kind` (a short slug), and what it is, in words."""

    kind: str
    text: str


class Executor(Protocol):
    name: str

    def runs(self, cluster_id: int) -> bool: ...

    def wake(self, cluster_id: int, nodes: Iterable[str] | None) -> None: ...

    def stop(self, cluster_id: int, job_id: int) -> None: ...

    def can_migrate(self, cluster_id: int) -> bool: ...

    def reconcile(self, cluster: Any) -> dict[str, Any]: ...

    def check(self, cluster: Any) -> list[Finding]: ...

    def foreign(self, cluster: Any) -> list[ForeignHold]: ...

    def owner_refusal(self, cluster_id: int, user_id: int, username: str) -> str: ...

    def set_node(self, cluster_id: int, node: str, state: str, reason: str) -> None: ...


# Asked in order: the first whose `runs` says yes runs the cluster; the last is the default.
_REGISTRY: list[Executor] = []


def register(executor: Executor, *, default: bool = False) -> None:
    """Add an executor (again: replaced); `default` puts it last, asked when no other runs a cluster."""
    _REGISTRY[:] = [e for e in _REGISTRY if e.name != executor.name]
    if default:
        _REGISTRY.append(executor)
    else:
        _REGISTRY.insert(0, executor)


def registered() -> list[Executor]:
    return list(_REGISTRY)


def executor_for(cluster_id: int) -> Executor:
    """The executor that runs the cluster's jobs."""
    if not _REGISTRY:
        raise RuntimeError("no executor is registered (is apps.executors in INSTALLED_APPS?)")
    for e in _REGISTRY[:-1]:
        if e.runs(cluster_id):
            return e
    return _REGISTRY[-1]


def wake(cluster_id: int, nodes: Iterable[str] | None) -> None:
    """Tell the cluster's executor that work on `nodes` (None: any) changed; it acts once the
    caller's transaction commits."""
    executor_for(cluster_id).wake(cluster_id, None if nodes is None else sorted(set(nodes)))


def stop(cluster_id: int, job_id: int) -> None:
    """Tell the cluster's executor to stop the job's ranks; it acts once the caller's transaction
    commits."""
    executor_for(cluster_id).stop(cluster_id, job_id)


def can_migrate(cluster_id: int) -> bool:
    return executor_for(cluster_id).can_migrate(cluster_id)


def reconcile(*, cluster: Any) -> dict[str, Any]:
    """Let the cluster's executor converge on what the lifecycle wants (see `Executor.reconcile`)."""
    return executor_for(cluster.pk).reconcile(cluster)


def owner_refusal(cluster_id: int, user_id: int, username: str) -> str:
    """Why the cluster's executor cannot run the user's ranks as their Unix account ("" when it can)."""
    return executor_for(cluster_id).owner_refusal(cluster_id, user_id, username)


def set_node(cluster_id: int, node: str, state: str, reason: str = "") -> None:
    """Drain ("drain") or resume ("resume") `node` where the cluster's executor keeps node states;
    `Refused` when it cannot."""
    if state not in ("drain", "resume"):
        raise ValueError(f"state must be drain or resume, not {state!r}")
    executor_for(cluster_id).set_node(cluster_id, node, state, reason)


def foreign_holds(cluster: Any) -> list[ForeignHold]:
    """Every GPU of `cluster` that work TopoWeb did not place holds, as its executors see it."""
    return [h for e in _REGISTRY for h in e.foreign(cluster)]
