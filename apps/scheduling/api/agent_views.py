"""REST views of the launch loop: the node agents' sync (heartbeat, reports, work long-poll),
node health (list, drain, resume) and job logs. Views validate and translate; writes are
services in `agents`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api import roles
from apps.api.authentication import node_token_of
from apps.api.parsers import parse_spec_body
from apps.api.permissions import holds
from apps.api.throttling import NodeSyncThrottle
from apps.api.validation import int_param
from apps.placement.topology import SpecLimits
from apps.topology.models import Node
from apps.topology.retry import retry_when_locked

from .. import agents, selectors
from ..agent_selectors import node_state_q, node_work, sync_node
from ..choices import NODE_STATE_FILTERS
from ..models import RankRun
from ..wakeups import epoch, wait_for_change
from .agent_serializers import (
    AgentSyncSerializer,
    DrainSerializer,
    NodeHealthSerializer,
    RankRunSerializer,
    split_logs,
    split_reports,
)
from .authentication import AUTHENTICATION, NodeAuthentication

MAX_WAIT_S = 60.0
# A sync body: at most MAX_REPORTS reports of a few kB of output each (see topoweb/bodylimits.py).
AGENT_SYNC_LIMITS = SpecLimits(max_bytes=4 * 1024 * 1024, max_nodes=200_000)


def _clean_reports(data: Any) -> Any:
    """Rank output as the database can store it, before the NUL check of the validation layer:
    whatever bytes a rank wrote, its report is stored (see `agents.clean_text`)."""
    if not isinstance(data, dict):
        return data
    for field, text in (("reports", "log_tail"), ("logs", "data")):
        if isinstance(data.get(field), list):
            for item in data[field]:
                if isinstance(item, dict) and isinstance(item.get(text), str):
                    item[text] = agents.clean_text(item[text])
    return data


class AgentSyncParser(BaseParser):
    """The agent sync's JSON body: bounded like every body; report output is cleaned, not refused."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_spec_body(stream, parser_context, json_only=True, clean=_clean_reports)


class IsNodeAgent(BasePermission):
    """Only a node token (a node agent's own credential)."""

    message = "Agent calls need the node's token: 'Authorization: Node <key>' (manage.py create_node_token)."

    def has_permission(self, request, view) -> bool:
        return node_token_of(request) is not None


