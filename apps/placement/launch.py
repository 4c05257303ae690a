"""Job spec v1 launch fields: what the node agents run for each rank, and how it stops.

`command` (argv list), `env` (extra variables), `workdir` (absolute path), `requeue` (back to the
queue instead of failing when a rank is lost to a fault not its own: its node down, its ranks
fenced or lost), `max_requeues` (how many such requeues before the job fails all the same),
`stop_grace_s` (SIGTERM to SIGKILL, the checkpoint grace period of a migration or cancel),
`time_limit_min` (whole minutes from the start after which the job is stopped and failed with
reason "time limit", on every executor; absent: none), and the per-rank limits `pids_max`
(processes and threads) and `memory_mb` (MiB; the node agent's own flags are the ceiling of
both). Every field is bounded; the variables the
agent sets itself (RANK, CUDA_VISIBLE_DEVICES, ...) and those that could redirect the code or
devices a rank uses (LD_*, PATH, CUDA_*, ...: `apps.launch_contract.denied_env`) cannot be set.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apps.launch_contract import LAUNCH_CONTRACT, LAUNCH_CONTRACT_PREFIX, denied_env

from .topology.checks import _Errors

LAUNCH_FIELDS = frozenset(
    {
        "command",
        "env",
        "workdir",
        "requeue",
        "max_requeues",
        "stop_grace_s",
        "time_limit_min",
        "pids_max",
        "memory_mb",
    }
)
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
MAX_COMMAND_CHARS = 65536
MAX_ENV_VARS = 128
MAX_ENV_NAME_CHARS = 128
MAX_ENV_VALUE_CHARS = 4096
MAX_WORKDIR_CHARS = 1024
MAX_STOP_GRACE_S = 3600.0
DEFAULT_STOP_GRACE_S = 30.0
MAX_TIME_LIMIT_MIN = 30 * 24 * 60  # 30 days
# Requeues after faults not the job's own before it fails (Slurm's MaxBatchRequeue is 5 too).
DEFAULT_MAX_REQUEUES = 5
MAX_REQUEUES = 100
# Per-rank limits a job may ask for: processes and threads, and memory in MiB (up to 4 TiB).
PIDS_MAX_RANGE = (64, 1_048_576)
MEMORY_MB_RANGE = (64, 4_194_304)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Set per rank by every launcher (the launch contract): a job may not replace them.
RESERVED_ENV = LAUNCH_CONTRACT
RESERVED_ENV_PREFIX = LAUNCH_CONTRACT_PREFIX


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How each rank runs: argv, extra environment (sorted name/value pairs), working directory,
    requeue on faults not its own (at most `max_requeues` times), the stop grace period in
    seconds, the time limit in minutes (None: none), and the per-rank limits (None: the node
    agent's own)."""

    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    requeue: bool = False
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    time_limit_min: int | None = None
    max_requeues: int = DEFAULT_MAX_REQUEUES
    pids_max: int | None = None
    memory_mb: int | None = None


