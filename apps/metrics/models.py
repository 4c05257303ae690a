"""Measurements: per-node scrape state, latest value per GPU, raw samples (an hour), 1-minute
rollups (a day), per-job series and reports (kept with the job), NIC counters, hotspots.

Fractions are 0..1, byte rates in bytes per second (`_Bps`), power in watts, temperatures in
degrees Celsius. A null field was not sent by the exporter (absent is not zero).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .choices import HotspotKind, MeasureSource, ScrapeState, SourceKind
from .exposition import MIG_ID_MAX_LENGTH

URL_MAX_LENGTH = 200
LABEL_MAX_LENGTH = 64


class MetricsSource(models.Model):
    """How a cluster is measured. Without a row a cluster uses `dcgm` with its nodes' `dcgm_url`.

    For `prometheus`, `node_label` names the label that carries the node name (dcgm-exporter's
    `Hostname`, or `instance`) and `gpu_label` the GPU index label; `node_suffix` is stripped from
    label values (e.g. `:9400` from an `instance`).
    """

    cluster = models.OneToOneField(
        "topology.Cluster", on_delete=models.CASCADE, related_name="metrics_source"
    )
    kind = models.CharField(max_length=16, choices=SourceKind.choices, default=SourceKind.DCGM)
    prometheus_url = models.URLField("Prometheus URL", max_length=URL_MAX_LENGTH, blank=True)
    node_label = models.CharField(max_length=LABEL_MAX_LENGTH, default="Hostname")
    gpu_label = models.CharField(max_length=LABEL_MAX_LENGTH, default="gpu")
    node_suffix = models.CharField(max_length=LABEL_MAX_LENGTH, blank=True, default="")
    timeout_s = models.FloatField("timeout per request (s)", default=5.0)
    interval_s = models.FloatField("collection interval (s)", default=15.0)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(timeout_s__gt=0, timeout_s__lte=60), name="metrics_source_timeout_range"
            ),
            models.CheckConstraint(
                condition=models.Q(interval_s__gte=1, interval_s__lte=3600),
                name="metrics_source_interval_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} for cluster {self.cluster_id}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.kind == SourceKind.PROMETHEUS and not self.prometheus_url:
            raise ValidationError({"prometheus_url": "required for the prometheus source"})


class NodeScrape(models.Model):
    """The collection state of one node (see ScrapeState), its last error and timings."""

    node = models.OneToOneField("topology.Node", on_delete=models.CASCADE, related_name="scrape")
    state = models.CharField(max_length=8, choices=ScrapeState.choices, default=ScrapeState.ERROR)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(
        null=True, blank=True, help_text="Fetch and parse time of the last attempt."
    )
    gpus_read = models.PositiveIntegerField(default=0)
    rejected = models.PositiveIntegerField(
        default=0, help_text="Values dropped as out of range in the last scrape."
    )

    class Meta:
        ordering = ["node_id"]
        indexes = [models.Index(fields=["state"], name="nodescrape_state")]

    def __str__(self) -> str:
        return f"node {self.node_id}: {self.state}"


class GpuValues(models.Model):
    """The measured fields (see exposition.GPU_FIELDS); null = not sent."""

    gpu_util = models.FloatField(null=True, blank=True)
    gr_engine_active = models.FloatField(null=True, blank=True)
    sm_active = models.FloatField(null=True, blank=True)
    tensor_active = models.FloatField(null=True, blank=True)
    dram_active = models.FloatField(null=True, blank=True)
    pcie_tx_Bps = models.FloatField(null=True, blank=True)
    pcie_rx_Bps = models.FloatField(null=True, blank=True)
    nvlink_tx_Bps = models.FloatField(null=True, blank=True)
    nvlink_rx_Bps = models.FloatField(null=True, blank=True)
    power_W = models.FloatField(null=True, blank=True)
    temp_C = models.FloatField(null=True, blank=True)
    xid_last = models.FloatField(null=True, blank=True, help_text="Value of the last XID error (0: none).")
    instance = models.CharField(
        max_length=MIG_ID_MAX_LENGTH, blank=True, default="", help_text="MIG GPU_I_ID."
    )

    class Meta:
        abstract = True

    def __str__(self) -> str:
        when = getattr(self, "at", None) or getattr(self, "minute", None)
        return f"gpu {self.gpu_id}{'/' + self.instance if self.instance else ''} at {when:%H:%M:%S}"


class GpuLatest(GpuValues):
    """The latest measurement of each GPU (instance "") and of each MIG instance (GPU_I_ID)."""

    gpu = models.ForeignKey("topology.Gpu", on_delete=models.CASCADE, related_name="latest_metrics")
    at = models.DateTimeField()

    class Meta:
        ordering = ["gpu_id", "instance"]
        constraints = [models.UniqueConstraint(fields=["gpu", "instance"], name="metrics_latest_one_per_gpu")]


class GpuSample(GpuValues):
    """A raw measurement, kept RAW_RETENTION_S (an hour)."""

    gpu = models.ForeignKey("topology.Gpu", on_delete=models.CASCADE, related_name="+", db_index=False)
    at = models.DateTimeField()

    class Meta:
        ordering = ["gpu_id", "at"]
        indexes = [
            models.Index(fields=["gpu", "at"], name="metrics_sample_gpu_at"),
            models.Index(fields=["at"], name="metrics_sample_at"),
        ]


class GpuRollup(GpuValues):
    """Per-minute means of a GPU's raw samples (`minute` is the start), kept ROLLUP_RETENTION_S."""

    gpu = models.ForeignKey("topology.Gpu", on_delete=models.CASCADE, related_name="+", db_index=False)
    minute = models.DateTimeField()
    samples = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["gpu_id", "minute"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "instance", "minute"], name="metrics_rollup_one_per_minute"
            )
        ]
        indexes = [models.Index(fields=["minute"], name="metrics_rollup_minute")]


