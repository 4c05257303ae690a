"""A real Prometheus (Debian's `prometheus`, on loopback) scrapes a running TopoWeb's `/metrics`
with the bearer token, evaluates the shipped TopoWebNodeDown rule (its expression as shipped, its
`for` shortened to this test's time) and fires it once a node is taken down."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from apps.placement.topology import read_spec_file
from apps.scheduling.nodes import node_down
from apps.topology import services as topology_services
from apps.topology.models import Node
from tests.conftest import service_missing

from .test_metrics_prometheus import run_prometheus, wait_for

REPO = Path(__file__).resolve().parents[2]
TOKEN = "integration-metrics-token-0123456789"


def _alerts(url: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]


@pytest.fixture
def prometheus(live_server, settings, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        service_missing("needs Debian's prometheus package (apt-get install prometheus)")
    settings.TOPOWEB_METRICS_TOKEN = TOKEN
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "topoweb-rules.yml").read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == "TopoWebNodeDown"]
    rule["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "topoweb", "rules": [rule]}]}))
    target = urlsplit(live_server.url)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": "topoweb",
                "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials": TOKEN},
                "static_configs": [{"targets": [f"127.0.0.1:{target.port}"]}],
            }
        ],
    }
    with run_prometheus(binary, tmp_path, config, ready_s=60, stop_s=20) as url:
        yield url


@pytest.mark.integration
def test_prometheus_scrapes_topoweb_and_fires_node_down(transactional_db, prometheus):
    cluster = topology_services.cluster_import(data=read_spec_file(REPO / "examples" / "case-4-4.yaml"))

    def scraped_up():
        targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return targets and all(t["health"] == "up" for t in targets)

    wait_for(scraped_up, 60, "Prometheus to scrape /metrics with the token")
    query = {"query": 'topoweb_gpus{cluster="case-4-4"}'}
    wait_for(
        lambda: sum(
            float(r["value"][1])
            for r in httpx.get(f"{prometheus}/api/v1/query", params=query).json()["data"]["result"]
        )
        == 16,
        60,
        "16 GPUs of case-4-4 in Prometheus",
    )
    assert not [a for a in _alerts(prometheus) if a["labels"]["alertname"] == "TopoWebNodeDown"]
    node = Node.objects.filter(cluster=cluster).order_by("name").first()
    node_down(node=node, reason="taken down by the test")
    firing = wait_for(
        lambda: [
            a
            for a in _alerts(prometheus)
            if a["labels"]["alertname"] == "TopoWebNodeDown" and a["state"] == "firing"
        ],
        90,
        "TopoWebNodeDown to fire",
    )
    assert firing[0]["labels"]["cluster"] == "case-4-4"
    assert firing[0]["annotations"]["summary"] == "1 node(s) down on case-4-4"
