"""The dcgm source's own HTTP/1.1 client (fetch_plain) against raw answers on a real socket:
Content-Length, chunked and until-close bodies read alike and as httpx reads them; a cut body, a
too large one, another status or something that is not HTTP is that node's error."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from apps.metrics.sources import Target
from apps.metrics.sources.dcgm import MAX_BODY_BYTES, DcgmSource

PAGE = 'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1"} 0.25\n'


def answer(body: bytes, *, head: str = "HTTP/1.1 200 OK", headers: str | None = None) -> bytes:
    headers = f"Content-Length: {len(body)}\r\n" if headers is None else headers
    return f"{head}\r\nContent-Type: text/plain\r\n{headers}\r\n".encode() + body


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [
        f"{len(body[i : i + size]):x};ext=1\r\n".encode() + body[i : i + size] + b"\r\n"
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


@pytest.fixture
def raw_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A loopback server answering each path with the raw bytes set for it, then closing."""
    answers: dict[str, bytes] = {}
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # accept() wakes to see `stop`
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                path = request.split(b" ", 2)[1].decode() if request.count(b" ") >= 2 else "/"
                conn.sendall(answers.get(path, answer(b"", head="HTTP/1.1 404 Not Found")))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", answers
    stop.set()
    thread.join(timeout=5)
    listener.close()


def collect(base: str, paths: list[str], client: str = "asyncio"):
    source = DcgmSource(timeout_s=5.0, client=client)
    return source.collect([Target(i, f"n{i}", f"{base}{p}", 8) for i, p in enumerate(paths)])


def test_every_body_framing_reads_alike_and_as_httpx_reads_it(raw_server):
    base, answers = raw_server
    body = PAGE.encode()
    answers["/length"] = answer(body)
    answers["/chunked"] = answer(chunked(body), headers="Transfer-Encoding: chunked\r\n")
    answers["/close"] = answer(body, head="HTTP/1.0 200 OK", headers="")
    paths = ["/length", "/chunked", "/close"]
    ours, theirs = collect(base, paths), collect(base, paths, client="httpx")
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.error == "" and reference.error == ""
        assert mine.scrape == reference.scrape
        assert mine.scrape.gpus[(1, "")].values == {"tensor_active": 0.25}


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (answer(PAGE.encode())[:-10], "IncompleteReadError"),
        (answer(b"", head="HTTP/1.1 503 Service Unavailable"), "HTTP 503"),
        (answer(b"", headers=f"Content-Length: {MAX_BODY_BYTES + 1}\r\n"), "body larger than"),
        (answer(b"zz\r\nabc\r\n0\r\n\r\n", headers="Transfer-Encoding: chunked\r\n"), "chunk size"),
        (answer(b"", headers="Content-Encoding: gzip\r\nContent-Length: 0\r\n"), "content-encoding"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1 answer"),
        (answer(b"\xff\xfe", headers="Content-Length: 2\r\n"), "UnicodeDecodeError"),
    ],
    ids=["cut-short", "status", "too-large", "bad-chunk", "gzip", "not-http", "not-utf8"],
)
def test_a_bad_answer_is_that_nodes_error(raw_server, raw, error):
    base, answers = raw_server
    answers["/bad"] = raw
    answers["/good"] = answer(PAGE.encode())
    bad, good = collect(base, ["/bad", "/good"])
    assert error in bad.error and bad.scrape is None
    assert good.error == "" and good.scrape.gpus


def test_a_refused_connection_is_that_nodes_error():
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    (result,) = collect(f"http://127.0.0.1:{port}", ["/metrics"])
    assert "ConnectionRefusedError" in result.error
