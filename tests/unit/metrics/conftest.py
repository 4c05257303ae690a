"""Fixtures of the metrics tests: the case 4.4 cluster, a real local HTTP server whose answer per
path the test chooses, and the copied dcgm-exporter scrapes."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from apps.placement.topology import read_spec_file
from apps.topology import services as topology_services

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "dcgm"
A100_MIG = FIXTURES / "dcgm-exporter_metrics_A100_MIG-node_under-load_nvidia-cloud-native-docs.prom"
H100_EKS = FIXTURES / "dcgm-exporter_metrics_8xH100-80GB-HBM3_EKS_nvidia-aicr.prom"


class Behaviours:
    """Path -> how to answer: ("text", body), ("status", code), ("sleep", seconds),
    ("truncated", body) (announces a longer body, then closes)."""

    def __init__(self):
        self.by_path: dict[str, tuple[str, object]] = {}
        self.hits: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()


def _handler(behaviours: Behaviours):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output clean
            pass

        def do_GET(self):
            behaviours.hits[self.path] = behaviours.hits.get(self.path, 0) + 1
            kind, arg = behaviours.by_path.get(self.path, ("status", 404))
            if kind == "sleep":
                with behaviours.lock:
                    behaviours.in_flight += 1
                    behaviours.max_in_flight = max(behaviours.max_in_flight, behaviours.in_flight)
                time.sleep(arg)
                with behaviours.lock:
                    behaviours.in_flight -= 1
                kind, arg = "text", 'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50\n'
            if kind == "status":
                self.send_response(arg)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = arg.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            length = len(body) * 2 if kind == "truncated" else len(body)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            if kind == "truncated":
                self.close_connection = True

    return Handler


@pytest.fixture
def exporter():
    """A real HTTP server on loopback; yields (base URL, Behaviours)."""
    behaviours = Behaviours()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(behaviours))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", behaviours
    server.shutdown()
    server.server_close()


@pytest.fixture
def case44(db):
    return topology_services.cluster_import(data=read_spec_file(REPO / "examples" / "case-4-4.yaml"))


@pytest.fixture
def pod256(db):
    return topology_services.cluster_import(data=read_spec_file(REPO / "examples" / "pod-256.yaml"))
