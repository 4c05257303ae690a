"""Simulation runs: a trace replayed on a stored cluster under several policies, kept to compare."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from .choices import RunStatus

MAX_JOBS = 20_000
MAX_LOAD = 10.0


class SimulationRun(models.Model):
    """One policy comparison: inputs (cluster, trace file name, policies, job limit, seed, offered
    load), progress (jobs replayed of the total over every policy) and the result, the JSON of
    `Comparison.as_dict(series=True)`. The cluster's name is kept if the cluster is deleted."""

    cluster = models.ForeignKey(
        "topology.Cluster", on_delete=models.SET_NULL, null=True, blank=True, related_name="simulations"
    )
    cluster_name = models.CharField(max_length=200)
    trace = models.CharField(max_length=200, help_text="File name of a trace in the trace folders.")
    policies = models.JSONField(help_text="Policy names, in the order they run.")
    job_limit = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MAX_JOBS)])
    seed = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(2**31 - 1)])
    load = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.01), MaxValueValidator(MAX_LOAD)],
        help_text="Offered load the arrivals are scaled to (fraction of the cluster); null keeps the trace's.",
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    jobs_done = models.PositiveIntegerField(default=0)
    jobs_total = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="simulations"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"simulation {self.pk} {self.trace} on {self.cluster_name}"

    @property
    def progress(self) -> float:
        """Share of the run done, 0 to 1."""
        if self.status == RunStatus.DONE:
            return 1.0
        return min(self.jobs_done / self.jobs_total, 1.0) if self.jobs_total else 0.0
