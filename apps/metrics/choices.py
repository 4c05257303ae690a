"""Enumerations of the metrics app."""

from django.db import models

from .measures import ESTIMATE, REPORT


class SourceKind(models.TextChoices):
    """Where a cluster's measurements come from."""

    DCGM = "dcgm", "dcgm-exporter on each node"
    PROMETHEUS = "prometheus", "an existing Prometheus server"


class ScrapeState(models.TextChoices):
    """A node's collection state: `ok` the last pass read it; `stale` the last pass failed but
    its last good values are younger than the stale window (still shown, with their age);
    `error` it failed and nothing fresh is left (overlays fall back to predictions)."""

    OK = "ok", "OK"
    STALE = "stale", "Stale"
    ERROR = "error", "Error"


class MeasureSource(models.TextChoices):
    """Where a per-job figure comes from."""

    REPORT = REPORT, "the job's own report"
    ESTIMATE = ESTIMATE, "estimated from DCGM counters"


class HotspotKind(models.TextChoices):
    """Why a hotspot was recorded."""

    COMM_SHARE = "comm_share", "measured comm share above prediction"
    UPLINK = "uplink", "leaf uplink saturated"
