"""plotly.js from the installed plotly package, so the dashboard needs no internet access.

Two bundles, each under a URL that carries the plotly version, so browsers may cache them for
good: plotly.py's full plotly.min.js (4.7 MB, every trace type: the simulation pages' figures)
and plotly.js's own basic bundle of the same plotly.js version (scatter, bar and pie, 1 MB;
apps/dashboard/vendor/, MIT, see NOTICE), all the cluster graph, the job and the import pages
draw: Chromium parses a fifth of the code before the graph can be drawn.
"""

from __future__ import annotations

import gzip
import re
import threading
from pathlib import Path

import plotly
from django.http import Http404, HttpResponse, HttpResponseNotModified
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_safe

BUNDLES = {
    "full": Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
    "basic": Path(__file__).resolve().parent.parent / "vendor" / "plotly-basic.min.js",
}
_BODY: dict[tuple[str, str], bytes] = {}
_LOCK = threading.Lock()
_VERSION = re.compile(rb"plotly\.js (?:\([a-z -]+\) )?v(\d+\.\d+\.\d+)")


def plotly_js_url(bundle: str = "full") -> str:
    """The URL of a bundled plotly.js ("full" or "basic") for the installed plotly version."""
    name = "plotly-js" if bundle == "full" else "plotly-basic-js"
    return reverse(f"dashboard:{name}", args=[plotly.__version__])


def bundle_version(bundle: str) -> str:
    """The plotly.js version a bundle's header names ("3.1.0")."""
    with BUNDLES[bundle].open("rb") as f:
        found = _VERSION.search(f.read(400))
    return found.group(1).decode() if found else ""


def _body(bundle: str, encoding: str) -> bytes:
    with _LOCK:
        if (bundle, "identity") not in _BODY:
            _BODY[bundle, "identity"] = BUNDLES[bundle].read_bytes()
        if encoding == "gzip" and (bundle, "gzip") not in _BODY:
            # Compressed once per process: 4.7 MB becomes about 1.4 MB on the wire, 1 MB 0.3 MB.
            _BODY[bundle, "gzip"] = gzip.compress(_BODY[bundle, "identity"], compresslevel=6)
        return _BODY[bundle, encoding]


@require_safe
def plotly_js(request, version: str, bundle: str = "full"):
    """A plotly.js bundle, gzip-compressed when the client accepts it, cacheable for a year."""
    if version != plotly.__version__:
        raise Http404(f"this server bundles plotly {plotly.__version__}, not {version}")
    etag = f'"plotly-{bundle}-{version}"'
    if request.headers.get("If-None-Match") == etag:
        return HttpResponseNotModified()
    encoding = "gzip" if "gzip" in request.headers.get("Accept-Encoding", "") else "identity"
    response = HttpResponse(_body(bundle, encoding), content_type="text/javascript; charset=utf-8")
    if encoding == "gzip":
        response["Content-Encoding"] = "gzip"
    response["ETag"] = etag
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    patch_vary_headers(response, ["Accept-Encoding"])
    return response
