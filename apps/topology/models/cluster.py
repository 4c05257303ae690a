"""Cluster and the GPU models it uses."""

from django.db import models

from ..choices import PlacementPolicy
from .base import (
    NAME_MAX_LENGTH,
    ClusterRow,
    positive_constraint,
    validate_gpu_model_name,
    validate_gpu_speed,
    validate_name,
    validate_peak_tflops,
)


class Cluster(models.Model):
    """A GPU cluster: the unit of topology import/export and of scheduling."""

    name = models.CharField(max_length=NAME_MAX_LENGTH, validators=[validate_name], unique=True)
    description = models.TextField(blank=True)
    policy = models.CharField(
        max_length=20,
        choices=PlacementPolicy.choices,
        default=PlacementPolicy.TOPO,
        help_text="Placement policy for jobs that do not name one.",
    )
    preemption_enabled = models.BooleanField(default=False)
    backfill_enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(policy__in=PlacementPolicy.values),
                name="topology_cluster_policy_valid",
                violation_error_message="policy must be one of " + ", ".join(PlacementPolicy.values),
            ),
        ]

    def __str__(self) -> str:
        return self.name


class GpuModel(ClusterRow):
    """A GPU type of a cluster, with its dense BF16/FP16 peak for MFU."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="gpu_models")
    name = models.CharField(max_length=NAME_MAX_LENGTH, validators=[validate_gpu_model_name])
    peak_tflops = models.FloatField(validators=[validate_peak_tflops], help_text="Dense peak, TFLOPS.")
    speed = models.FloatField(
        null=True,
        blank=True,
        validators=[validate_gpu_speed],
        help_text="Measured speed relative to the cluster's other models (set on all or none); "
        "jobs' compute times scale by its ratios, by the peaks' when unset.",
    )

    class Meta:
        ordering = ["cluster_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="topology_gpumodel_unique_name"),
            positive_constraint("gpumodel", "peak_tflops"),
        ]

    def __str__(self) -> str:
        return self.name
