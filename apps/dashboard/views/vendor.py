"""plotly.min.js from the installed plotly package, so the dashboard needs no internet access.

Served under a URL that carries the plotly version, so browsers may cache it for good.
"""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import plotly
from django.http import Http404, HttpResponse, HttpResponseNotModified
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_safe

PLOTLY_JS_PATH = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
_BODY: dict[str, bytes] = {}
_LOCK = threading.Lock()


def plotly_js_url() -> str:
    """The URL of the bundled plotly.min.js for the installed plotly version."""
    return reverse("dashboard:plotly-js", args=[plotly.__version__])


def _body(encoding: str) -> bytes:
    with _LOCK:
        if "identity" not in _BODY:
            _BODY["identity"] = PLOTLY_JS_PATH.read_bytes()
        if encoding == "gzip" and "gzip" not in _BODY:
            # Compressed once per process: 4.7 MB becomes about 1.4 MB on the wire.
            _BODY["gzip"] = gzip.compress(_BODY["identity"], compresslevel=6)
        return _BODY[encoding]


@require_safe
def plotly_js(request, version: str):
    """plotly.min.js, gzip-compressed when the client accepts it, cacheable for a year."""
    if version != plotly.__version__:
        raise Http404(f"this server bundles plotly {plotly.__version__}, not {version}")
    etag = f'"plotly-{version}"'
    if request.headers.get("If-None-Match") == etag:
        return HttpResponseNotModified()
    encoding = "gzip" if "gzip" in request.headers.get("Accept-Encoding", "") else "identity"
    response = HttpResponse(_body(encoding), content_type="text/javascript; charset=utf-8")
    if encoding == "gzip":
        response["Content-Encoding"] = "gzip"
    response["ETag"] = etag
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    patch_vary_headers(response, ["Accept-Encoding"])
    return response
