"""`serve_embedded`: the embedded default's web server (the dashboard's command, the top app: it
starts scheduling's, metrics' and the executors' in-process background work)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[3]


def get(url: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """GET url, retrying until the server answers or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_serve_embedded_serves_health_and_static_files_with_debug_off(tmp_path):
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONUNBUFFERED": "1",
        "TOPOWEB_TESTING": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
    }
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve_embedded", "--addr", f"127.0.0.1:{port}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok", "database": "sqlite"})
        status, body = get(f"http://127.0.0.1:{port}/static/admin/css/base.css")
        assert status == 200 and b"{" in body
    finally:
        server.terminate()
        output = server.communicate(timeout=10)[0].decode()
    assert "TopoWeb on http://127.0.0.1:" in output
    assert "Watching for file changes" not in output
    assert "No directory at" not in output


def _count(db, sql: str) -> int:
    with sqlite3.connect(f"file:{db}/db.sqlite3?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute(sql).fetchone()[0]


def synced(db) -> int:
    return _count(db, "SELECT COUNT(*) FROM scheduling_nodeagent WHERE last_seen IS NOT NULL")


def nodes(db) -> int:
    return _count(db, "SELECT COUNT(*) FROM topology_node")


def test_make_run_logs_no_warning_at_start(tmp_path):
    """The demo as `make run` starts it (migrate, load_demo, serve_embedded): its agents start once
    the server listens, so none of their first polls fails, and nothing else warns."""
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONUNBUFFERED": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),  # the demo agents' rank output, so their ranks can be found below
    }
    for command in (["migrate", "--noinput"], ["load_demo"]):
        subprocess.run(
            [sys.executable, "manage.py", *command], cwd=REPO, env=env, check=True, capture_output=True
        )
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve_embedded", "--addr", f"127.0.0.1:{port}", "--dcgm-port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True)
    reader.start()
    try:
        get(f"http://127.0.0.1:{port}/healthz", timeout_s=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and synced(tmp_path) < nodes(tmp_path):
            time.sleep(0.5)
        assert synced(tmp_path) == nodes(tmp_path) > 0, "".join(
            lines[-20:]
        )  # every agent's first poll answered
    finally:
        # What the server logged while it started and ran; its stop is not what this test is about.
        logged = len(lines)
        server.terminate()
        server.wait(timeout=30)
        reader.join(timeout=10)
        # No rank outlives the server, not even one whose start was under way when it stopped
        # (asserted below; killed here whatever failed, so that no demo rank outlives the test).
        deadline = time.monotonic() + 30
        while (left := processes_naming(str(tmp_path))) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    problems = [
        i
        for i, line in enumerate(lines[:logged])
        if " WARNING " in line or " ERROR " in line or "Traceback" in line
    ]
    # Each with what follows it (a traceback's frames and its exception).
    assert problems == [], "".join(line for i in problems[:5] for line in lines[i : i + 25])
    assert left == [], "ranks left running after the server stopped"


def processes_naming(text: str) -> list[int]:
    """Pids of this machine's processes whose command line contains `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_demo_agents_added_after_the_server_stopped_are_stopped_before_they_run():
    """The server may stop while its agents are still being started (68 of them): those started
    before have their ranks stopped, and one handed over after that is stopped at once."""
    from apps.dashboard.management.commands.serve_embedded import _DemoAgents

    class Agent:
        def __init__(self):
            self.terminated = 0
            self.thread = None  # as an agent has before its thread starts

        def terminate_ranks(self):
            self.terminated += 1

    agents = _DemoAgents()
    early, late = Agent(), Agent()
    agents.add(early)
    assert early.terminated == 0
    agents.close()
    agents.add(late)
    assert (early.terminated, late.terminated) == (1, 1)
