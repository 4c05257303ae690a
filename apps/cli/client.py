"""The CLI's HTTP client: server and token from the environment or a config file."""

from __future__ import annotations

import configparser
import os
import time
from pathlib import Path
from typing import Any

import httpx

CONFIG_PATH = Path("~/.config/topoweb/config").expanduser()
ENV_SERVER = "TOPOWEB_SERVER"
ENV_TOKEN = "TOPOWEB_TOKEN"
DEFAULT_SERVER = "http://127.0.0.1:8000"
# A busy server (429, or 503: the database briefly away, no API write slot free) says when to ask
# again in Retry-After. The CLI waits that long, at most RETRY_AFTER_MAX_S a time and
# RETRY_WAIT_MAX_S in all, for reads and for writes that carry an Idempotency-Key (a submission's
# retry can then never queue the job twice); other writes report the refusal.
RETRY_STATUSES = (429, 503)
RETRY_AFTER_MAX_S = 30.0
RETRY_WAIT_MAX_S = 120.0
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class CliError(Exception):
    """A failure to report with an exit code: 2 a refused request or bad input, 3 unreachable or
    unauthorised."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def settings(config: str | None = None) -> tuple[str, str]:
    """(server URL, user token): environment variables win over the config file's [topoweb]
    `server` and `token`."""
    parser = configparser.ConfigParser()
    path = Path(config).expanduser() if config else CONFIG_PATH
    if path.exists():
        try:
            parser.read(path)
        except configparser.Error as exc:
            raise CliError(f"{path}: not a valid config file: {exc}") from exc
    section = parser["topoweb"] if parser.has_section("topoweb") else {}
    server = os.environ.get(ENV_SERVER) or section.get("server") or DEFAULT_SERVER
    token = os.environ.get(ENV_TOKEN) or section.get("token") or ""
    if not token:
        raise CliError(f"no token: set {ENV_TOKEN} or `token = ...` under [topoweb] in {path}", code=2)
    return server.rstrip("/"), token.strip()


class Api:
    """Thin JSON calls to /api/v1/ with a user token."""

    def __init__(self, server: str, token: str, *, timeout_s: float = 30.0, transport=None):
        self.http = httpx.Client(
            base_url=f"{server}/api/v1/",
            headers={"Authorization": f"Token {token}"},
            timeout=timeout_s,
            transport=transport,
        )

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        retryable = method.upper() in SAFE_METHODS or "Idempotency-Key" in (kwargs.get("headers") or {})
        waited = 0.0
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                raise CliError(f"cannot reach the server: {exc}", code=3) from exc
            wait = retry_after(response) if retryable else None
            if wait is None or waited + wait > RETRY_WAIT_MAX_S:
                break
            time.sleep(wait)
            waited += wait
        if response.status_code in (401, 403):
            raise CliError(f"refused ({response.status_code}): {_detail(response)}", code=3)
        if response.status_code == 404:
            raise CliError(f"not found: {_detail(response)}")
        if response.status_code >= 400:
            raise CliError(f"refused ({response.status_code}): {_detail(response)}")
        return response

    def json(self, method: str, path: str, **kwargs) -> Any:
        return self.call(method, path, **kwargs).json()

    def pages(self, path: str, params: dict | None = None, limit: int = 10_000) -> list[dict]:
        """Every item of a paginated list (at most `limit`)."""
        items: list[dict] = []
        body = self.json("GET", path, params=params)
        while True:
            items += body.get("results", []) if isinstance(body, dict) else body
            nxt = body.get("next") if isinstance(body, dict) else None
            if not nxt or len(items) >= limit:
                return items[:limit]
            body = self.json("GET", nxt)


def retry_after(response: httpx.Response) -> float | None:
    """Seconds a busy server asked to wait (RETRY_STATUSES with a numeric Retry-After, capped at
    RETRY_AFTER_MAX_S); None for any other answer."""
    if response.status_code not in RETRY_STATUSES:
        return None
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    if not seconds >= 0:  # NaN
        return None
    return min(seconds, RETRY_AFTER_MAX_S)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and set(body) == {"detail"}:
        return str(body["detail"])
    if isinstance(body, dict):
        return "; ".join(
            f"{k}: {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in body.items()
        )
    return str(body)[:500]
