"""Serializers of node health, drain and rank runs (job logs)."""

from __future__ import annotations

from datetime import datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.topology.models import Node

from ..choices import SHOWN_NODE_STATES, ExitCause, RankState
from ..models import NodeHealth, RankRun
from ..nodes import shown_state


class DrainSerializer(serializers.Serializer):
    """Why the node is drained."""

    reason = serializers.CharField(max_length=500)


class NodeHealthSerializer(serializers.ModelSerializer):
    """A node and its agent's health: state up, draining, drained, down, or no_agent (no agent ever
    reported from it), since when, and why."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    state = serializers.SerializerMethodField()
    reason = serializers.SerializerMethodField()
    since = serializers.SerializerMethodField(help_text="When the state last changed (null: never).")
    last_seen = serializers.SerializerMethodField()
    version = serializers.SerializerMethodField()
    unhealthy_gpus = serializers.SerializerMethodField()
    running = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "cluster",
            "cluster_name",
            "state",
            "reason",
            "since",
            "last_seen",
            "version",
            "unhealthy_gpus",
            "running",
        ]

    @staticmethod
    def _agent(node: Node) -> NodeHealth | None:
        try:
            return node.agent
        except NodeHealth.DoesNotExist:
            return None

    @extend_schema_field(serializers.ChoiceField(choices=SHOWN_NODE_STATES))
    def get_state(self, node: Node) -> str:
        return shown_state(self._agent(node))

    def get_since(self, node: Node) -> datetime | None:
        agent = self._agent(node)
        return agent.state_since if agent else None

    def get_reason(self, node: Node) -> str:
        agent = self._agent(node)
        return agent.reason if agent else ""

    def get_last_seen(self, node: Node) -> datetime | None:
        agent = self._agent(node)
        return agent.last_seen if agent else None

    def get_version(self, node: Node) -> str:
        agent = self._agent(node)
        return agent.version if agent else ""

    def get_unhealthy_gpus(self, node: Node) -> list:
        agent = self._agent(node)
        return agent.unhealthy_gpus if agent else []

    def get_running(self, node: Node) -> int:
        agent = self._agent(node)
        return agent.running if agent else 0


class RankRunSerializer(serializers.ModelSerializer):
    """A rank process: where it ran, its state, exit code, why it exited (`exit_cause`, null while
    it runs: `exited` is its own exit; lost, fenced, stopped and node_down are not the job's
    fault; pids_limit and memory_limit are its limits; refused: never started) and output tail."""

    node = serializers.CharField(source="node.name", read_only=True)
    exit_cause = serializers.SerializerMethodField()

    @extend_schema_field(serializers.ChoiceField(choices=ExitCause.choices, allow_null=True))
    def get_exit_cause(self, run: RankRun) -> str | None:
        return run.exit_cause or None if run.state == RankState.EXITED else None

    class Meta:
        model = RankRun
        fields = [
            "generation",
            "rank",
            "node",
            "state",
            "pid",
            "exit_code",
            "exit_cause",
            "started_at",
            "exited_at",
            "log_tail",
        ]
