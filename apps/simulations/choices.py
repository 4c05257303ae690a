"""Enumerations of the simulations app."""

from django.db import models


class RunStatus(models.TextChoices):
    """A simulation run's state: queued, running (progress moves), done (result stored), failed."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


LIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
