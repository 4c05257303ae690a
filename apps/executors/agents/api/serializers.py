"""Serializers of the node agents' sync body (every field bounded; each rank report validated
on its own)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict

from apps.scheduling.choices import ExitCause
from apps.scheduling.node_models import LOG_TAIL_CHARS

from ..services import AgentClaim, Heartbeat, LogChunk, RankReport, clean_text, parse_reports

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
ADDR_PATTERN = r"^[A-Za-z0-9._:\[\]-]*$"
MAX_GPUS_PER_NODE = 256
MAX_REPORTS = 256
MAX_LOG_CHUNKS = 64
MAX_CHUNK_BYTES = 256 * 1024
MAX_RANK = 1_048_575
MAX_ID = 2**31 - 1
MAX_ORPHANS = 64
MAX_ORPHAN_PIDS = 32
INSTANCE_PATTERN = r"^[0-9a-f]{16,64}$"
# Epoch seconds up to the year 2242.
MAX_EPOCH_S = 2.0**33


class GpuInventorySerializer(serializers.Serializer):
    """One GPU the agent found (nvidia-smi)."""

    index = serializers.IntegerField(min_value=0, max_value=MAX_GPUS_PER_NODE - 1)
    uuid = serializers.CharField(max_length=64, required=False, allow_blank=True)
    name = serializers.CharField(max_length=128, required=False, allow_blank=True)


class UnhealthyGpuSerializer(serializers.Serializer):
    """A GPU the agent found unhealthy and why (an XID, not found)."""

    gpu = serializers.IntegerField(min_value=0, max_value=MAX_GPUS_PER_NODE - 1)
    reason = serializers.CharField(max_length=200)


class FieldsOncePerThread:
    """A serializer mixin: the declared fields deep-copied and bound once per thread and class
    rather than for every instance (thousands of syncs a minute, each with up to MAX_REPORTS
    reports validated on their own). Validating keeps its state in the serializer
    (`validated_data`, `errors`), none in the fields; a serializer using this takes no context, the
    one thing fields read from their (first) parent."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._bound_fields = threading.local()

    @property
    def fields(self) -> BindingDict:
        fields = getattr(self._bound_fields, "fields", None)
        if fields is None:
            fields = BindingDict(self)
            for key, value in self.get_fields().items():
                fields[key] = value
            self._bound_fields.fields = fields
        return fields


class RankReportSerializer(FieldsOncePerThread, serializers.Serializer):
    """A rank's start or exit, keyed by (job, generation, rank): a repeated report is harmless."""

    job = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    generation = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    rank = serializers.IntegerField(min_value=0, max_value=MAX_RANK)
    event = serializers.ChoiceField(choices=["started", "exited"])
    pid = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False, allow_null=True)
    exit_code = serializers.IntegerField(min_value=-255, max_value=255, required=False, allow_null=True)
    cause = serializers.ChoiceField(
        choices=[c for c in ExitCause.values if c != ExitCause.NODE_DOWN],
        required=False,
        default=ExitCause.EXITED,
        help_text="Why it exited (exited: its own exit; lost, fenced, stopped: not its fault; "
        "pids_limit, memory_limit: a limit of its cgroup; refused: never started). Absent: exited.",
    )
    log_tail = serializers.CharField(
        max_length=LOG_TAIL_CHARS, required=False, allow_blank=True, trim_whitespace=False
    )

    def validate(self, attrs):
        if attrs["event"] == "exited" and attrs.get("exit_code") is None:
            raise serializers.ValidationError({"exit_code": ["required when event is exited"]})
        return attrs


class LogChunkSerializer(serializers.Serializer):
    """`size` bytes of a rank's log file from byte `offset`, as text."""

    job = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    generation = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    rank = serializers.IntegerField(min_value=0, max_value=MAX_RANK)
    offset = serializers.IntegerField(min_value=0, max_value=2**62)
    size = serializers.IntegerField(min_value=1, max_value=MAX_CHUNK_BYTES)
    data = serializers.CharField(max_length=MAX_CHUNK_BYTES, allow_blank=True, trim_whitespace=False)