def _text(errs: _Errors, path: str, value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        errs.add(path, f"must be a string, got {type(value).__name__}")
        return None
    if len(value) > limit:
        errs.add(path, f"must be at most {limit} characters, got {len(value)}")
        return None
    if "\x00" in value:
        errs.add(path, "must not contain a NUL character")
        return None
    return value


def _command(errs: _Errors, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        errs.add("command", "must be a non-empty list of strings (argv), e.g. [python, train.py]")
        return ()
    if len(value) > MAX_ARGS:
        errs.add("command", f"must have at most {MAX_ARGS} arguments, got {len(value)}")
        return ()
    args = [_text(errs, f"command[{i}]", a, MAX_ARG_CHARS) for i, a in enumerate(value)]
    if any(a is None for a in args):
        return ()
    if not args[0].strip():
        errs.add("command[0]", "must name a program")
        return ()
    if sum(len(a) for a in args) > MAX_COMMAND_CHARS:
        errs.add("command", f"must total at most {MAX_COMMAND_CHARS} characters")
        return ()
    return tuple(args)


def _env(errs: _Errors, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        errs.add("env", f"must be a mapping of variable names to strings, got {type(value).__name__}")
        return ()
    if len(value) > MAX_ENV_VARS:
        errs.add("env", f"must have at most {MAX_ENV_VARS} variables, got {len(value)}")
        return ()
    out = []
    for name, raw in value.items():
        path = f"env.{name}"
        if not isinstance(name, str) or len(name) > MAX_ENV_NAME_CHARS or not ENV_NAME.match(name):
            errs.add("env", f"variable names match [A-Za-z_][A-Za-z0-9_]* (at most 128), got {name!r}")
            continue
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
            errs.add(path, "is set per rank by the node agent and cannot be overridden")
            continue
        why = denied_env(name)
        if why is not None:
            errs.add(path, why)
            continue
        if isinstance(raw, bool) or isinstance(raw, (int, float)):
            if isinstance(raw, float) and not math.isfinite(raw):
                errs.add(path, f"must be a string or a finite number, got {raw!r}")
                continue
            raw = str(raw).lower() if isinstance(raw, bool) else str(raw)
        text = _text(errs, path, raw, MAX_ENV_VALUE_CHARS)
        if text is not None:
            out.append((name, text))
    return tuple(sorted(out))


def _workdir(errs: _Errors, value: Any) -> str | None:
    text = _text(errs, "workdir", value, MAX_WORKDIR_CHARS)
    if text is None:
        return None
    if not text.startswith("/"):
        errs.add("workdir", f"must be an absolute path, got {text!r}")
        return None
    if ".." in text.split("/"):
        errs.add("workdir", f"must not contain '..', got {text!r}")
        return None
    return text


def load_launch(errs: _Errors, data: Mapping[str, Any]) -> LaunchSpec:
    """The launch fields of a parsed job spec (absent fields take their defaults); errors go to
    `errs` under the field's name."""
    command = _command(errs, data["command"]) if "command" in data else ()
    env = _env(errs, data["env"]) if "env" in data else ()
    workdir = _workdir(errs, data["workdir"]) if data.get("workdir") is not None else None
    requeue = data.get("requeue", False)
    if not isinstance(requeue, bool):
        errs.add("requeue", f"must be true or false, got {requeue!r}")
        requeue = False
    grace = data.get("stop_grace_s", DEFAULT_STOP_GRACE_S)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not math.isfinite(grace):
        errs.add("stop_grace_s", f"must be a number of seconds, got {grace!r}")
        grace = DEFAULT_STOP_GRACE_S
    elif not 0 <= grace <= MAX_STOP_GRACE_S:
        errs.add("stop_grace_s", f"must be between 0 and {MAX_STOP_GRACE_S:g} s, got {grace!r}")
        grace = DEFAULT_STOP_GRACE_S
    limit = _whole(errs, data, "time_limit_min", (1, MAX_TIME_LIMIT_MIN), "minutes")
    max_requeues = _whole(errs, data, "max_requeues", (0, MAX_REQUEUES), "requeues")
    pids_max = _whole(errs, data, "pids_max", PIDS_MAX_RANGE, "processes and threads per rank")
    memory_mb = _whole(errs, data, "memory_mb", MEMORY_MB_RANGE, "MiB per rank")
    return LaunchSpec(
        command,
        env,
        workdir,
        requeue,
        float(grace),
        limit,
        DEFAULT_MAX_REQUEUES if max_requeues is None else max_requeues,
        pids_max,
        memory_mb,
    )


def _whole(
    errs: _Errors, data: Mapping[str, Any], name: str, bounds: tuple[int, int], unit: str
) -> int | None:
    """The whole number `data[name]` within `bounds` (None when absent, null or refused)."""
    value = data.get(name)
    if value is None:
        return None
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(name, f"must be a whole number of {unit}, got {value!r}")
        return None
    if not low <= value <= high:
        errs.add(name, f"must be between {low} and {high} {unit}, got {value}")
        return None
    return value


def launch_to_spec(launch: LaunchSpec) -> dict[str, Any]:
    """The job spec v1 fields of a LaunchSpec (only those that differ from the defaults)."""
    out: dict[str, Any] = {}
    if launch.command:
        out["command"] = list(launch.command)
    if launch.env:
        out["env"] = dict(launch.env)
    if launch.workdir is not None:
        out["workdir"] = launch.workdir
    if launch.requeue:
        out["requeue"] = True
    if launch.stop_grace_s != DEFAULT_STOP_GRACE_S:
        out["stop_grace_s"] = launch.stop_grace_s
    if launch.time_limit_min is not None:
        out["time_limit_min"] = launch.time_limit_min
    if launch.max_requeues != DEFAULT_MAX_REQUEUES:
        out["max_requeues"] = launch.max_requeues
    for name in ("pids_max", "memory_mb"):
        if getattr(launch, name) is not None:
            out[name] = getattr(launch, name)
    return out