class NicLatest(models.Model):
    """One InfiniBand port of a node: its last cumulative counters and the rates between the last
    two scrapes (bytes per second; null until two scrapes are seen or after a counter reset)."""

    node = models.ForeignKey("topology.Node", on_delete=models.CASCADE, related_name="nic_metrics")
    device = models.CharField(max_length=LABEL_MAX_LENGTH)
    port = models.CharField(max_length=8)
    at = models.DateTimeField()
    tx_bytes_total = models.FloatField(null=True, blank=True)
    rx_bytes_total = models.FloatField(null=True, blank=True)
    tx_Bps = models.FloatField(null=True, blank=True)
    rx_Bps = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["node_id", "device", "port"]
        constraints = [
            models.UniqueConstraint(fields=["node", "device", "port"], name="metrics_nic_one_per_port")
        ]

    def __str__(self) -> str:
        return f"node {self.node_id} {self.device} port {self.port}"


class JobReport(models.Model):
    """What a training job reports about its own steps (`POST /api/v1/jobs/{id}/report/`)."""

    job = models.ForeignKey("scheduling.Job", on_delete=models.CASCADE, related_name="reports")
    at = models.DateTimeField(default=timezone.now)
    step_ms = models.FloatField()
    tokens_per_step = models.FloatField(null=True, blank=True)
    flops_per_step = models.FloatField(null=True, blank=True, help_text="Achieved FLOPs per step, all ranks.")
    comm_ms = models.FloatField(null=True, blank=True, help_text="Measured communication time per step.")

    class Meta:
        ordering = ["job_id", "-at"]
        indexes = [models.Index(fields=["job", "at"], name="metrics_report_job_at")]

    def __str__(self) -> str:
        return f"job {self.job_id} report at {self.at:%H:%M:%S}: {self.step_ms:g} ms"


class JobSample(models.Model):
    """One collection interval of a running job, measured and predicted side by side.

    Utilisation and tensor activity are means over the job's GPUs; `mfu` and `comm_share` come
    from `mfu_source` / `comm_source`; `predicted_*` are the job's predictions at that moment;
    `nvlink_Bps` and `nic_Bps` are the job's summed byte rates (NIC: ports of its nodes).
    """

    job = models.ForeignKey("scheduling.Job", on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()
    gpus_measured = models.PositiveIntegerField(default=0)
    gpu_util = models.FloatField(null=True, blank=True)
    tensor_active = models.FloatField(null=True, blank=True)
    mfu = models.FloatField(null=True, blank=True)
    mfu_source = models.CharField(max_length=16, choices=MeasureSource.choices, blank=True, default="")
    comm_share = models.FloatField(null=True, blank=True)
    comm_source = models.CharField(max_length=16, choices=MeasureSource.choices, blank=True, default="")
    step_ms = models.FloatField(null=True, blank=True)
    nvlink_Bps = models.FloatField(null=True, blank=True)
    nic_Bps = models.FloatField(null=True, blank=True)
    power_W = models.FloatField(null=True, blank=True)
    predicted_mfu = models.FloatField(null=True, blank=True)
    predicted_comm_share = models.FloatField(null=True, blank=True)
    predicted_step_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "at"]
        indexes = [models.Index(fields=["job", "at"], name="metrics_jobsample_job_at")]

    def __str__(self) -> str:
        return f"job {self.job_id} at {self.at:%H:%M:%S}"


class Hotspot(models.Model):
    """A running job whose measured comm share exceeds its prediction, or a saturated leaf uplink,
    for `intervals` consecutive collections; `evidence` holds the measured figures."""

    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="hotspots")
    kind = models.CharField(max_length=16, choices=HotspotKind.choices)
    job = models.ForeignKey(
        "scheduling.Job", on_delete=models.CASCADE, null=True, blank=True, related_name="hotspots"
    )
    leaf = models.CharField(max_length=100, blank=True, default="")
    opened_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    intervals = models.PositiveIntegerField(default=0)
    evidence = models.JSONField(default=dict, blank=True)
    proposal = models.ForeignKey(
        "scheduling.MigrationProposal",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="hotspots",
    )

    class Meta:
        ordering = ["-last_seen_at", "-id"]
        indexes = [models.Index(fields=["cluster", "closed_at"], name="metrics_hotspot_open")]

    def __str__(self) -> str:
        where = f"job {self.job_id}" if self.job_id else f"leaf {self.leaf}"
        return f"{self.kind} hotspot on {where}"

    @property
    def is_open(self) -> bool:
        return self.closed_at is None


class UplinkSample(models.Model):
    """One leaf's measured uplink utilisation at one metrics pass: the leaf's NIC traffic that
    leaves it, as a share of its total uplink bandwidth (see `uplinks.leaf_uplink_loads`). Kept
    for UPLINK_RETENTION_S; the links and switch pages draw the last hours from it."""

    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="+")
    leaf = models.CharField(max_length=100)
    at = models.DateTimeField()
    share = models.FloatField(help_text="Measured load over uplink capacity (1.0: saturated).")

    class Meta:
        ordering = ["cluster_id", "leaf", "at"]
        indexes = [models.Index(fields=["cluster", "at"], name="metrics_uplinksample_at")]

    def __str__(self) -> str:
        return f"{self.leaf} at {self.at}: {self.share:.0%}"