class OrphanSerializer(serializers.Serializer):
    """A rank cgroup holding processes that no rank record of this server names: being stopped."""

    job = serializers.IntegerField(min_value=0, max_value=MAX_ID)
    generation = serializers.IntegerField(min_value=0, max_value=MAX_ID)
    rank = serializers.IntegerField(min_value=0, max_value=MAX_RANK)
    pids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID), max_length=MAX_ORPHAN_PIDS
    )
    server = serializers.RegexField(
        r"^[A-Za-z0-9-]*$",
        max_length=16,
        required=False,
        allow_blank=True,
        help_text="The server its record named, when another (or 'unknown').",
    )


MAX_NICS = 64
MAX_NIC_BYTES = 2**63 - 1  # what a 64-bit counter holds (and the JSON parser takes)


class NicCounterSerializer(serializers.Serializer):
    """One NIC port's cumulative byte counters as the agent read them from sysfs (InfiniBand
    port_xmit_data and port_rcv_data already in bytes; a network interface as port "0")."""

    device = serializers.RegexField(r"^[A-Za-z0-9_.:-]+$", max_length=64)
    port = serializers.RegexField(r"^[0-9]{1,3}$", max_length=3)
    tx_bytes = serializers.IntegerField(min_value=0, max_value=MAX_NIC_BYTES, allow_null=True, required=False)
    rx_bytes = serializers.IntegerField(min_value=0, max_value=MAX_NIC_BYTES, allow_null=True, required=False)


class AgentSyncSerializer(FieldsOncePerThread, serializers.Serializer):
    """The body of an agent's sync: who it is, its GPUs, what it runs, what happened since."""

    node = serializers.RegexField(
        NAME_PATTERN,
        max_length=200,
        required=False,
        help_text="The node's name; when given it must be the node the credential names.",
    )
    version = serializers.CharField(max_length=40)
    addr = serializers.RegexField(ADDR_PATTERN, max_length=255, required=False, allow_blank=True)
    gpus = GpuInventorySerializer(many=True, required=False, allow_null=True, max_length=MAX_GPUS_PER_NODE)
    unhealthy = UnhealthyGpuSerializer(many=True, required=False, max_length=MAX_GPUS_PER_NODE)
    running = serializers.ListField(
        child=serializers.ListField(
            child=serializers.IntegerField(min_value=0, max_value=MAX_ID), min_length=3, max_length=3
        ),
        required=False,
        max_length=MAX_GPUS_PER_NODE * 4,
        help_text="[job, generation, rank] of every rank process running now.",
    )
    stopping = serializers.ListField(
        child=serializers.ListField(
            child=serializers.IntegerField(min_value=0, max_value=MAX_ID), min_length=3, max_length=3
        ),
        required=False,
        max_length=MAX_GPUS_PER_NODE * 4,
        help_text="[job, generation, rank] of every rank the agent is stopping (its processes still run).",
    )
    reports = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        max_length=MAX_REPORTS,
        help_text="Rank reports, each validated on its own: a bad one is refused in the answer.",
    )
    isolation = serializers.CharField(max_length=200, required=False, allow_blank=True)
    logs = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        max_length=MAX_LOG_CHUNKS,
        help_text="Pieces of the ranks' log files, each validated on its own.",
    )
    wait_s = serializers.FloatField(min_value=0, max_value=60, required=False, default=0.0)
    instance = serializers.RegexField(
        INSTANCE_PATTERN,
        required=False,
        help_text="This agent process's random id: the node syncs with one instance at a time.",
    )
    previous = serializers.RegexField(
        INSTANCE_PATTERN,
        required=False,
        allow_blank=True,
        help_text="The instance the agent's state directory last synced as (the agent it succeeds).",
    )
    host = serializers.RegexField(ADDR_PATTERN, max_length=255, required=False, allow_blank=True)
    started_at = serializers.FloatField(
        min_value=0, max_value=MAX_EPOCH_S, required=False, help_text="When the agent started (epoch s)."
    )
    orphans = OrphanSerializer(many=True, required=False, max_length=MAX_ORPHANS)
    nics = NicCounterSerializer(
        many=True,
        required=False,
        max_length=MAX_NICS,
        help_text="The node's NIC byte counters (sysfs): measured NIC and uplink load.",
    )

    def validate(self, attrs):
        attrs.setdefault("running", [])
        attrs.setdefault("stopping", [])
        attrs.setdefault("reports", [])
        attrs.setdefault("logs", [])
        return attrs

    def heartbeat(self) -> Heartbeat:
        """The heartbeat part of the validated body."""
        data = self.validated_data
        gpus = data.get("gpus")
        return Heartbeat(
            version=data["version"],
            addr=data.get("addr", ""),
            inventory=None if gpus is None else [dict(g) for g in gpus],
            unhealthy=tuple((u["gpu"], u["reason"]) for u in data.get("unhealthy", [])),
            running=len(data["running"]) + len(data["stopping"]),
            ranks=frozenset(tuple(k) for k in [*data["running"], *data["stopping"]]),
            isolation=data.get("isolation", ""),
            orphans=tuple(
                {**o, "pids": list(o["pids"]), "server": o.get("server", "")} for o in data.get("orphans", [])
            ),
        )

    def claim(self) -> AgentClaim:
        """Which agent process sent the body."""
        data = self.validated_data
        started = data.get("started_at")
        return AgentClaim(
            instance=data.get("instance", ""),
            previous=data.get("previous", ""),
            host=data.get("host", ""),
            addr=data.get("addr", ""),
            started_at=None if started is None else datetime.fromtimestamp(started, tz=UTC),
        )


