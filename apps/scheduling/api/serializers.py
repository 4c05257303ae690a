"""Output (and small input) serializers of the scheduling API; writes go through the services."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.topology.models import Cluster, Gpu

from ..account_models import DEFAULT_QOS
from ..models import AccountMembership, Job, MigrationProposal, Qos, SchedulingCycle
from ..selectors import spec_shown

MAX_MEMBER_QOS = 1000
LIST_FIELDS = [
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
    "requeues",
    "requeue_reason",
    "requeued_at",
    "predicted_comm_ms",
    "predicted_step_ms",
    "predicted_mfu",
]
DETAIL_FIELDS = [*LIST_FIELDS, "account", "qos", "held", "borrowed", "predicted", "flows", "spec"]
# The columns a list response reads: the list query loads only these.
LIST_COLUMNS = [
    *(f for f in LIST_FIELDS if f not in ("cluster_name", "owner", "overdue_reason")),
    "owner",
    "cluster__name",
    "owner__username",
]


# A job's detail reads every column of the job and these of its related rows.
JOB_COLUMNS = tuple(f.name for f in Job._meta.concrete_fields)
DETAIL_RELATED_COLUMNS = ("cluster__name", "owner__username", "account__name", "qos__name")
# The list's columns read as plain rows (no model instances: building three per job was most of a
# list's CPU), in the order of LIST_FIELDS that `job_list_row` takes them in.
_ROW_COLUMN = {"cluster": "cluster_id", "cluster_name": "cluster__name", "owner": "owner__username"}
LIST_ROW_COLUMNS = tuple(_ROW_COLUMN.get(f, f) for f in LIST_FIELDS if f != "overdue_reason")


def iso_datetime(value: datetime | None, tz: tzinfo | None = None) -> str | None:
    """A datetime as DRF writes it: ISO 8601 in the current time zone (`tz`, looked up when not
    given: a page of rows looks it up once), UTC as a trailing "Z"."""
    if value is None:
        return None
    text = value.astimezone(tz or timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


class JobListSerializer(serializers.ModelSerializer):
    """A job as lists show it: status, why it waits and its predicted costs (ms per step, MFU
    fraction), without the spec, the per-group `predicted` block and the flows (see the detail)."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    overdue_reason = serializers.CharField(read_only=True)

    class Meta:
        model = Job
        fields = LIST_FIELDS
        read_only_fields = fields

    def to_representation(self, instance: Job) -> dict[str, Any]:
        # The same values as the field-by-field path (a test holds them equal), several times
        # cheaper: lists and submissions are the API's hot path.
        j = instance
        return {
            "id": j.pk,
            "name": j.name,
            "cluster": j.cluster_id,
            "cluster_name": j.cluster.name,
            "owner": j.owner.username,
            "status": j.status,
            "priority": j.priority,
            "policy": j.policy,
            "placed_policy": j.placed_policy,
            "gpus": j.gpus,
            "estimated_runtime_s": _float(j.estimated_runtime_s),
            "submitted_at": iso_datetime(j.submitted_at),
            "placed_at": iso_datetime(j.placed_at),
            "started_at": iso_datetime(j.started_at),
            "finished_at": iso_datetime(j.finished_at),
            "pending_reason": j.pending_reason,
            "overdue": j.overdue,
            "overdue_reason": j.overdue_reason,
            "preemptions": j.preemptions,
            "requeues": j.requeues,
            "requeue_reason": j.requeue_reason,
            "requeued_at": iso_datetime(j.requeued_at),
            "predicted_comm_ms": _float(j.predicted_comm_ms),
            "predicted_step_ms": _float(j.predicted_step_ms),
            "predicted_mfu": _float(j.predicted_mfu),
        }


