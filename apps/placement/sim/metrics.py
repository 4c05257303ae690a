"""Metrics of a replay: JCT, queueing, makespan, communication, MFU, utilisation, fragmentation.

Times in s, GPU-hours in h, shares as fractions. Utilisation and fragmentation are time-weighted
means over the makespan of step functions sampled at every event; fragmentation is the share of
free GPUs in NVLink domains with fewer than 8 free (they cannot host an 8-GPU job in one domain).
`utilisation_window` is the busy share over the arrival window (`engine.arrival_window`), the
figure to set beside the offered load; `busy_while_waiting` the busy share over the time some job
waits (a scheduler that idles GPUs while jobs queue shows here), `waiting_share` that time's share
of the makespan.
"""

from __future__ import annotations

import numpy as np

from .engine import PolicyRun


def time_weighted_mean(times_s: list[float], values: list[float], end_s: float) -> float:
    """Mean of the step function `values[i]` on [times_s[i], times_s[i+1]) up to `end_s`."""
    if not times_s or end_s <= times_s[0]:
        return 0.0
    t = np.asarray(times_s + [end_s], dtype=float)
    widths = np.diff(t)
    return float(np.dot(widths, np.asarray(values, dtype=float)) / (end_s - t[0]))


def window_mean(times_s: list[float], values: list[float], start_s: float, end_s: float) -> float | None:
    """Mean of the step function `values[i]` on [times_s[i], times_s[i+1]) over [start_s, end_s]
    (the last value holds on to `end_s`); None for an empty window or no samples."""
    if not times_s or end_s <= start_s:
        return None
    t = np.clip(np.asarray(times_s + [max(end_s, times_s[-1])], dtype=float), start_s, end_s)
    widths = np.diff(t)
    # Before the first sample nothing ran: it counts as 0 over the window.
    return float(np.dot(widths, np.asarray(values, dtype=float)) / (end_s - start_s))


def summarize(run: PolicyRun) -> dict:
    """A policy's metrics as a JSON-ready dict (see the module docstring for units)."""
    out = run.outcomes
    jct = np.array([o.jct_s for o in out])
    queued = np.array([o.queued_s for o in out])
    stretch = np.array([(o.end_s - o.start_s) / o.ideal_runtime_s for o in out if o.ideal_runtime_s > 0])
    makespan = max((o.end_s for o in out), default=0.0)
    gpu_s = run.n_gpus * makespan

    def stats(xs: np.ndarray) -> dict:
        if not xs.size:
            return {"mean": None, "median": None, "p95": None}
        return {
            "mean": float(xs.mean()),
            "median": float(np.median(xs)),
            "p95": float(np.percentile(xs, 95)),
        }

    busy = [b / run.n_gpus for b in run.busy]
    # Busy share while some job waits: the time-weighted mean over the intervals with a queue.
    waits = np.asarray(run.waiting, dtype=bool)
    widths = np.diff(np.asarray(run.times_s + [makespan], dtype=float)) if run.times_s else np.zeros(0)
    waited = float(widths[waits].sum()) if widths.size else 0.0
    busy_waiting = float(np.dot(widths[waits], np.asarray(busy)[waits]) / waited) if waited > 0 else None
    return {
        "policy": run.policy,
        "jobs": len(out),
        "rejected": len(run.rejected),
        "jct_s": stats(jct),
        "queueing_s": stats(queued),
        "runtime_stretch": stats(stretch),
        "makespan_s": makespan,
        "comm_gpu_hours": sum(o.comm_gpu_s for o in out) / 3600.0,
        "effective_mfu": sum(o.mfu_gpu_s for o in out) / gpu_s if gpu_s > 0 else 0.0,
        "utilisation": time_weighted_mean(run.times_s, busy, makespan),
        "utilisation_window": window_mean(run.times_s, busy, *run.window_s),
        "busy_while_waiting": busy_waiting,
        "waiting_share": waited / (makespan - run.times_s[0])
        if run.times_s and makespan > run.times_s[0]
        else 0.0,
        "fragmentation": time_weighted_mean(run.times_s, run.fragmentation, makespan),
        "cycles": run.cycles,
        "migrations": run.migrations,
        "preemptions": run.preemptions,
    }


def chart_series(run: PolicyRun, points: int = 600) -> dict:
    """At most `points` samples of utilisation and fragmentation over time (the first event of
    each equal-width time bucket) and the JCT CDF at 200 quantiles."""
    n = len(run.times_s)
    if n > points:
        t = np.asarray(run.times_s)
        edges = np.linspace(t[0], t[-1], points)
        idx = np.unique(np.searchsorted(t, edges))
        idx = idx[idx < n]
    else:
        idx = np.arange(n)
    jct = np.sort([o.jct_s for o in run.outcomes])
    shares = np.linspace(0.0, 1.0, 201)[1:]
    return {
        "times_s": [float(run.times_s[i]) for i in idx],
        "utilisation": [run.busy[i] / run.n_gpus for i in idx],
        "fragmentation": [float(run.fragmentation[i]) for i in idx],
        "jct_cdf": {
            "jct_s": [float(x) for x in np.quantile(jct, shares)] if jct.size else [],
            "share": [float(x) for x in shares] if jct.size else [],
        },
    }
