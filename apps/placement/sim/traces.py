"""Trace adapters: public cluster traces into `TraceJob`s (arrival, GPUs, duration).

Formats (detected from the CSV header, or named with `fmt`):
- `philly`: the Philly-derived traces of Pollux/adaptdl (`timestamp,duration,num_gpus,...`);
  arrival = timestamp (ISO, seconds) less the first row's, duration in s.
- `alibaba`: Alibaba GPU cluster trace v2023 openb pod lists (`name,...,num_gpu,gpu_milli[,...,
  creation_time,deletion_time,scheduled_time]`); arrival = creation_time, duration =
  deletion_time - scheduled_time. CPU-only pods and pods never scheduled are left out (counted in
  `ignored`). A fractional GPU (`gpu_milli` < 1000) counts as one whole GPU: sharing is not
  modelled. Lists without time columns (`multigpu50`) take each pod's times from the `default`
  list beside them when it holds the pod's name; other pods get a duration drawn (seeded) from the
  timed pods' durations and an arrival drawn from the timed pods' arrivals. A pod's `gpu_spec`
  (`P100|V100M16|V100M32`: the GPU types it may run on; empty for any) becomes its `gpu_models`.
- `tiresias`: Tiresias' `job_id,num_gpu,submit_time,iterations,model_name,duration,interval`.
- `pollux`: Pollux workload files (`name,time,application,num_replicas,batch_size`); they carry no
  duration, so each application gets an assumed runtime (`POLLUX_RUNTIME_S`, our assumption, not
  from the source).

A malformed row is reported with its line number (1 = the header) and skipped, or raises
`TraceError` with `strict=True`.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from ..topology.ranges import GPU_MODEL_RE, MAX_JOB_GPU_MODELS

FORMATS = ("philly", "alibaba", "tiresias", "pollux")
MAX_TRACE_BYTES = 256 * 2**20
MAX_GPUS_PER_JOB = 65_536
MAX_DURATION_S = 10 * 365 * 86_400.0
# Assumed single-run times (s) of Pollux's applications at their requested replicas.
POLLUX_RUNTIME_S = {
    "cifar10": 1_800.0,
    "ncf": 900.0,
    "bert": 3_600.0,
    "deepspeech2": 7_200.0,
    "yolov3": 14_400.0,
    "imagenet": 28_800.0,
}

_HEADERS = {
    "philly": {"timestamp", "duration", "num_gpus"},
    "alibaba": {"name", "num_gpu", "gpu_milli"},
    "tiresias": {"job_id", "num_gpu", "submit_time", "duration"},
    "pollux": {"name", "time", "application", "num_replicas"},
}


class TraceError(ValueError):
    """A trace that cannot be read, or a malformed row under `strict`; `line` is 0 for the file."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.reason = message


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: arrival (s after the trace's start), GPUs, duration (s), application
    name and the GPU models it may run on when the trace gives them (none: any)."""

    name: str
    arrival_s: float
    gpus: int
    duration_s: float
    app: str = ""
    gpu_models: tuple[str, ...] = ()


@dataclass(slots=True)
class TraceRead:
    """A read trace: its jobs by arrival, malformed rows (line, reason) and rows left out on
    purpose (reason -> count)."""

    fmt: str
    jobs: list[TraceJob]
    malformed: list[tuple[int, str]] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)


def read_trace(
    path: str, fmt: str = "auto", *, strict: bool = False, limit: int | None = None, seed: int = 0
) -> TraceRead:
    """Read a trace file into jobs sorted by arrival (first `limit` of them when given).

    `fmt` is one of FORMATS or "auto" (from the header). Raises TraceError for an unreadable or
    unknown file, and for a malformed row when `strict`."""
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise TraceError(0, f"cannot read {path}: {exc.strerror or exc}") from exc
    if size > MAX_TRACE_BYTES:
        raise TraceError(0, f"{path} is {size} bytes, over the {MAX_TRACE_BYTES} byte limit")
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        fmt = _format(header, fmt)
        out = TraceRead(fmt, [])
        rows = _rows(reader, header, out, strict)
        if fmt == "philly":
            _philly(rows, out)
        elif fmt == "alibaba":
            _alibaba(rows, header, out, path, seed)
        elif fmt == "tiresias":
            _tiresias(rows, out)
        else:
            _pollux(rows, out)
    out.jobs.sort(key=lambda j: (j.arrival_s, j.name))
    if limit is not None:
        out.jobs = out.jobs[:limit]
    if out.jobs:
        first = out.jobs[0].arrival_s
        if first:
            out.jobs = [_shifted(j, -first) for j in out.jobs]
    return out


def _format(header: list[str], fmt: str) -> str:
    if fmt != "auto":
        if fmt not in FORMATS:
            raise TraceError(0, f"format must be one of {', '.join(FORMATS)} or auto, got {fmt!r}")
        if not _HEADERS[fmt] <= set(header):
            missing = ", ".join(sorted(_HEADERS[fmt] - set(header)))
            raise TraceError(1, f"a {fmt} trace needs the columns {missing}")
        return fmt
    for name, cols in _HEADERS.items():
        if cols <= set(header):
            return name
    raise TraceError(1, f"unknown trace header {','.join(header)[:200]!r}; name the format")


def _rows(reader, header: list[str], out: TraceRead, strict: bool) -> Iterator[tuple[int, dict, _Bad]]:
    """(line, row as a dict, bad-row reporter) for every data row of the right width."""
    bad = _Bad(out, strict)
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            bad(line, f"{len(row)} fields, the header has {len(header)}")
            continue
        yield line, dict(zip(header, (c.strip() for c in row), strict=True)), bad


class _Bad:
    """Records a malformed row, or raises under strict."""

    def __init__(self, out: TraceRead, strict: bool):
        self.out, self.strict = out, strict

    def __call__(self, line: int, reason: str) -> None:
        if self.strict:
            raise TraceError(line, reason)
        self.out.malformed.append((line, reason))


def _number(row: dict, col: str, lo: float, hi: float) -> float:
    text = row.get(col, "")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{col}: not a number: {text[:40]!r}") from None
    if not lo <= value <= hi:  # also false for NaN
        raise ValueError(f"{col}: {value!r} is outside {lo:g}..{hi:g}")
    return value


def _gpus(row: dict, col: str, lo: int = 1) -> int:
    value = _number(row, col, lo, MAX_GPUS_PER_JOB)
    if value != int(value):
        raise ValueError(f"{col}: must be a whole number, got {row[col]!r}")
    return int(value)


def _duration(value: float, col: str) -> float:
    if not 0 < value <= MAX_DURATION_S:
        raise ValueError(f"{col}: duration {value!r} s is outside (0, {MAX_DURATION_S:g}]")
    return value


def _philly(rows, out: TraceRead) -> None:
    for line, row, bad in rows:
        try:
            at = datetime.fromisoformat(row["timestamp"]).timestamp()
        except ValueError:
            bad(line, f"timestamp: not an ISO date and time: {row['timestamp'][:40]!r}")
            continue
        try:
            gpus = _gpus(row, "num_gpus")
            duration = _duration(_number(row, "duration", 0, MAX_DURATION_S), "duration")
        except ValueError as exc:
            bad(line, str(exc))
            continue
        out.jobs.append(TraceJob(f"philly-{line - 1}", at, gpus, duration))


def _tiresias(rows, out: TraceRead) -> None:
    for line, row, bad in rows:
        try:
            gpus = _gpus(row, "num_gpu")
            at = _number(row, "submit_time", 0, MAX_DURATION_S)
            duration = _duration(_number(row, "duration", 0, MAX_DURATION_S), "duration")
        except ValueError as exc:
            bad(line, str(exc))
            continue
        app = row.get("model_name", "")
        out.jobs.append(TraceJob(f"tiresias-{row['job_id'][:32] or line}", at, gpus, duration, app))


def _pollux(rows, out: TraceRead) -> None:
    for line, row, bad in rows:
        app = row["application"]
        if app not in POLLUX_RUNTIME_S:
            bad(line, f"application: unknown {app[:40]!r}, expected one of {', '.join(POLLUX_RUNTIME_S)}")
            continue
        try:
            gpus = _gpus(row, "num_replicas")
            at = _number(row, "time", 0, MAX_DURATION_S)
        except ValueError as exc:
            bad(line, str(exc))
            continue
        out.jobs.append(TraceJob(f"pollux-{line - 1}", at, gpus, POLLUX_RUNTIME_S[app], app))


_ALIBABA_TIMES = ("creation_time", "deletion_time", "scheduled_time")


def _alibaba(rows, header: list[str], out: TraceRead, path: str, seed: int) -> None:
    timed = all(c in header for c in _ALIBABA_TIMES)
    times = {} if timed else _alibaba_companion_times(path)
    untimed: list[tuple[str, int, tuple[str, ...]]] = []
    for line, row, bad in rows:
        try:
            gpus = _gpus(row, "num_gpu", lo=0)
            _number(row, "gpu_milli", 0, 1000 * MAX_GPUS_PER_JOB)
            models = _gpu_spec(row.get("gpu_spec") or "")
        except ValueError as exc:
            bad(line, str(exc))
            continue
        if gpus == 0:
            out.ignored["no GPU (CPU-only pod)"] = out.ignored.get("no GPU (CPU-only pod)", 0) + 1
            continue
        name = row["name"][:64] or f"pod-{line}"
        if timed:
            got = _alibaba_row_times(row)
        else:
            got = times.get(name, "untimed")
            if got == "untimed":
                untimed.append((name, gpus, models))
                continue
        if isinstance(got, str):
            if got.startswith("never"):
                out.ignored[got] = out.ignored.get(got, 0) + 1
            else:
                bad(line, got)
            continue
        out.jobs.append(TraceJob(name, got[0], gpus, got[1], gpu_models=models))
    if untimed:
        _alibaba_fill(out, untimed, seed)


def _gpu_spec(value: str) -> tuple[str, ...]:
    """The GPU models of a `gpu_spec` value (`A|B|B`: distinct, in order); () when empty."""
    models = tuple(dict.fromkeys(m.strip() for m in value.split("|") if m.strip()))
    bad = next((m for m in models if not GPU_MODEL_RE.match(m)), None)
    if bad is not None:
        raise ValueError(f"gpu_spec: {bad[:40]!r} is not a GPU model name")
    if len(models) > MAX_JOB_GPU_MODELS:
        raise ValueError(f"gpu_spec: {len(models)} models; the limit is {MAX_JOB_GPU_MODELS}")
    return models


def _alibaba_row_times(row: dict) -> tuple[float, float] | str:
    """(arrival s, duration s), or why not: "never scheduled..." (left out) or the malformed field."""
    if not row["scheduled_time"] or not row["deletion_time"]:
        return "never scheduled or never ended"
    try:
        created = _number(row, "creation_time", 0, MAX_DURATION_S)
        start = _number(row, "scheduled_time", 0, MAX_DURATION_S)
        end = _number(row, "deletion_time", 0, MAX_DURATION_S)
    except ValueError as exc:
        return str(exc)
    if end <= start:
        return "never ran (deletion_time at or before scheduled_time)"
    return created, end - start


def _alibaba_companion_times(path: str) -> dict[str, tuple[float, float] | str]:
    """Times by pod name from the `default` pod list in the same folder ({} when absent)."""
    folder, base = os.path.split(path)
    stem = base.rsplit("_pod_list_", 1)[0]
    companion = os.path.join(folder, f"{stem}_pod_list_default.csv")
    if companion == path or not os.path.exists(companion):
        return {}
    with open(companion, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if not set(_ALIBABA_TIMES) <= set(reader.fieldnames or ()):
            return {}
        return {row["name"][:64]: _alibaba_row_times(row) for row in reader if row.get("name")}


def _alibaba_fill(out: TraceRead, untimed: list[tuple[str, int, tuple[str, ...]]], seed: int) -> None:
    """Give pods without times a seeded duration and arrival, each drawn from the timed pods'
    (independently): the drawn pods arrive as the timed ones do, not spread over a span that a few
    early pods stretch."""
    if not out.jobs:
        raise TraceError(0, "no pod of this list has times, and no default pod list beside it gives them")
    rng = np.random.default_rng(seed)
    durations = np.array([j.duration_s for j in out.jobs])
    timed_arrivals = np.array([j.arrival_s for j in out.jobs])
    picks = rng.integers(len(durations), size=len(untimed))
    arrivals = timed_arrivals[rng.integers(len(timed_arrivals), size=len(untimed))]
    for (name, gpus, models), pick, at in zip(untimed, picks, arrivals, strict=True):
        out.jobs.append(TraceJob(name, float(at), gpus, float(durations[pick]), gpu_models=models))
    out.ignored["times drawn (no times in the trace)"] = len(untimed)


def _shifted(job: TraceJob, by_s: float) -> TraceJob:
    return TraceJob(job.name, job.arrival_s + by_s, job.gpus, job.duration_s, job.app, job.gpu_models)
