"""bench/proc_cpu.py: CPU time of processes from /proc, and bench/api_throughput.py's share of it
per job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import api_throughput  # noqa: E402
import proc_cpu  # noqa: E402


def test_a_busy_child_is_in_its_parents_tree_and_its_cpu_counts():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while proc_cpu.cpu_s(child.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in proc_cpu.tree([os.getpid()])
        assert os.getpid() not in proc_cpu.tree([child.pid])
        assert proc_cpu.cpu_s(child.pid) >= 0.3
        assert proc_cpu.total_s([child.pid, child.pid]) == 2 * proc_cpu.cpu_s(child.pid)
    finally:
        child.communicate(b"\n", timeout=30)
    assert proc_cpu.cpu_s(child.pid) == 0.0  # ended: nothing to read


def test_named_finds_this_python_by_its_command_name():
    comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert os.getpid() in proc_cpu.named(comm)
    assert not proc_cpu.named("no-such-command-here")


def test_cpu_per_job_counts_processes_that_started_between_and_sums_the_parts():
    before = {"web": {10: 1.0, 11: 2.0}, "postgres": {20: 5.0}}
    after = {"web": {10: 1.5, 11: 2.5, 12: 0.25}, "postgres": {20: 5.5}}
    assert api_throughput.cpu_ms_per(before, after, 500) == {"web": 2.5, "postgres": 1.0, "total": 3.5}
    assert api_throughput.cpu_ms_per(before, after, 0)["total"] == 1750.0  # no jobs: per one
