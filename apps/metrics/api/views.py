"""Metrics REST views: GPU values, node scrape states, per-job measures, and the job report.

Views validate and translate; reads go through selectors, the report through a service.
"""

from __future__ import annotations

from datetime import UTC, timedelta

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import ValidationError as ApiValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api import roles
from apps.api.authentication import launcher_of, node_token_of
from apps.api.pagination import StandardPagination
from apps.scheduling import selectors as scheduling
from apps.scheduling.api.authentication import AUTHENTICATION, NodeAuthentication
from apps.scheduling.api.filters import NamedFilterBackend
from apps.scheduling.choices import JobStatus

from .. import selectors
from ..services import RAW_RETENTION_S, ROLLUP_RETENTION_S, job_report_record
from .filters import GPU_FILTERS, GpuMetricsFilter, NodeScrapeFilter
from .serializers import (
    GpuRollupSerializer,
    GpuValuesSerializer,
    JobMetricsSerializer,
    JobReportSerializer,
    NodeScrapeSerializer,
)

SINCE = OpenApiParameter(
    "since",
    OpenApiTypes.DATETIME,
    description="ISO 8601 time: return the samples since then (raw kept an hour) instead of the latest values",
    required=False,
)
RESOLUTION = OpenApiParameter(
    "resolution",
    str,
    enum=["raw", "minute"],
    description="with `since`: raw samples or 1-minute means (kept a day)",
)


def since_param(request: Request, *, max_age_s: float):
    """The `since` query parameter as an aware datetime (400 naming it when malformed or older
    than what is kept), or None."""
    raw = request.query_params.get("since")
    if raw is None:
        return None
    parsed = parse_datetime(raw) if len(raw) <= 40 else None
    if parsed is None:
        raise ApiValidationError({"since": [f"not an ISO 8601 date-time: {raw[:40]!r}"]})
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=UTC)  # a time without offset is UTC
    oldest = timezone.now() - timedelta(seconds=max_age_s)
    return max(parsed, oldest)


class Authenticated:
    authentication_classes = AUTHENTICATION
    permission_classes = [IsAuthenticated]


@extend_schema(
    summary="GPU metrics: latest values per GPU and MIG instance, or samples since a time",
    parameters=[SINCE, RESOLUTION],
)
class GpuMetricsView(Authenticated, generics.ListAPIView):
    """Fractions 0..1, byte rates in bytes/s, power in W, temperature in C; null = not sent."""

    filter_backends = [NamedFilterBackend]
    pagination_class = StandardPagination
    serializer_class = GpuValuesSerializer

    @property
    def filterset_class(self):
        # Latest values, raw samples and rollups are three tables with the same filters.
        queryset = getattr(self, "_queryset", None)
        return GPU_FILTERS[queryset.model] if queryset is not None else GpuMetricsFilter

    def _minute(self) -> bool:
        value = self.request.query_params.get("resolution", "raw")
        if value not in ("raw", "minute"):
            raise ApiValidationError({"resolution": [f"one of raw, minute; got {value[:20]!r}"]})
        return value == "minute"

    def get_serializer_class(self):
        return (
            GpuRollupSerializer
            if self.request.query_params.get("resolution") == "minute"
            else GpuValuesSerializer
        )

    def get_queryset(self):
        minute = self._minute()
        since = since_param(self.request, max_age_s=ROLLUP_RETENTION_S if minute else RAW_RETENTION_S)
        qs = selectors.gpu_latest() if since is None else selectors.gpu_history(since=since, minute=minute)
        self._queryset = qs
        return qs


@extend_schema(summary="Each node's collection state (ok / stale / error), last error and last success")
class NodeScrapeListView(Authenticated, generics.ListAPIView):
    filter_backends = [NamedFilterBackend]
    filterset_class = NodeScrapeFilter
    pagination_class = StandardPagination
    serializer_class = NodeScrapeSerializer

    def get_queryset(self):
        return selectors.node_scrapes()


def visible_job(request: Request, pk: int):
    """The job if the caller may see it (owner, staff, its cluster's launcher), else 404."""
    jobs = scheduling.jobs_visible_to(user=request.user, launcher=launcher_of(request))
    return get_object_or_404(jobs, pk=pk)


class JobMetricsView(APIView):
    """Measured MFU beside GPU utilisation (each labelled report or estimate), comm share, the
    series with the predictions, the newest report and open hotspots."""

    authentication_classes = AUTHENTICATION
    permission_classes = []

    @extend_schema(
        summary="A job's measures against its predictions", parameters=[SINCE], responses=JobMetricsSerializer
    )
    def get(self, request: Request, pk: int) -> Response:
        if not request.user.is_authenticated and launcher_of(request) is None:
            return Response({"detail": "Authentication credentials were not provided."}, status=401)
        job = visible_job(request, pk)
        since = since_param(request, max_age_s=365 * 86400)
        series = selectors.job_series(job=job, since=since)
        body = {
            "job": job.pk,
            "status": job.status,
            "latest": series[-1] if series else None,
            "aggregate": selectors.job_aggregate(job=job),
            "series": series,
            "report": selectors.job_latest_report(job=job),
            "hotspots": list(selectors.open_hotspots(job=job)),
        }
        return Response(JobMetricsSerializer(body).data)


class JobReportView(APIView):
    """`POST /api/v1/jobs/{id}/report/` from the training loop: step time and optionally tokens,
    achieved FLOPs, comm time. Only the job's owner may report (its token or session), or the node
    agent of a node running one of its ranks (its node token); an operator may report in the
    owner's place, and each such override is recorded in the admin's log. Anyone else who sees
    the job (viewers, launchers) gets a 403; those who do not, a 404."""

    authentication_classes = [*AUTHENTICATION, NodeAuthentication]
    permission_classes = []

    @extend_schema(
        summary="Report a running job's own step time (and tokens, FLOPs, comm time)",
        request=JobReportSerializer,
        responses={
            201: JobReportSerializer,
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="Each bad field and its messages"),
            403: OpenApiResponse(OpenApiTypes.OBJECT, description="Not the owner, its node or an operator"),
            409: OpenApiResponse(OpenApiTypes.OBJECT, description="The job is not running"),
        },
    )
    def post(self, request: Request, pk: int) -> Response:
        node = node_token_of(request)
        override = False
        if node is not None:
            job = get_object_or_404(scheduling.jobs_on_node(node=node.node), pk=pk)
        elif not request.user.is_authenticated and launcher_of(request) is None:
            return Response({"detail": "Authentication credentials were not provided."}, status=401)
        else:
            job = visible_job(request, pk)
            if job.owner_id != request.user.pk:
                if not roles.can(request.user, roles.MANAGE_JOBS):
                    return Response(
                        {
                            "detail": f"only the owner of job {job.pk} or the node running it may report its"
                            " metrics; operators may report in its place (recorded)"
                        },
                        status=status.HTTP_403_FORBIDDEN,
                    )
                override = True
        serializer = JobReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if job.status != JobStatus.RUNNING:
            return Response(
                {"detail": f"job {job.pk} is {job.status}, not running", "status": job.status},
                status=status.HTTP_409_CONFLICT,
            )
        try:
            report = job_report_record(
                job=job, **serializer.validated_data, override_by=request.user if override else None
            )
        except ValidationError as exc:
            return Response(exc.message_dict, status=status.HTTP_400_BAD_REQUEST)
        return Response(JobReportSerializer(report).data, status=status.HTTP_201_CREATED)
