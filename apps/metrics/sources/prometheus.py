"""The `prometheus` source: ask a Prometheus server that already scrapes dcgm-exporter and
node-exporter for the latest value of every kept field (`/api/v1/query`, one query for the DCGM
fields and one for the InfiniBand counters), then map its labels to nodes and GPUs.

The node is the value of `node_label` (dcgm-exporter's `Hostname`, or a label the operator's
relabelling adds), else `instance`; `node_suffix` (e.g. `:9400`) is stripped. The GPU index is
`gpu_label`. Series of nodes the cluster does not have are ignored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import httpx

from ..exposition import GPU_FIELDS, IB_FIELDS, Scrape, add_gpu_sample, add_nic_sample, gpu_label
from . import NodeResult, Target, short_error

MAX_RESPONSE_BYTES = 256 * 1024 * 1024
DCGM_QUERY = '{__name__=~"' + "|".join(GPU_FIELDS) + '"}'
IB_QUERY = '{__name__=~"' + "|".join(IB_FIELDS) + '"}'


class PrometheusError(Exception):
    """Prometheus answered with an error or something that is not a query result."""


class PrometheusSource:
    """Reads the latest values from Prometheus' HTTP API at `url` (e.g. http://prom:9090)."""

    def __init__(
        self,
        *,
        url: str,
        node_label: str = "Hostname",
        gpu_label: str = "gpu",
        node_suffix: str = "",
        timeout_s: float = 5.0,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url: must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.node_label = node_label
        self.gpu_label = gpu_label
        self.node_suffix = node_suffix
        self.timeout_s = timeout_s

    def query(self, client: httpx.Client, expr: str) -> list[dict]:
        """The vector result of an instant query."""
        response = client.get(f"{self.url}/api/v1/query", params={"query": expr})
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise PrometheusError(f"response larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            body = response.json()
        except ValueError as exc:
            raise PrometheusError(f"HTTP {response.status_code}: not JSON") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            raise PrometheusError(f"HTTP {response.status_code}: {error or 'not a query result'}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            raise PrometheusError("the query did not return an instant vector")
        return data["result"]

    def node_name(self, labels: Mapping[str, str]) -> str:
        """The node a series belongs to, by the configured label mapping."""
        name = labels.get(self.node_label) or labels.get("instance", "")
        if self.node_suffix and name.endswith(self.node_suffix):
            name = name[: -len(self.node_suffix)]
        return name

    def collect(self, targets: Sequence[Target]) -> list[NodeResult]:
        """One result per target; a node without series in Prometheus is an error for that node."""
        start = time.perf_counter()
        try:
            with httpx.Client(timeout=self.timeout_s, trust_env=False) as client:
                series = self.query(client, DCGM_QUERY) + self.query(client, IB_QUERY)
        except (httpx.HTTPError, PrometheusError) as exc:
            error = f"Prometheus at {self.url}: {short_error(exc)}"
            return [NodeResult(t.node_id, error=error) for t in targets]
        fetch_ms = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        by_name = {t.name: t for t in targets}
        scrapes: dict[str, Scrape] = {}
        for entry in series:
            labels = entry.get("metric") if isinstance(entry, dict) else None
            value = entry.get("value") if isinstance(entry, dict) else None
            if not isinstance(labels, dict) or not isinstance(value, list) or len(value) != 2:
                continue
            target = by_name.get(self.node_name(labels))
            if target is None:
                continue
            try:
                number = float(value[1])
            except (TypeError, ValueError):
                number = math.nan
            scrape = scrapes.setdefault(target.name, Scrape())
            metric = labels.get("__name__", "")
            if metric in IB_FIELDS:
                add_nic_sample(scrape, metric, labels, number)
            else:
                gpu = gpu_label(labels, target.n_gpus, self.gpu_label)
                add_gpu_sample(scrape, metric, labels, number, gpu)
        parse_ms = (time.perf_counter() - start) * 1e3
        share = len(targets) or 1
        results = []
        for t in targets:
            scrape = scrapes.get(t.name)
            result = NodeResult(
                t.node_id, scrape=scrape, fetch_ms=fetch_ms / share, parse_ms=parse_ms / share
            )
            if scrape is None:
                result.error = f"no series for node {t.name!r} in Prometheus (label {self.node_label!r})"
            results.append(result)
        return results
