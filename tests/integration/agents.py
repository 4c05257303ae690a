"""Helpers of the agent tests: agent processes on loopback, waits, a program that records its
environment, and cleanup of every process started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_IB_HCA",
    "TOPOWEB_JOB_ID",
    "TOPOWEB_GENERATION",
)
# Writes its environment to $OUT_DIR/<generation>-<rank>.json, then does what $BEHAVIOUR says.
RECORD = f"""
import json, os, signal, sys, time
keys = {ENV_KEYS!r}
env = {{k: os.environ.get(k) for k in keys}}
path = os.path.join(os.environ["OUT_DIR"], f"{{env['TOPOWEB_GENERATION']}}-{{env['RANK']}}.json")
with open(path, "w") as fh:
    json.dump(env, fh)
mode = os.environ.get("BEHAVIOUR", "exit")
rank = int(env["RANK"])
if mode == "fail" and rank == int(os.environ["FAIL_RANK"]):
    print("boom: rank", rank, "gives up", flush=True)
    sys.exit(3)
if mode == "stubborn":
    # Ignores SIGTERM for a while (a checkpoint that takes time), then exits.
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(float(os.environ["STUBBORN_S"])), sys.exit(0)))
if mode in ("sleep", "fail", "stubborn"):
    time.sleep(float(os.environ.get("SLEEP_S", "60")))
print("rank", rank, "done", flush=True)
"""


def record_command() -> list[str]:
    """The argv of the recording program."""
    return [sys.executable, "-c", RECORD]


class Agents:
    """Agent processes (python -m apps.agent) for nodes of one cluster, all killed at close.
    `token_for(node)` gives a node's agent token (written to a 0600 file per node)."""

    def __init__(self, server: str, token_for: Callable[[str], str], tmp: Path):
        self.server = server
        self.tmp = tmp
        self.token_for = token_for
        self.procs: dict[str, subprocess.Popen] = {}

    def token_file(self, node: str) -> Path:
        """The node's token file (created with a new token on first use)."""
        path = self.tmp / f"token-{node}"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.token_for(node))
        return path

    def start(self, node: str, poll_s: float = 1.0) -> subprocess.Popen:
        """Start the agent of `node`."""
        token_file = self.token_file(node)
        log = (self.tmp / f"agent-{node}.out").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apps.agent",
                "--server",
                self.server,
                "--node",
                node,
                "--token-file",
                str(token_file),
                "--log-dir",
                str(self.tmp / f"logs-{node}"),
                "--poll-s",
                str(poll_s),
                "--addr",
                "127.0.0.1",
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[node] = proc
        return proc

    def kill(self, node: str) -> None:
        """SIGKILL the agent of `node` (its rank processes live on, as on a real crash)."""
        self.procs[node].kill()
        self.procs[node].wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def kill_groups(pids) -> None:
    """SIGKILL the process groups of rank processes left behind (ranks of a killed agent)."""
    for pid in pids:
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def wait_for(check: Callable[[], object], timeout_s: float = 30.0, what: str = "condition"):
    """Poll `check` every 50 ms until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def recorded(out_dir: Path, generation: int) -> dict[int, dict]:
    """Rank -> recorded environment of one generation."""
    found = {}
    for path in out_dir.glob(f"{generation}-*.json"):
        env = json.loads(path.read_text())
        found[int(env["RANK"])] = env
    return found
