"""The node agents' sync served asynchronously: an ASGI application in front of Django's.

`POST /api/v1/agents/sync/` runs Django's ordinary request handling (the site's middleware but
what serves browsers, the DRF view, its node-token auth, throttle, body limits and errors) on a
small pool of threads, but marked so that the view does not block its thread for the long-poll:
it answers with the wait attached (`AgentWait`), this application waits for the node's change as
a future of its event loop (`wakeups.changed`, woken in-process or through Redis pub/sub, no
polling) and, when the node's work changed, reads it again on the pool. Thousands of waiting
agents cost an idle future each, not a thread. Every other request goes to Django's own ASGI
handler.

Served by uvicorn (`uvicorn topoweb.asgi:application`, the `agents` service of docker-compose.yml);
see docs/operations.md.
"""

from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core import signals
from django.core.handlers.asgi import ASGIRequest, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.urls import set_script_prefix

from apps.executors.agents.api.views import WAITS_ELSEWHERE, AgentWait
from apps.executors.agents.wakeups import changed
from topoweb.bodylimits import body_limit

SYNC_PATH = "/api/v1/agents/sync/"
# Threads running the syncs' request handling (not their waits): enough to overlap database
# round trips; each holds a database connection only while it handles a request.
SYNC_THREADS = 16
# The site's middleware that serves browsers only: static files, sessions and the session's user,
# CSRF, messages, the pages' framing and content-security headers, CommonMiddleware's redirects
# and lengths. An agent sends a node token and JSON and reads JSON: its sync skips them (a tenth
# of the sync's CPU). Any other middleware of the site, a new one included, runs for it too.
BROWSER_ONLY_MIDDLEWARE = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
        "topoweb.middleware.CSPMiddleware",
    }
)


class SyncHandler(BaseHandler):
    """Django's request handler with the site's middleware but BROWSER_ONLY_MIDDLEWARE."""

    def load_middleware(self, is_async=False):
        # Django builds the chain from settings.MIDDLEWARE: it reads the sync's list instead while
        # the chain is built, once, at start-up (before any request is served).
        site = settings.MIDDLEWARE
        settings.MIDDLEWARE = [path for path in site if path not in BROWSER_ONLY_MIDDLEWARE]
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = site


class AgentSyncApplication:
    """`site` (Django's ASGI application) with the agents' sync path served as described above."""

    def __init__(self, site):
        self.site = site
        self.handler = SyncHandler()
        self.handler.load_middleware(is_async=False)
        self.pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="agent-sync")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != SYNC_PATH or scope["method"] != "POST":
            await self.site(scope, receive, send)
            return
        body = await _read_body(scope, receive, body_limit(SYNC_PATH))
        if body is None:  # the agent went away before its request was complete
            return
        loop = asyncio.get_running_loop()
        request, response = await loop.run_in_executor(self.pool, self._handle, scope, body)
        wait: AgentWait | None = getattr(response, "agent_wait", None)
        if wait is not None and await changed(wait.node.cluster_id, wait.node.name, wait.since, wait.wait_s):
            response = await loop.run_in_executor(self.pool, self.refresh, request, wait, response)
        await _send(response, send)

    def _handle(self, scope, body: bytes) -> tuple[HttpRequest, HttpResponse]:
        """Django's handling of one sync request, in a pool thread (as a WSGI server would)."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request = ASGIRequest(scope, io.BytesIO(body))
        setattr(request, WAITS_ELSEWHERE, True)
        response = self.handler.get_response(request)
        # The content is in memory: closing now ends the request (request_finished gives the
        # database connection back) before any wait.
        response.close()
        return request, response

    def refresh(self, request: HttpRequest, wait: AgentWait, response: HttpResponse) -> HttpResponse:
        """The answer after the node's change (`AgentWait.refresh`); an error reading the work
        is answered as the view's own would be (a lost database: 503 with Retry-After)."""
        try:
            return wait.refresh(response)
        except Exception as exc:
            return self.handler.process_exception_by_middleware(exc, request) or response_for_exception(
                request, exc
            )
        finally:
            close_old_connections()


async def _read_body(scope, receive, limit: int) -> bytes | None:
    """The request body; None if the client disconnected. A body whose Content-Length is over
    `limit` (or not a number) is not read at all: BodyLimitMiddleware answers it from the header,
    as under any server. Of a body without a length at most `limit` + 1 bytes are kept."""
    length = dict(scope["headers"]).get(b"content-length", b"0")
    if not length.isdigit() or len(length) > 18 or int(length) > limit:
        return b""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size <= limit:
            parts.append(chunk[: limit + 1 - size])
            size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _send(response: HttpResponse, send) -> None:
    headers = [
        (str(k).encode("ascii"), str(v).encode("latin1"))
        for k, v in response.items()
        if k.lower() != "content-length"
    ]
    headers.append((b"Content-Length", str(len(response.content)).encode("ascii")))
    headers += [
        (b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in response.cookies.values()
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})
