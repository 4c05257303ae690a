"""Topology API serializers: clusters (with their scheduling settings) and read-only rows."""

from __future__ import annotations

from rest_framework import serializers

from ..models import Cluster, Link, Node, Switch


class ClusterSerializer(serializers.ModelSerializer):
    """A cluster, its counts, and the settings staff may change (policy, preemption, backfill)."""

    node_count = serializers.IntegerField(read_only=True)
    gpu_count = serializers.IntegerField(read_only=True)
    switch_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "description",
            "policy",
            "preemption_enabled",
            "backfill_enabled",
            "node_count",
            "gpu_count",
            "switch_count",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "name", "created_at", "updated_at"]


class ClusterImportSerializer(serializers.Serializer):
    """Multipart import: a topology spec v1 file (YAML or JSON) and whether to replace."""

    file = serializers.FileField(help_text="A topology spec v1 file, YAML or JSON.")
    replace = serializers.BooleanField(required=False, default=False)


class SwitchSerializer(serializers.ModelSerializer):
    class Meta:
        model = Switch
        fields = ["id", "cluster", "name", "tier", "position"]
        read_only_fields = fields


class LinkSerializer(serializers.ModelSerializer):
    """A switch-to-switch cable: bandwidth in GB/s per direction, latency in us."""

    a_name = serializers.CharField(source="a.name", read_only=True)
    b_name = serializers.CharField(source="b.name", read_only=True)

    class Meta:
        model = Link
        fields = ["id", "cluster", "a", "a_name", "b", "b_name", "bw_GBps", "latency_us", "position"]
        read_only_fields = fields


class NicSummarySerializer(serializers.Serializer):
    name = serializers.CharField()
    leaf = serializers.CharField(source="leaf.name")
    bw_GBps = serializers.FloatField()
    latency_us = serializers.FloatField()


class NodeSerializer(serializers.ModelSerializer):
    """A node with its GPU model, leaf (first NIC's) and NICs."""

    gpu_model = serializers.CharField(source="gpu_model.name", read_only=True)
    leaf = serializers.CharField(source="leaf.name", read_only=True, allow_null=True, default=None)
    gpu_count = serializers.IntegerField(read_only=True)
    nics = NicSummarySerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "name",
            "gpu_model",
            "leaf",
            "dcgm_url",
            "standalone",
            "position",
            "gpu_count",
            "nics",
        ]
        read_only_fields = fields
