"""Shared pieces of the topology models: value validators and the cluster `updated_at` touch."""

import math

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from apps.placement.topology.ranges import (
    GPU_MODEL_HELP,
    GPU_MODEL_RE,
    MAX_GPU_SPEED,
    MAX_LATENCY_US,
    MAX_PEAK_TFLOPS,
    MIN_GPU_SPEED,
    NAME_HELP,
    NAME_RE,
    MAX_BW_GBps,
    MIN_BW_GBps,
)

NAME_MAX_LENGTH = 100
URL_MAX_LENGTH = 200


def validate_positive(value: float) -> None:
    """Reject zero, negative and non-finite numbers (bandwidths in GB/s, latencies in us, TFLOPS)."""
    if value is None:
        return
    if not math.isfinite(value) or value <= 0:
        raise ValidationError("must be a positive number, got %(value)s", params={"value": value})


def _in_range(value: float, low: float, high: float, unit: str) -> None:
    validate_positive(value)
    if value is not None and not low <= value <= high:
        raise ValidationError(
            "must be between %(low)s and %(high)s " + unit + ", as in a topology file; got %(value)s",
            params={"low": f"{low:g}", "high": f"{high:g}", "value": f"{value:g}"},
        )


def validate_bw_GBps(value: float) -> None:
    """A bandwidth in GB/s within the range the topology import accepts."""
    _in_range(value, MIN_BW_GBps, MAX_BW_GBps, "GB/s")


def validate_latency_us(value: float) -> None:
    """A latency in microseconds within the range the topology import accepts."""
    _in_range(value, 0.0, MAX_LATENCY_US, "us")


def validate_peak_tflops(value: float) -> None:
    """A GPU's dense peak in TFLOPS within the range the topology import accepts."""
    _in_range(value, 0.0, MAX_PEAK_TFLOPS, "TFLOPS")


def validate_gpu_speed(value: float | None) -> None:
    """A GPU model's measured relative speed within the range the topology import accepts."""
    if value is not None:
        _in_range(value, MIN_GPU_SPEED, MAX_GPU_SPEED, "(relative speed)")


def validate_name(value: str) -> None:
    """Cluster, switch, node, NIC and NVLink domain names: the host-name-like names of spec v1."""
    if not NAME_RE.match(value or ""):
        raise ValidationError(f"must be {NAME_HELP}")


def validate_gpu_model_name(value: str) -> None:
    """GPU model names: spec v1 names, with inner spaces, parentheses and '+' allowed."""
    if not GPU_MODEL_RE.match(value or ""):
        raise ValidationError(f"must be {GPU_MODEL_HELP}")


def validate_http_url(value: str) -> None:
    """Accept http(s) URLs with any host name (cluster host names such as `node-a` have no dot)."""
    if value and not value.startswith(("http://", "https://")):
        raise ValidationError("must be an http(s) URL, got %(value)s", params={"value": value})


def touch_cluster(cluster_id: int | None) -> None:
    """Advance a cluster's `updated_at` so cached topology snapshots of it are rebuilt."""
    if cluster_id is None:
        return
    from ..selectors import forget_recent_clusters
    from .cluster import Cluster

    Cluster.objects.filter(pk=cluster_id).update(updated_at=timezone.now())
    forget_recent_clusters()


class ClusterRow(models.Model):
    """A row that belongs to one cluster: saving or deleting it touches that cluster."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
        touch_cluster(self.owning_cluster_id())

    def delete(self, *args, **kwargs):
        cluster_id = self.owning_cluster_id()
        result = super().delete(*args, **kwargs)
        touch_cluster(cluster_id)
        return result

    def owning_cluster_id(self) -> int | None:
        return self.cluster_id


def positive_constraint(model: str, field: str) -> models.CheckConstraint:
    """A database check that `field` is greater than zero."""
    return models.CheckConstraint(
        condition=models.Q(**{f"{field}__gt": 0}),
        name=f"topology_{model}_{field.lower()}_positive",
        violation_error_message=f"{field} must be positive",
    )
