"""The Celery app (`celery -A topoweb worker|beat`): configured from CELERY_* Django settings."""

import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "topoweb.settings")

app = Celery("topoweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
@worker_process_init.connect
def _tune_gc(**kwargs) -> None:
    """The worker's start-up objects out of the collector's sight (topoweb.startup.tune_gc)."""
    from topoweb.startup import tune_gc

    tune_gc()
