"""The `dcgm` source: fetch every node's dcgm-exporter `/metrics` concurrently (httpx, asyncio,
a bounded number in flight), each with its own timeout and body size limit, and parse each body
with prometheus-client's parser. A failure is that node's error, never the whole pass's."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import httpx

from ..exposition import Scrape, parse_scrape
from . import NodeResult, Target, short_error

MAX_BODY_BYTES = 8 * 1024 * 1024  # a dcgm-exporter page of 8 GPUs with MIG is ~100 kB
DEFAULT_CONCURRENCY = 128
# Parsing is pure Python and CPU-bound: past this many nodes it runs in a pool of processes (one
# per core) while the event loop keeps fetching. Celery's prefork children are daemonic and may
# not start processes: there it runs inline.
POOL_ABOVE_TARGETS = 64

_POOL: ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def parse_pool() -> ProcessPoolExecutor | None:
    """The process pool for parsing (created once per process), or None where it cannot run."""
    global _POOL
    if multiprocessing.current_process().daemon or (os.cpu_count() or 1) < 2:
        return None
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ProcessPoolExecutor(
                max_workers=os.cpu_count(), mp_context=multiprocessing.get_context("fork")
            )
        return _POOL


def timed_parse(text: str, n_gpus: int) -> tuple[Scrape | None, str, float]:
    """(scrape, error, CPU milliseconds) of parsing one page; runs in the pool or inline. CPU
    time, not wall time: on a busy machine the wall time also counts waiting for a core."""
    start = time.process_time()
    try:
        scrape, error = parse_scrape(text, n_gpus=n_gpus), ""
    except ValueError as exc:
        scrape, error = None, f"not exporter text: {short_error(exc)}"
    return scrape, error, (time.process_time() - start) * 1e3


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
        pool = parse_pool() if len(targets) > POOL_ABOVE_TARGETS else None
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits, trust_env=False) as client:
            return list(await asyncio.gather(*(self._one(client, gate, t, pool) for t in targets)))

    async def _one(
        self,
        client: httpx.AsyncClient,
        gate: asyncio.Semaphore,
        target: Target,
        pool: ProcessPoolExecutor | None,
    ) -> NodeResult:
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
        if pool is None:
            result.scrape, result.error, result.parse_ms = timed_parse(text, target.n_gpus)
        else:
            loop = asyncio.get_running_loop()
            result.scrape, result.error, result.parse_ms = await loop.run_in_executor(
                pool, timed_parse, text, target.n_gpus
            )
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
