"""CPU time of processes from /proc, for benchmarks that account for where a figure's CPU went."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def cpu_s(pid: int) -> float:
    """utime + stime of a process and its threads, seconds; 0 for a process that has ended."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name) of every process now."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        head, tail = text.rsplit(")", 1)
        out[int(entry.name)] = (int(tail.split()[1]), head.split("(", 1)[1])
    return out


def tree(pids: Iterable[int]) -> set[int]:
    """`pids` and every process descended from them, now."""
    table = _parents()
    found = set(pids)
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def named(command: str) -> set[int]:
    """Every process whose command name is `command` (such as "postgres"), now."""
    return {pid for pid, (_, name) in _parents().items() if name == command}


def total_s(pids: Iterable[int]) -> float:
    """The CPU seconds of `pids` together."""
    return sum(cpu_s(pid) for pid in pids)


def snapshot(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds of each of `pids` now, for `spent_s` later."""
    return {pid: cpu_s(pid) for pid in pids}


def spent_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes of `after` spent since `before` (a process absent from `before`
    started meanwhile: all of its time counts)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())
