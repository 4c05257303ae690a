"""Output (and small input) serializers of the scheduling API; writes go through the services."""

from __future__ import annotations

from rest_framework import serializers

from ..models import Job, MigrationProposal, SchedulingCycle


class JobSerializer(serializers.ModelSerializer):
    """A job: its spec, status, why it waits, predicted costs (ms per step, MFU fraction, the
    placement output's per-group `predicted` block) and its own flows per leaf."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    overdue_reason = serializers.CharField(read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "cluster",
            "cluster_name",
            "owner",
            "status",
            "priority",
            "policy",
            "placed_policy",
            "gpus",
            "estimated_runtime_s",
            "submitted_at",
            "placed_at",
            "started_at",
            "finished_at",
            "pending_reason",
            "overdue",
            "overdue_reason",
            "preemptions",
            "predicted_comm_ms",
            "predicted_step_ms",
            "predicted_mfu",
            "predicted",
            "flows",
            "spec",
        ]
        read_only_fields = fields


class JobFailSerializer(serializers.Serializer):
    """Body of `fail`: an optional reason shown as the job's pending reason."""

    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class MigrationProposalSerializer(serializers.ModelSerializer):
    """A proposed move of a running job: mappings, predicted step times (ms) and gain (fraction)."""

    cluster = serializers.IntegerField(source="job.cluster_id", read_only=True)
    job_name = serializers.CharField(source="job.name", read_only=True)
    decided_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = MigrationProposal
        fields = [
            "id",
            "job",
            "job_name",
            "cluster",
            "policy",
            "status",
            "predicted_gain",
            "predicted_old_step_ms",
            "predicted_new_step_ms",
            "reason",
            "old_mapping",
            "new_mapping",
            "created_at",
            "applied_at",
            "decided_by",
        ]
        read_only_fields = fields


class SchedulingCycleSerializer(serializers.ModelSerializer):
    """One scheduling cycle's audit record."""

    class Meta:
        model = SchedulingCycle
        fields = [
            "id",
            "cluster",
            "started_at",
            "policy",
            "duration_ms",
            "placed",
            "placed_jobs",
            "preempted_jobs",
            "skipped",
            "status",
            "error",
        ]
        read_only_fields = fields
