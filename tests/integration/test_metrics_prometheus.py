"""The `prometheus` source against a real Prometheus server (Debian's `prometheus`, started here on
loopback) that scrapes the simulated exporter: same latest values, NIC counters and job measures
as scraping the exporter directly."""

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from apps.metrics.choices import ScrapeState, SourceKind
from apps.metrics.fake import SimulatedExporter
from apps.metrics.models import GpuLatest, JobSample, MetricsSource, NicLatest, NodeScrape
from apps.metrics.services import metrics_collect
from apps.placement.topology import read_spec_file
from apps.scheduling.demo import load_demo_jobs
from apps.topology import services as topology_services
from tests.conftest import service_missing
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
NODES = ("node-a", "node-b")


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def exporter(db):
    cluster = topology_services.cluster_import(data=read_spec_file(REPO / "examples" / "case-4-4.yaml"))
    load_demo_jobs(start_all=True)
    sim = SimulatedExporter(["case-4-4"])
    server = sim.serve("127.0.0.1", 0, refresh_s=3600)
    yield cluster, sim, server.server_address[1]
    sim.stop()


@pytest.fixture
def prometheus(exporter, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        service_missing("needs Debian's prometheus package (apt-get install prometheus)")
    _, _, exporter_port = exporter
    targets = [
        {
            "targets": [f"127.0.0.1:{exporter_port}"],
            "labels": {"__metrics_path__": f"/clusters/case-4-4/nodes/{node}/metrics", "node": node},
        }
        for node in NODES
    ]
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "dcgm", "static_configs": targets}],
    }
    with run_prometheus(binary, tmp_path, config, ready_s=30, stop_s=10) as url:
        yield url


@contextlib.contextmanager
def run_prometheus(binary: str, tmp_path: Path, config: dict, *, ready_s: float, stop_s: float):
    """A Prometheus server on a free loopback port with `config` (its data under `tmp_path`),
    yielding its URL once ready; terminated on the way out."""
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{url}/-/ready").status_code == 200, ready_s, "Prometheus to start")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=stop_s)


def _series_count(url: str, expr: str) -> int:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}).json()
    return len(body["data"]["result"])


def test_prometheus_source_maps_labels_to_nodes_and_gpus(exporter, prometheus):
    cluster, _, _ = exporter
    wait_for(lambda: _series_count(prometheus, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == 16, 30, "16 GPU series")
    # Counters need two scrapes of the exporter before NIC rates exist; the source reads counters.
    MetricsSource.objects.create(
        cluster=cluster,
        kind=SourceKind.PROMETHEUS,
        prometheus_url=prometheus,
        node_label="node",
        interval_s=15,
    )
    result = metrics_collect(cluster=cluster)
    assert (result.nodes_ok, result.nodes_failed) == (2, 0)
    assert GpuLatest.objects.filter(gpu__node__cluster=cluster, instance="").count() == 16
    row = GpuLatest.objects.get(gpu__node__name="node-b", gpu__index=7)
    assert row.gpu_util > 0.9 and 0 < row.tensor_active < 0.5
    assert NicLatest.objects.filter(node__cluster=cluster, tx_bytes_total__isnull=False).count() == 2
    sample = JobSample.objects.get(job__cluster=cluster)
    assert sample.gpus_measured == 16 and sample.gpu_util > 0.9


def test_a_prometheus_that_is_down_is_every_nodes_error_not_a_crash(exporter):
    cluster, _, _ = exporter
    MetricsSource.objects.create(
        cluster=cluster,
        kind=SourceKind.PROMETHEUS,
        prometheus_url=f"http://127.0.0.1:{free_port()}",
        timeout_s=1,
    )
    result = metrics_collect(cluster=cluster)
    assert (result.nodes_ok, result.nodes_failed) == (0, 2)
    states = NodeScrape.objects.filter(node__cluster=cluster)
    assert {s.state for s in states} == {ScrapeState.ERROR}
    assert all("Prometheus at" in s.last_error for s in states)