class AgentSyncView(APIView):
    """One round trip of a node agent: heartbeat, rank reports, then the node's work."""

    authentication_classes = [NodeAuthentication]
    permission_classes = [IsNodeAgent]
    parser_classes = [AgentSyncParser]
    # A long-poll (up to TOPOWEB_AGENT_POLL_S): outside the per-process API write slots, which it
    # would hold while waiting (topoweb.middleware.WriteSlotsMiddleware).
    write_slot = False
    spec_limits = AGENT_SYNC_LIMITS
    # Per node, never per address: per-IP throttling would cut a rack behind one NAT off.
    throttle_classes = [NodeSyncThrottle]

    @extend_schema(
        summary="Agent: heartbeat, report rank starts and exits, long-poll the node's work",
        request=AgentSyncSerializer,
        responses={200: dict, 400: dict, 403: dict},
    )
    def post(self, request: Request) -> Response:
        """Record the heartbeat and the valid reports (the answer's `refused` lists the others and
        why), then answer the node's work and `stop`, the ranks it must stop (or report gone)
        although no work lists them; when nothing changed for the agent (no reports, it
        runs exactly its work) wait up to `wait_s` for a change. The credential's node is the
        only node this answers for: another `node` in the body, or a report about a rank placed
        on another node, is refused with 403 and nothing is recorded."""
        body = AgentSyncSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        token = node_token_of(request)
        name = data.get("node", token.node.name)
        if name != token.node.name:
            return Response(
                {
                    "detail": f"this credential is node {token.node.name!r}'s; it cannot sync for node {name!r}"
                },
                status=status.HTTP_403_FORBIDDEN,
            )
        node, known = sync_node(cluster_id=token.node.cluster_id, name=name)
        if node is None or node.pk != token.node_id:
            return Response(
                {"detail": "the credential's node no longer exists"}, status=status.HTTP_403_FORBIDDEN
            )
        reports, refused = split_reports(data["reports"])
        chunks, refused_logs = split_logs(data["logs"])
        foreign, unknown = agents.report_scope(node=node, reports=[*reports, *chunks])
        if foreign:
            job, generation, rank = sorted(foreign)[0]
            return Response(
                {
                    "detail": f"rank {rank} of job {job} generation {generation} is not placed on node "
                    f"{node.name!r}: a node reports only its own ranks"
                },
                status=status.HTTP_403_FORBIDDEN,
            )
        since = epoch(node.cluster_id, node.name)
        beat = body.heartbeat()
        # Both writes are safe to repeat: on the embedded SQLite they retry a lost write lock.
        agent = retry_when_locked(
            lambda: agents.agent_heartbeat(node=node, beat=beat, agent=known), what="agent heartbeat"
        )
        if unknown:
            refused += [
                {**_key(r), "reason": "no such rank was ever placed (its job may have been deleted)"}
                for r in reports
                if (r.job, r.generation, r.rank) in unknown
            ]
            reports = [r for r in reports if (r.job, r.generation, r.rank) not in unknown]
        if reports:
            stored = retry_when_locked(
                lambda: agents.agent_report(node=node, reports=reports), what="agent report"
            )
            refused += [{**_key(r), "reason": why} for r, why in stored]
        logs: dict[str, int] = {}
        if chunks:
            refused_logs += [
                {**_chunk_key(c), "reason": "no such rank was ever placed (its job may have been deleted)"}
                for c in chunks
                if (c.job, c.generation, c.rank) in unknown
            ]
            chunks = [c for c in chunks if (c.job, c.generation, c.rank) not in unknown]
            logs, not_stored = retry_when_locked(
                lambda: agents.agent_logs(node=node, chunks=chunks), what="agent logs"
            )
            refused_logs += [{**_chunk_key(c), "reason": why} for c, why in not_stored]
        work, stops = node_work(node=node)
        # The server bounds the wait (its own poll interval), whatever the agent asks for.
        wait_s = min(data["wait_s"], float(settings.TOPOWEB_AGENT_POLL_S), MAX_WAIT_S)
        running = {tuple(k) for k in data["running"]}
        # Ranks to stop that the agent is not stopping yet (or has no trace of): answer at once.
        unheeded = {tuple(k) for k in stops} - {tuple(k) for k in data["stopping"]}
        if (
            wait_s > 0
            and not data["reports"]
            and not data["logs"]
            and running == _keys(work)
            and not unheeded
        ):
            if not connection.in_atomic_block:
                # A waiting poll holds no database connection: thousands of agents wait at once.
                connection.close()
            if wait_for_change(node.cluster_id, node.name, since, wait_s):
                work, stops = node_work(node=node)
        return Response(
            {
                "node": node.name,
                "state": agent.state,
                "reason": agent.reason,
                "poll_s": float(settings.TOPOWEB_AGENT_POLL_S),
                "down_after_s": agents.down_after_s(),
                "refused": refused,
                "fence_after_s": agents.fence_after_s(),
                "logs": logs,
                "refused_logs": refused_logs,
                "work": work,
                "stop": stops,
            }
        )


def _chunk_key(c: agents.LogChunk) -> dict[str, Any]:
    return {"job": c.job, "generation": c.generation, "rank": c.rank, "offset": c.offset}


def _key(r: agents.RankReport) -> dict[str, Any]:
    return {"job": r.job, "generation": r.generation, "rank": r.rank, "event": r.event}


def _keys(work) -> set[tuple[int, int, int]]:
    return {(w["job"], w["generation"], r["rank"]) for w in work for r in w["ranks"]}


class NodeHealthViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Every node with its agent's health; staff drain and resume nodes."""

    authentication_classes = AUTHENTICATION[:2]
    permission_classes = [IsAuthenticated]
    serializer_class = NodeHealthSerializer
    queryset = Node.objects.none()

    def get_queryset(self):
        nodes = Node.objects.select_related("cluster", "agent").order_by("cluster_id", "position", "id")
        cluster = self.request.query_params.get("cluster")
        if cluster:
            nodes = (
                nodes.filter(cluster__name=cluster)
                if not cluster.isdigit()
                else nodes.filter(cluster_id=cluster)
            )
        name = self.request.query_params.get("node")
        if name:
            nodes = nodes.filter(name=name)
        state = self.request.query_params.get("state")
        if state:
            if state not in NODE_STATE_FILTERS:
                raise ValidationError({"state": [f"one of {', '.join(NODE_STATE_FILTERS)}"]})
            nodes = nodes.filter(node_state_q(state))
        return nodes

    @extend_schema(
        parameters=[
            OpenApiParameter("cluster", str, required=False, description="cluster name or id"),
            OpenApiParameter("node", str, required=False, description="node name"),
            OpenApiParameter("state", str, required=False, enum=list(NODE_STATE_FILTERS)),
        ]
    )
    def list(self, request: Request, *args, **kwargs) -> Response:
        """Nodes with their state, reason and since when (?cluster=, ?node=, ?state=)."""
        return super().list(request, *args, **kwargs)

    @extend_schema(
        summary="Drain a node: no new placements, running jobs finish, then drained",
        request=DrainSerializer,
        responses={200: NodeHealthSerializer},
    )
    @action(detail=True, methods=["post"], permission_classes=[holds(roles.MANAGE_NODES)])
    def drain(self, request: Request, pk=None) -> Response:
        """Drain the node with a reason."""
        node = self.get_object()
        body = DrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        agents.node_drain(node=node, reason=body.validated_data["reason"])
        return Response(NodeHealthSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(summary="Resume a drained node", request=None, responses={200: NodeHealthSerializer})
    @action(detail=True, methods=["post"], permission_classes=[holds(roles.MANAGE_NODES)])
    def resume(self, request: Request, pk=None) -> Response:
        """Return the node to service and clear its unhealthy GPUs."""
        node = self.get_object()
        agents.node_resume(node=node)
        return Response(NodeHealthSerializer(self.get_queryset().get(pk=node.pk)).data)


class JobLogsView(APIView):
    """The tail of each rank's output, as its agent shipped it."""

    authentication_classes = AUTHENTICATION[:2]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        summary="Each rank's output tail (current generation unless ?generation=)",
        parameters=[
            OpenApiParameter("generation", int, required=False),
            OpenApiParameter("rank", int, required=False),
        ],
        responses={200: RankRunSerializer(many=True)},
    )
    def get(self, request: Request, pk: int) -> Response:
        """The job's rank runs with their state, exit code and output tail."""
        jobs = selectors.jobs_visible_to(user=request.user)
        job = get_object_or_404(jobs, pk=pk)
        runs = RankRun.objects.filter(job=job).select_related("node").order_by("generation", "rank")
        for name in ("generation", "rank"):
            text = request.query_params.get(name)
            if text is None:
                continue
            if not text.isdigit() or len(text) > 9:
                return Response({name: [f"must be a whole number, got {text!r}"]}, status=400)
            runs = runs.filter(**{name: int(text)})
        if "generation" not in request.query_params:
            runs = runs.filter(generation=job.generation)
        return Response(RankRunSerializer(runs[:4096], many=True).data)


class RankLogView(APIView):
    """A rank's whole output as its agent shipped it, a page at a time."""

    authentication_classes = AUTHENTICATION[:2]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        summary="One rank's whole output, paged by byte offset (current generation unless ?generation=)",
        parameters=[
            OpenApiParameter("generation", int, required=False),
            OpenApiParameter(
                "offset", int, required=False, description="a previous page's next_offset (default 0)"
            ),
            OpenApiParameter(
                "limit",
                int,
                required=False,
                description="about this many bytes (default 256 KiB, at most 4 MiB)",
            ),
        ],
        responses={200: dict},
    )
    def get(self, request: Request, pk: int, rank: int) -> Response:
        """{"offset", "next_offset", "size" (bytes stored), "more", "cut" (the server's limit was
        reached), "text"}; read on from `next_offset` while `more`."""
        jobs = selectors.jobs_visible_to(user=request.user)
        job = get_object_or_404(jobs, pk=pk)
        params = request.query_params
        generation = int_param(
            params.get("generation"), field="generation", low=1, high=2**31 - 1, default=job.generation
        )
        offset = int_param(params.get("offset"), field="offset", low=0, high=2**62, default=0)
        limit = int_param(params.get("limit"), field="limit", low=1, high=4 * 1024 * 1024, default=256 * 1024)
        run = get_object_or_404(
            RankRun.objects.select_related("node"), job=job, generation=generation, rank=rank
        )
        page = agents.rank_log_page(run=run, offset=offset, limit=limit)
        return Response(
            {
                "job": job.pk,
                "generation": generation,
                "rank": rank,
                "node": run.node.name,
                "state": run.state,
                **page,
            }
        )