def report_key(item: Any) -> dict[str, Any]:
    """What identifies a report in a refusal: its job, generation, rank and event as sent."""
    if not isinstance(item, dict):
        return {}
    return {k: item[k] for k in ("job", "generation", "rank", "event") if k in item and _scalar(item[k])}


def _scalar(value: Any) -> bool:
    return isinstance(value, int | str) and len(str(value)) <= 40


def split_reports(items: list[Any]) -> tuple[list[RankReport], list[dict[str, Any]]]:
    """The valid reports, and the refused ones as their key and why (`reason`). Output text is
    stored as the database can: NUL and invalid UTF-8 become U+FFFD, and only its last
    LOG_TAIL_CHARS characters are kept."""
    good: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("log_tail"), str):
            item = {**item, "log_tail": clean_text(item["log_tail"])[-LOG_TAIL_CHARS:]}
        one = RankReportSerializer(data=item)
        if one.is_valid():
            good.append(one.validated_data)
            continue
        errors = one.errors if isinstance(item, dict) else {"report": ["must be an object"]}
        reason = "; ".join(
            f"{field}: {' '.join(str(m) for m in (msgs if isinstance(msgs, list) else [msgs]))}"
            for field, msgs in errors.items()
        )
        refused.append({**report_key(item), "index": index, "reason": reason})
    return parse_reports(good), refused


def split_logs(items: list[Any]) -> tuple[list[LogChunk], list[dict[str, Any]]]:
    """The valid log chunks, and the refused ones as their key and why (`reason`)."""
    good: list[LogChunk] = []
    refused: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("data"), str):
            item = {**item, "data": clean_text(item["data"])}
        one = LogChunkSerializer(data=item)
        if one.is_valid():
            good.append(LogChunk(**one.validated_data))
            continue
        errors = one.errors if isinstance(item, dict) else {"log": ["must be an object"]}
        reason = "; ".join(
            f"{field}: {' '.join(str(m) for m in (msgs if isinstance(msgs, list) else [msgs]))}"
            for field, msgs in errors.items()
        )
        key = report_key(item)
        if isinstance(item, dict) and _scalar(item.get("offset")):
            key["offset"] = item["offset"]
        refused.append({**key, "index": index, "reason": reason})
    return good, refused
