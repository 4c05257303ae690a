"""Serializers of the metrics API: read-only views of the stored measurements, and the job report."""

from __future__ import annotations

from rest_framework import serializers

from ..exposition import VALUE_FIELDS
from ..models import GpuLatest, Hotspot, JobReport, JobSample, NodeScrape
from ..services import REPORT_LIMITS


class GpuValuesSerializer(serializers.ModelSerializer):
    """A GPU's (or MIG instance's) values; null = the exporter did not send the field."""

    cluster = serializers.CharField(source="gpu.node.cluster.name", read_only=True)
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    index = serializers.IntegerField(source="gpu.index", read_only=True)

    class Meta:
        model = GpuLatest
        fields = ["cluster", "node", "index", "instance", "at", *VALUE_FIELDS]
        read_only_fields = fields


class GpuRollupSerializer(GpuValuesSerializer):
    """A 1-minute mean (`at` is the minute's start)."""

    at = serializers.DateTimeField(source="minute", read_only=True)


class NodeScrapeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True)
    dcgm_url = serializers.CharField(source="node.dcgm_url", read_only=True)

    class Meta:
        model = NodeScrape
        fields = [
            "cluster",
            "node",
            "dcgm_url",
            "state",
            "last_success_at",
            "last_attempt_at",
            "last_error",
            "last_error_at",
            "duration_ms",
            "gpus_read",
            "rejected",
        ]
        read_only_fields = fields


class JobSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobSample
        exclude = ["id", "job"]


class HotspotSerializer(serializers.ModelSerializer):
    proposal_status = serializers.CharField(source="proposal.status", read_only=True, default=None)

    class Meta:
        model = Hotspot
        fields = [
            "id",
            "kind",
            "job",
            "leaf",
            "opened_at",
            "last_seen_at",
            "closed_at",
            "intervals",
            "evidence",
            "proposal",
            "proposal_status",
        ]
        read_only_fields = fields


class JobReportSerializer(serializers.ModelSerializer):
    """A job's own report: step time (ms, required), tokens and achieved FLOPs per step, and the
    measured communication time per step (ms), all optional."""

    step_ms = serializers.FloatField(
        min_value=REPORT_LIMITS["step_ms"][0], max_value=REPORT_LIMITS["step_ms"][1]
    )
    tokens_per_step = serializers.FloatField(
        required=False, allow_null=True, min_value=0, max_value=REPORT_LIMITS["tokens_per_step"][1]
    )
    flops_per_step = serializers.FloatField(
        required=False, allow_null=True, min_value=0, max_value=REPORT_LIMITS["flops_per_step"][1]
    )
    comm_ms = serializers.FloatField(
        required=False, allow_null=True, min_value=0, max_value=REPORT_LIMITS["comm_ms"][1]
    )

    class Meta:
        model = JobReport
        fields = ["at", "step_ms", "tokens_per_step", "flops_per_step", "comm_ms"]
        read_only_fields = ["at"]


class JobAggregateSerializer(serializers.Serializer):
    """Means over every sample of the job's run so far."""

    samples = serializers.IntegerField()
    first = serializers.DateTimeField(allow_null=True)
    last = serializers.DateTimeField(allow_null=True)
    gpu_util = serializers.FloatField(allow_null=True)
    mfu = serializers.FloatField(allow_null=True)
    comm_share = serializers.FloatField(allow_null=True)
    step_ms = serializers.FloatField(allow_null=True)


class JobMetricsSerializer(serializers.Serializer):
    """A job's measures: the newest sample (MFU beside utilisation, each with its source), the
    series with predictions, the newest report and open hotspots."""

    job = serializers.IntegerField()
    status = serializers.CharField()
    latest = JobSampleSerializer(allow_null=True)
    aggregate = JobAggregateSerializer()
    series = JobSampleSerializer(many=True)
    report = JobReportSerializer(allow_null=True)
    hotspots = HotspotSerializer(many=True)
