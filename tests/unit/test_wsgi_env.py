"""The server process's environment stays out of a request's environ (`topoweb.wsgi_env`), under
the real production server: granian starts every environ from `os.environ`, which would put
SECRET_KEY and DATABASE_URL's password in each request's META."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port
from topoweb.wsgi_env import WithoutProcessEnvironment

REPO = Path(__file__).resolve().parents[2]
APP = """\
import json, os
from topoweb.wsgi_env import WithoutProcessEnvironment

def echo(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(sorted(k for k in environ if not k.startswith("wsgi."))).encode()]

def application(environ, start_response):
    if environ["PATH_INFO"] == "/raw":
        return echo(environ, start_response)
    return wrapped(environ, start_response)

wrapped = WithoutProcessEnvironment(echo, os.environ)
"""


@pytest.fixture
def served(tmp_path):
    (tmp_path / "envapp.py").write_text(APP)
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "SECRET_KEY": "not-for-requests",
        "DATABASE_URL": "postgres://u:password@db/x",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port)]
        + ["--log-level", "warning", "envapp:application"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url, timeout=2)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("granian did not answer within 60 s")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def test_a_request_sees_its_headers_and_cgi_names_but_not_the_servers_environment(served):
    raw = httpx.get(f"{served}/raw").json()
    # Without the wrapper the server's variables are there (else the wrapper has nothing to do).
    assert {"SECRET_KEY", "DATABASE_URL"} <= set(raw)
    seen = set(httpx.post(f"{served}/x?q=1", content=b"{}", headers={"X-Test": "1"}).json())
    assert not seen & {"SECRET_KEY", "DATABASE_URL", "PATH", "HOME", "PYTHONPATH"}
    assert {
        "REQUEST_METHOD",
        "PATH_INFO",
        "QUERY_STRING",
        "REMOTE_ADDR",
        "HTTP_X_TEST",
        "CONTENT_LENGTH",
    } <= seen


def test_names_a_server_sets_are_kept_whatever_the_environment_holds():
    app = WithoutProcessEnvironment(
        lambda environ, start: sorted(environ), ["SERVER_NAME", "HTTP_X", "TOKEN"]
    )
    environ = {"SERVER_NAME": "web", "HTTP_X": "1", "TOKEN": "secret", "wsgi.input": None}
    assert app(environ, None) == ["HTTP_X", "SERVER_NAME", "wsgi.input"]
