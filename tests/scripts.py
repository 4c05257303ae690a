"""Running the project's scripts and benchmarks from tests, budgeted by CPU time rather than wall
time: a busy machine slows a run down but does not fail it, and a runaway run still ends."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The wall-clock limit, a backstop for a hung run only: this many times the CPU budget (a run
# gets about 2 / load of a core on a 2-core machine; at load 15, under a seventh).
WALL_PER_CPU = 10


def run_script(argv: list[str], *, cpu_s: float, **kwargs) -> subprocess.CompletedProcess:
    """`argv` run in the repository with its output captured as text; the process is stopped
    (SIGXCPU, then SIGKILL) past `cpu_s` seconds of CPU time."""

    def limit() -> None:
        soft = int(cpu_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))

    kwargs.setdefault("cwd", ROOT)
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=max(300.0, WALL_PER_CPU * cpu_s),
        **kwargs,
    )
