"""Checks the web server runs once at start-up, before it answers any request."""

from __future__ import annotations

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