def job_list_row(row: tuple, tz: tzinfo) -> dict[str, Any]:
    """What JobListSerializer makes of a job, from its LIST_ROW_COLUMNS values, `tz` the current
    time zone (a test holds the two equal)."""
    (
        pk,
        name,
        cluster_id,
        cluster_name,
        owner,
        status,
        priority,
        policy,
        placed_policy,
        gpus,
        runtime_s,
        submitted_at,
        placed_at,
        started_at,
        finished_at,
        pending_reason,
        overdue,
        preemptions,
        requeues,
        requeue_reason,
        requeued_at,
        comm_ms,
        step_ms,
        mfu,
    ) = row
    return {
        "id": pk,
        "name": name,
        "cluster": cluster_id,
        "cluster_name": cluster_name,
        "owner": owner,
        "status": status,
        "priority": priority,
        "policy": policy,
        "placed_policy": placed_policy,
        "gpus": gpus,
        "estimated_runtime_s": _float(runtime_s),
        "submitted_at": iso_datetime(submitted_at, tz),
        "placed_at": iso_datetime(placed_at, tz),
        "started_at": iso_datetime(started_at, tz),
        "finished_at": iso_datetime(finished_at, tz),
        "pending_reason": pending_reason,
        "overdue": overdue,
        "overdue_reason": Job.overdue_text(overdue, started_at, runtime_s),
        "preemptions": preemptions,
        "requeues": requeues,
        "requeue_reason": requeue_reason,
        "requeued_at": iso_datetime(requeued_at, tz),
        "predicted_comm_ms": _float(comm_ms),
        "predicted_step_ms": _float(step_ms),
        "predicted_mfu": _float(mfu),
    }


class JobSerializer(JobListSerializer):
    """A job: its spec, status, why it waits, predicted costs (ms per step, MFU fraction, the
    placement output's per-group `predicted` block) and its own flows per leaf."""

    account = serializers.CharField(
        source="account.name",
        read_only=True,
        allow_null=True,
        help_text="The account it was submitted as, by name (null: none).",
    )
    qos = serializers.CharField(
        source="qos.name",
        read_only=True,
        allow_null=True,
        help_text="Its QOS, by name (unique on its cluster).",
    )
    held = serializers.BooleanField(
        read_only=True,
        help_text="Held by an operator or its account's coordinator: not placed until released.",
    )

    class Meta(JobListSerializer.Meta):
        fields = DETAIL_FIELDS
        read_only_fields = fields

    def to_representation(self, instance: Job) -> dict[str, Any]:
        out = super().to_representation(instance)
        # By name, as a spec names them (`"account": "research"`, `"qos": "high"`), the priority
        # endpoint and the pending reasons do: a QOS name is unique on the job's cluster.
        out["account"] = instance.account.name if instance.account_id is not None else None
        out["qos"] = instance.qos.name if instance.qos_id is not None else None
        out["held"] = instance.held
        out["borrowed"] = instance.borrowed
        out["predicted"] = instance.predicted
        out["flows"] = instance.flows
        request = self.context.get("request")
        out["spec"] = spec_shown(job=instance, user=getattr(request, "user", None))
        return out


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
            "failed_jobs",
            "status",
            "error",
        ]
        read_only_fields = fields


class GpuSerializer(serializers.ModelSerializer):
    """A GPU: node, index, NVLink domain, NIC, and the job and rank holding it (null if free)."""

    cluster = serializers.IntegerField(source="node.cluster_id", read_only=True)
    node_name = serializers.CharField(source="node.name", read_only=True)
    domain = serializers.CharField(source="domain.name", read_only=True)
    nic = serializers.CharField(source="nic.name", read_only=True, allow_null=True, default=None)
    job = serializers.IntegerField(read_only=True, allow_null=True)
    rank = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = Gpu
        fields = ["id", "cluster", "node", "node_name", "index", "domain", "nic", "job", "rank"]
        read_only_fields = fields


