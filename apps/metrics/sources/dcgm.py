"""The `dcgm` source: fetch every node's dcgm-exporter `/metrics` concurrently (asyncio, a bounded
number in flight; plain HTTP through a small HTTP/1.1 client of asyncio streams, a connection per
node as each exporter is another host asked once a pass; https through httpx), each with its own
timeout and body size limit, and parse each body
(`parse_scrape`, reading only the kept fields; `parser="reference"` reads every sample with
prometheus-client's parser, for comparison). A failure is that node's error, never the whole
pass's."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from urllib.parse import urlsplit

import httpx

from ..exposition import Scrape, parse_scrape, parse_scrape_reference
from . import NodeResult, Target, short_error

MAX_BODY_BYTES = 8 * 1024 * 1024  # a dcgm-exporter page of 8 GPUs with MIG is ~100 kB
MAX_HEAD_BYTES = 64 * 1024  # the status line and headers of an answer
DEFAULT_CONCURRENCY = 128
# Parsing is pure Python and CPU-bound: past this many nodes it runs in a pool of processes (one
# per core) while the event loop keeps fetching. Celery's prefork children are daemonic and may
# not start processes: there it runs inline.
POOL_ABOVE_TARGETS = 64

PARSERS = {"fast": parse_scrape, "reference": parse_scrape_reference}

# httpcore imports sniffio six times per request; where sniffio is not installed each of those
# searches the whole import path again (stat calls: a third of the fetch's CPU time). Its absence
# is remembered once: the import still fails, at once.
try:
    import sniffio  # noqa: F401
except ImportError:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

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


def timed_parse(text: str, n_gpus: int, parser: str = "fast") -> tuple[Scrape | None, str, float]:
    """(scrape, error, CPU milliseconds) of parsing one page with PARSERS[parser]; runs in the
    pool or inline. CPU time, not wall time: on a busy machine the wall time also counts waiting
    for a core."""
    start = time.process_time()
    try:
        scrape, error = PARSERS[parser](text, n_gpus=n_gpus), ""
    except ValueError as exc:
        scrape, error = None, f"not exporter text: {short_error(exc)}"
    return scrape, error, (time.process_time() - start) * 1e3


class BodyTooLarge(Exception):
    """The exporter sent more than MAX_BODY_BYTES."""


class ProtocolError(Exception):
    """The answer is not the HTTP/1.1 this client reads."""


FETCH_ERRORS = (
    httpx.HTTPError,
    BodyTooLarge,
    ProtocolError,
    OSError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    UnicodeDecodeError,
    ValueError,
)


async def fetch_plain(url: str) -> str:
    """GET `url` (http://) over a connection of its own: the body of a 200 answer, as text.
    Raises ValueError (another status), BodyTooLarge, ProtocolError, OSError or
    asyncio.IncompleteReadError (a body cut short); the caller bounds the time."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 80
    if not host:
        raise ValueError(f"no host in {url}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = f"[{host}]" if ":" in host else host
    if parts.port:
        authority += f":{parts.port}"
    reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
    try:
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/plain\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\n\r\n".encode("ascii")
        )
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = head[0].split(" ", 2)
        if len(status) < 2 or not status[0].startswith("HTTP/1.") or not status[1].isdigit():
            raise ProtocolError(f"not an HTTP/1 answer: {head[0][:80]!r}")
        if status[1] != "200":
            raise ValueError(f"HTTP {status[1]} from {url}")
        headers = {}
        for line in head[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip().lower()
        if headers.get("content-encoding", "identity") != "identity":
            raise ProtocolError(f"content-encoding {headers['content-encoding']!r} (asked for identity)")
        if "chunked" in headers.get("transfer-encoding", ""):
            body = await _read_chunked(reader)
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ProtocolError(f"content-length {length[:40]!r}")
            if int(length) > MAX_BODY_BYTES:
                raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes")
            body = await reader.readexactly(int(length))
        else:  # the body ends with the connection
            body = await reader.read(MAX_BODY_BYTES + 1)
            while (
                body
                and len(body) <= MAX_BODY_BYTES
                and (more := await reader.read(MAX_BODY_BYTES + 1 - len(body)))
            ):
                body += more
            if len(body) > MAX_BODY_BYTES:
                raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes")
    finally:
        writer.close()
    return body.decode("utf-8")


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks, size = [], 0
    while True:
        line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            n = int(line, 16)
        except ValueError:
            raise ProtocolError(f"chunk size {line[:20]!r}") from None
        if n == 0:
            return b"".join(chunks)
        size += n
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes")
        chunk = await reader.readexactly(n + 2)
        if chunk[-2:] != b"\r\n":
            raise ProtocolError("a chunk does not end with CRLF")
        chunks.append(chunk[:-2])


# "asyncio": plain http:// through fetch_plain, https through httpx; "httpx": every URL through
# httpx (the client before fetch_plain, kept for comparison).
CLIENTS = ("asyncio", "httpx")


class DcgmSource:
    """Scrapes dcgm-exporter endpoints; `timeout_s` per request, `concurrency` requests in flight;
    `parser` and `client` pick the paths (the defaults are the fast ones)."""

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        concurrency: int = DEFAULT_CONCURRENCY,
        parser: str = "fast",
        client: str = "asyncio",
    ):
        if not 0 < timeout_s <= 60:
            raise ValueError(f"timeout_s: must lie in (0, 60], got {timeout_s!r}")
        if not 1 <= concurrency <= 4096:
            raise ValueError(f"concurrency: must lie in 1..4096, got {concurrency!r}")
        if parser not in PARSERS:
            raise ValueError(f"parser: must be one of {', '.join(PARSERS)}, got {parser!r}")
        if client not in CLIENTS:
            raise ValueError(f"client: must be one of {', '.join(CLIENTS)}, got {client!r}")
        self.timeout_s = timeout_s
        self.client = client
        self.concurrency = concurrency
        self.parser = parser

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
                fetch = (
                    fetch_plain(target.url)
                    if self.client == "asyncio" and target.url.startswith("http://")
                    else self._fetch(client, target.url)
                )
                text = await asyncio.wait_for(fetch, self.timeout_s)
            except (TimeoutError, httpx.TimeoutException):
                result.error = f"timeout after {self.timeout_s:g} s"
            except FETCH_ERRORS as exc:
                result.error = short_error(exc)
        result.fetch_ms = (time.perf_counter() - start) * 1e3
        if result.error:
            return result
        if pool is None:
            result.scrape, result.error, result.parse_ms = timed_parse(text, target.n_gpus, self.parser)
        else:
            loop = asyncio.get_running_loop()
            result.scrape, result.error, result.parse_ms = await loop.run_in_executor(
                pool, timed_parse, text, target.n_gpus, self.parser
            )
        return result

    @staticmethod
    async def _fetch(client: httpx.AsyncClient, url: str) -> str:
        """GET an https URL through httpx."""
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
