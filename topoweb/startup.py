"""Checks the web server runs once at start-up, before it answers any request."""

from __future__ import annotations

import gc

from django.contrib.staticfiles.storage import ManifestFilesMixin
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import storages


def check_static_collected() -> None:
    """Refuse to start when the hashed static files are served but were never collected: without
    the manifest every page that names a static file would answer 500."""
    storage = storages["staticfiles"]
    if not isinstance(storage, ManifestFilesMixin):
        return
    try:
        paths, _ = storage.load_manifest()
    except ValueError:
        paths = {}
    if paths:
        return
    raise ImproperlyConfigured(
        f"static files were not collected: no {storage.manifest_name} in {storage.location}. "
        "Run `python manage.py collectstatic --noinput` (the Docker image does it when built), "
        "or set TOPOWEB_STATIC_ROOT to where they were collected."
    )


# The youngest generation is collected after this many new objects (Python's default is 700, a
# few times per request), the middle one after 20 of those collections (default 10), the oldest
# after 10 of the middle one's (as by default).
GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a long-running server: what was loaded at
    start-up (modules, settings, URL patterns, the ORM's models) is moved out of its sight
    (`gc.freeze`: never collected, never traversed again), and the youngest generation is
    collected after tens of thousands of new objects instead of hundreds. A request's objects are
    freed by reference counting as it ends; every collection traversed the survivors of the
    requests in flight and, every hundredth one, the whole heap: a tenth of an idle agent sync's
    CPU. Cycles are still collected, later."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
