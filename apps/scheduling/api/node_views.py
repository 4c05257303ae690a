"""REST views of node health (list, drain, resume) and of the ranks' output (tails and whole
logs). Views validate and translate; writes are services in `nodes`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api import roles
from apps.api.permissions import holds
from apps.api.schemas import STATE_ERROR_RESPONSE
from apps.api.validation import int_param
from apps.topology.models import Node

from .. import executor, nodes, selectors
from ..choices import NODE_STATE_FILTERS
from ..models import RankRun
from ..nodes import node_state_q
from .authentication import AUTHENTICATION
from .node_serializers import (
    DrainSerializer,
    NodeHealthSerializer,
    RankRunSerializer,
)


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
        responses={200: NodeHealthSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"], permission_classes=[holds(roles.MANAGE_NODES)])
    def drain(self, request: Request, pk=None) -> Response:
        """Drain the node with a reason."""
        node = self.get_object()
        body = DrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            nodes.node_drain(node=node, reason=body.validated_data["reason"])
        except executor.Refused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(NodeHealthSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(
        summary="Resume a drained node",
        request=None,
        responses={200: NodeHealthSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"], permission_classes=[holds(roles.MANAGE_NODES)])
    def resume(self, request: Request, pk=None) -> Response:
        """Return the node to service and clear its unhealthy GPUs."""
        node = self.get_object()
        try:
            nodes.node_resume(node=node)
        except executor.Refused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
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
        page = selectors.rank_log_page(run=run, offset=offset, limit=limit)
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