class QosSerializer(serializers.ModelSerializer):
    """A QOS of a cluster (the model's validators bound every number; blank limits are none)."""

    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())

    class Meta:
        model = Qos
        fields = [
            "id",
            "cluster",
            "name",
            "priority",
            "max_gpus_per_job",
            "max_running_gpus",
            "max_running_jobs",
            "max_running_gpus_per_user",
            "max_running_jobs_per_user",
            "max_running_gpus_per_account",
            "max_running_jobs_per_account",
            "max_queued_per_user",
            "max_queued_per_account",
            "max_wall_s",
            "gpu_hours_per_period",
            "period_h",
            "may_borrow",
            "preemptible",
            "description",
        ]
        read_only_fields = ["id"]

    def validate(self, attrs):
        instance = self.instance
        if (
            instance is not None
            and instance.name == DEFAULT_QOS
            and attrs.get("name", DEFAULT_QOS) != DEFAULT_QOS
        ):
            raise serializers.ValidationError(
                {"name": f"{DEFAULT_QOS} is every cluster's default QOS: it keeps its name"}
            )
        cluster = attrs.get("cluster", instance.cluster if instance else None)
        name = attrs.get("name", instance.name if instance else None)
        clash = Qos.objects.filter(cluster=cluster, name=name).exclude(pk=instance.pk if instance else None)
        if clash.exists():
            raise serializers.ValidationError(
                {"name": f"cluster {cluster.name} already has a QOS named {name}"}
            )
        return attrs


class PrioritySerializer(serializers.Serializer):
    """Body of a priority change: the job's new requested priority (the caller's limit bounds it)."""

    priority = serializers.IntegerField(min_value=-1_000_000, max_value=1_000_000)


@extend_schema_field(
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 1},
        "maxItems": MAX_MEMBER_QOS,
        "uniqueItems": False,
    }
)
class QosIdsField(serializers.Field):
    """A list of QOS ids (at most MAX_MEMBER_QOS, each a positive 64-bit integer); a bad one is a
    single message naming the field, not a nested error per item."""

    def to_internal_value(self, data) -> list[int]:
        if not isinstance(data, list) or len(data) > MAX_MEMBER_QOS:
            raise serializers.ValidationError(f"a list of at most {MAX_MEMBER_QOS} QOS ids")
        if not all(type(v) is int and 1 <= v < 2**63 for v in data):
            raise serializers.ValidationError("each QOS id is a whole number from 1 to 2**63-1")
        return data

    def to_representation(self, value) -> list[int]:
        return [q.pk for q in value.all()]


class MembershipSerializer(serializers.ModelSerializer):
    """A member of an account and the account's QOS they may use (`qos`: ids; none listed on a
    cluster: all the account's there). Only `qos` is written, by the account's coordinators and
    by admins."""

    account = serializers.SlugRelatedField(slug_field="name", read_only=True)
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    qos = QosIdsField(
        help_text=f"The ids of the account's QOS the member may use (at most {MAX_MEMBER_QOS})."
    )
    qos_names = serializers.SerializerMethodField(help_text="Each listed QOS as cluster/name.")

    class Meta:
        model = AccountMembership
        fields = ["id", "account", "user", "is_default", "is_coordinator", "qos", "qos_names"]
        read_only_fields = ["id", "account", "user", "is_default", "is_coordinator"]

    @staticmethod
    def _listed(instance: AccountMembership) -> list[Qos]:
        return sorted(instance.qos.all(), key=lambda q: (q.cluster.name, q.name))

    def get_qos_names(self, instance: AccountMembership) -> list[str]:
        return [f"{q.cluster.name}/{q.name}" for q in self._listed(instance)]

    def to_representation(self, instance: AccountMembership) -> dict[str, Any]:
        listed = self._listed(instance)
        return {
            "id": instance.pk,
            "account": instance.account.name,
            "user": instance.user.get_username(),
            "is_default": instance.is_default,
            "is_coordinator": instance.is_coordinator,
            "qos": [q.pk for q in listed],
            "qos_names": [f"{q.cluster.name}/{q.name}" for q in listed],
        }

    def validate_qos(self, value: list[int]) -> list[Qos]:
        """Only QOS the member's account lists (in one query)."""
        account = self.instance.account
        wanted = set(value)
        found = {q.pk: q for q in account.qos.filter(pk__in=wanted)}
        outside = sorted(wanted - set(found))
        if outside:
            names = dict(Qos.objects.filter(pk__in=outside[:20]).values_list("pk", "name"))
            shown = ", ".join(names.get(pk, f"no QOS {pk}") for pk in outside[:20])
            raise serializers.ValidationError(
                f"account {account.name} may not use {shown}: a member may only be given QOS their"
                " account lists"
            )
        return list(found.values())

    def update(self, instance: AccountMembership, validated_data: dict) -> AccountMembership:
        instance.qos.set(validated_data["qos"])
        return instance
