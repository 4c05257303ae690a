"""Per-job measures over the job's GPUs in one interval: utilisation beside MFU, and the exposed
communication share, each labelled by where it comes from.

- MFU: from the job's report (`flops / (step time x GPUs x peak)`) when one is fresh, else
  estimated from tensor-pipe activity: a tensor pipe busy a fraction `a` of the time delivers
  `a x peak` FLOP/s, so the estimate is the mean tensor-active over the job's GPUs (dense peak).
- Step time: the report's, else the one the estimated MFU implies, `flops / (MFU x GPUs x peak)`.
- Exposed communication share `(step - compute) / step`: from the report's `comm_ms` when sent,
  else from the step time above against the spec's compute time (the rest of the step is time
  the tensor pipes wait, which on a training job is communication not hidden by overlap).
The predicted share uses the same definition on the predicted step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The values of choices.MeasureSource (this module stays free of Django).
REPORT = "report"
ESTIMATE = "estimate"


@dataclass(frozen=True, slots=True)
class Report:
    """A job's latest own report: step time (ms), achieved FLOPs per step and comm time (ms)."""

    step_ms: float
    flops_per_step: float | None = None
    comm_ms: float | None = None


@dataclass(frozen=True, slots=True)
class JobMeasure:
    """One interval's figures for one job; None where nothing measured them."""

    gpus_measured: int
    gpu_util: float | None
    tensor_active: float | None
    mfu: float | None
    mfu_source: str
    comm_share: float | None
    comm_source: str
    step_ms: float | None


def mean(values: Sequence[float | None]) -> float | None:
    """Mean of the values present (None when none is)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def exposed_share(step_ms: float | None, compute_ms: float) -> float | None:
    """`(step - compute) / step`, clamped to 0..1; None without a step time."""
    if step_ms is None or step_ms <= 0:
        return None
    return min(max((step_ms - compute_ms) / step_ms, 0.0), 1.0)


def job_measure(
    *,
    gpu_util: Sequence[float | None],
    tensor_active: Sequence[float | None],
    gpus: int,
    peak_tflops: float,
    flops_per_step: float | None,
    compute_ms: float,
    report: Report | None,
) -> JobMeasure:
    """Figures of one job from its GPUs' latest values (one entry per measured GPU) and its
    latest report; see the module docstring for the formulas."""
    util = mean(gpu_util)
    tensor = mean(tensor_active)
    peak_total = gpus * peak_tflops * 1e12  # FLOP/s of the job's GPUs at peak
    mfu = step_ms = None
    mfu_source = comm_source = ""
    if report is not None:
        step_ms = report.step_ms
        flops = report.flops_per_step or flops_per_step
        if flops and step_ms > 0:
            mfu, mfu_source = flops / (step_ms / 1e3 * peak_total), REPORT
    if mfu is None and tensor is not None:
        mfu, mfu_source = tensor, ESTIMATE
        if flops_per_step and tensor > 0 and step_ms is None:
            step_ms = flops_per_step / (tensor * peak_total) * 1e3
    comm = None
    if report is not None and report.comm_ms is not None and report.step_ms > 0:
        comm, comm_source = min(report.comm_ms / report.step_ms, 1.0), REPORT
    elif step_ms is not None:
        comm = exposed_share(step_ms, compute_ms)
        comm_source = REPORT if report is not None else ESTIMATE
    return JobMeasure(
        gpus_measured=len(
            [v for v in tensor_active if v is not None] or [v for v in gpu_util if v is not None]
        ),
        gpu_util=util,
        tensor_active=tensor,
        mfu=None if mfu is None else min(mfu, 1.0),
        mfu_source=mfu_source if mfu is not None else "",
        comm_share=comm,
        comm_source=comm_source if comm is not None else "",
        step_ms=step_ms,
    )
