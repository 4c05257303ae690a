"""The `dcgm` source: fetch every node's dcgm-exporter `/metrics` concurrently (httpx, asyncio,
a bounded number in flight), each with its own timeout and body size limit, and parse each body
with prometheus-client's parser. A failure is that node's error, never the whole pass's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from ..exposition import parse_scrape
from . import NodeResult, Target, short_error

MAX_BODY_BYTES = 8 * 1024 * 1024  # a dcgm-exporter page of 8 GPUs with MIG is ~100 kB
DEFAULT_CONCURRENCY = 128


class BodyTooLarge(Exception):
    """The exporter sent more than MAX_BODY_BYTES."""


class DcgmSource:
    """Scrapes dcgm-exporter endpoints; `timeout_s` per request, `concurrency` requests in flight."""

    def __init__(self, *, timeout_s: float = 5.0, concurrency: int = DEFAULT_CONCURRENCY):
        if not 0 < timeout_s <= 60:
            raise ValueError(f"timeout_s: must lie in (0, 60], got {timeout_s!r}")
        if not 1 <= concurrency <= 4096:
            raise ValueError(f"concurrency: must lie in 1..4096, got {concurrency!r}")
        self.timeout_s = timeout_s
        self.concurrency = concurrency

    def collect(self, targets: Sequence[Target]) -> list[NodeResult]:
        """One result per target, in the targets' order."""
        return asyncio.run(self._collect(targets))

    async def _collect(self, targets: Sequence[Target]) -> list[NodeResult]:
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        gate = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits, trust_env=False) as client:
            return list(await asyncio.gather(*(self._one(client, gate, t) for t in targets)))

    async def _one(self, client: httpx.AsyncClient, gate: asyncio.Semaphore, target: Target) -> NodeResult:
        result = NodeResult(target.node_id)
        if not target.url:
            result.error = "no dcgm_url for this node"
            return result
        start = time.perf_counter()
        async with gate:
            try:
                # The whole request (connect, headers, body) shares one deadline per node.
                text = await asyncio.wait_for(self._fetch(client, target.url), self.timeout_s)
            except (TimeoutError, httpx.TimeoutException):
                result.error = f"timeout after {self.timeout_s:g} s"
            except (httpx.HTTPError, BodyTooLarge, UnicodeDecodeError, ValueError) as exc:
                result.error = short_error(exc)
        result.fetch_ms = (time.perf_counter() - start) * 1e3
        if result.error:
            return result
        start = time.perf_counter()
        try:
            result.scrape = parse_scrape(text, n_gpus=target.n_gpus)
        except ValueError as exc:
            result.error = f"not exporter text: {short_error(exc)}"
        result.parse_ms = (time.perf_counter() - start) * 1e3
        return result

    @staticmethod
    async def _fetch(client: httpx.AsyncClient, url: str) -> str:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code} from {url}")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8")
