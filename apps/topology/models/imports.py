"""A topology import run in the background (a Celery task), for imports too large for one request."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class ClusterImport(models.Model):
    """One background import: the parsed spec waiting for its worker, then the stage it reached,
    the cluster it wrote (all or nothing) or the errors by field. The spec is dropped once done."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    stage = models.CharField(max_length=64, blank=True, default="queued")
    progress = models.FloatField(default=0.0, help_text="Fraction of the import's stages done.")
    replace = models.BooleanField(default=False)
    spec = models.JSONField(null=True, blank=True, help_text="The parsed spec, until the worker took it.")
    notes = models.JSONField(default=list, blank=True)
    errors = models.JSONField(default=dict, blank=True, help_text="Field -> messages, when failed.")
    cluster = models.ForeignKey(
        "topology.Cluster", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"import {self.pk}: {self.status}"
