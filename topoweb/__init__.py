"""TopoWeb Django project: settings, URLs, Celery app, WSGI/ASGI entry points."""

from .celery import app as celery_app

__all__ = ("celery_app",)
