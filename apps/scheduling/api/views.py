"""Scheduling REST views: jobs, lifecycle, placement, rank maps, preview, migrations, cycles, and
GPUs with the job and rank holding each.

Views validate and translate; every write is a service call.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.filters import OrderingFilter
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api import roles
from apps.api.authentication import launcher_of
from apps.api.pagination import Rows, StandardPagination
from apps.api.parsers import JOB_PARSERS, SPEC_PARSERS
from apps.api.permissions import JobPermission, LauncherTokenPermission, ModelPermissions, holds
from apps.api.renderers import (
    OpenMpiRankfileRenderer,
    SlurmHostfileRenderer,
    SlurmScriptRenderer,
    TorchrunRenderer,
)
from apps.api.schemas import FIELD_ERRORS_RESPONSE, STATE_ERROR_RESPONSE
from apps.api.schemas import STATE_ERROR as STATE_ERROR_BODY
from apps.api.throttling import CallerRateThrottle, CountsWindowsTogether, ScopedCallerThrottle
from apps.api.validation import field_error, int_param, object_body
from apps.api.writeslots import after_write_slot
from apps.placement.topology import JOB_LIMITS
from apps.topology.models import Gpu
from topoweb.compiled import compiled_once

from .. import accounts, rankmaps, selectors, services
from ..account_models import DEFAULT_QOS
from ..choices import ProposalStatus
from ..cycle import cycles_run_inline, requests_deferred
from ..models import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    AccountMembership,
    Allocation,
    Job,
    MigrationProposal,
    Qos,
    SchedulingCycle,
)
from ..proposals import ProposalStateError
from ..selectors import generation_master_port
from .authentication import AUTHENTICATION
from .filters import GpuFilter, JobFilter, MigrationProposalFilter, NamedFilterBackend, SchedulingCycleFilter
from .schemas import JobSpecV1Schema, PlacementOutputSchema, PlacementPreviewSchema, spec_body
from .serializers import (
    DETAIL_RELATED_COLUMNS,
    JOB_COLUMNS,
    LIST_COLUMNS,
    LIST_ROW_COLUMNS,
    GpuSerializer,
    JobFailSerializer,
    JobListSerializer,
    JobSerializer,
    MembershipSerializer,
    MigrationProposalSerializer,
    PrioritySerializer,
    QosSerializer,
    SchedulingCycleSerializer,
    job_list_row,
)

SPEC_BODY = spec_body(JobSpecV1Schema)
SPEC_ERRORS = FIELD_ERRORS_RESPONSE
NOT_PLACED = OpenApiResponse(
    {**STATE_ERROR_BODY, "required": ["detail"]},
    description="No such job, or not placed (yet): then with the job's status, and why in `detail`.",
)
CLUSTER_PARAM = OpenApiParameter(
    "cluster", str, description="Cluster name or id; defaults to the spec's `cluster` field", required=False
)


IDEMPOTENCY_KEY_PARAM = OpenApiParameter(
    "Idempotency-Key",
    str,
    location=OpenApiParameter.HEADER,
    required=False,
    description="1-128 printable ASCII characters, unique per user: a retried POST returns the first job",
)
IDEMPOTENCY_CONFLICT = OpenApiResponse(
    OpenApiTypes.OBJECT, description="The Idempotency-Key was first used with another body or cluster."
)
QUEUED_CAP = OpenApiResponse(
    {
        "type": "object",
        "properties": {
            "detail": {"type": "string"},
            "limit": {"type": "string", "description": "the cap's name, e.g. TOPOWEB_MAX_QUEUED_PER_USER"},
            "value": {"type": "integer", "description": "most waiting (queued or preempted) jobs it allows"},
            "queued": {"type": "integer", "description": "the jobs it counts waiting now"},
        },
        "required": ["detail", "limit", "value", "queued"],
    },
    description=(
        "Over a cap on waiting jobs: nothing was queued. Not a 429: waiting does not help until"
        " some of the jobs it counts start or are cancelled, so a client must not retry by itself."
    ),
)
IDEMPOTENCY_KEY = re.compile(rf"[\x21-\x7e]{{1,{IDEMPOTENCY_KEY_MAX_LENGTH}}}")


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key header, None without one; a 400 naming it if malformed."""
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if key is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise field_error(
            "Idempotency-Key", f"must be 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} printable ASCII characters"
        )
    return key


def over_queued_cap(exc: services.QueuedCapExceeded) -> Response:
    """A 409 naming the cap on waiting jobs, its value and how many it counts now."""
    body = {"detail": str(exc), "limit": exc.limit, "value": exc.value, "queued": exc.queued}
    return Response(body, status=status.HTTP_409_CONFLICT)


def state_error(exc: Exception, current: str) -> Response:
    """A 409 saying why the current status forbids the action."""
    return Response({"detail": str(exc), "status": current}, status=status.HTTP_409_CONFLICT)


@extend_schema_view(
    list=extend_schema(
        summary="Jobs you may see (yours; all for viewers, operators, admins; the cluster's for a launcher)",
        description="Each job without its spec, per-group predicted block and flows: GET the job for those.",
    ),
    retrieve=extend_schema(summary="One job with its spec and predicted costs"),
)
class JobViewSet(
    CountsWindowsTogether, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Submit job specs v1, follow them through the queue, and report their lifecycle."""

    authentication_classes = AUTHENTICATION
    permission_classes = [LauncherTokenPermission | JobPermission]
    parser_classes = JOB_PARSERS
    spec_limits = JOB_LIMITS
    filter_backends = [NamedFilterBackend, OrderingFilter]
    filterset_class = JobFilter
    ordering_fields = ["submitted_at", "priority", "id", "placed_at", "gpus"]
    ordering = ["-submitted_at", "-id"]
    pagination_class = StandardPagination
    throttle_classes = [CallerRateThrottle, ScopedCallerThrottle]
    queryset = Job.objects.none()

    @staticmethod
    def coordinates(user, job: Job) -> bool:
        """Whether `user` coordinates `job`'s account (JobPermission asks)."""
        return selectors.coordinates(user, job.account_id)

    def get_queryset(self):
        # Compiled once per shape: compiling a job's SQL was most of a list's or detail's CPU.
        jobs = compiled_once(
            selectors.jobs_visible_to(user=self.request.user, launcher=launcher_of(self.request))
        )
        # The detail names the job's account and QOS: joined, not read one query each.
        if self.action == "list":
            return jobs.only(*LIST_COLUMNS)
        jobs = jobs.select_related("account", "qos")
        if self.action == "retrieve":
            # The detail names the job's cluster, owner, account and QOS: of their rows, only that.
            return jobs.only(*JOB_COLUMNS, *DETAIL_RELATED_COLUMNS)
        return jobs

    serializer_class = JobSerializer

    def get_serializer_class(self):
        return JobListSerializer if self.action == "list" else JobSerializer

    def get_throttles(self):
        # Only submissions count against the "submit" scope.
        self.throttle_scope = "submit" if self.action == "create" else ""
        return super().get_throttles()

    @extend_schema(
        summary="Submit a job spec v1 (JSON or YAML)",
        description=(
            "With an `Idempotency-Key` header (1-128 printable ASCII characters, unique per user), a"
            " retry of the same body returns the job the first request created (again 201, with"
            " `Idempotent-Replayed: true`) instead of a duplicate; the same key with another body"
            " or cluster is a 422."
        ),
        request=SPEC_BODY,
        parameters=[CLUSTER_PARAM, IDEMPOTENCY_KEY_PARAM],
        responses={201: JobSerializer, 400: SPEC_ERRORS, 409: QUEUED_CAP, 422: IDEMPOTENCY_CONFLICT},
    )
    def create(self, request: Request) -> Response:
        """Validate and queue a job spec v1; 201 with the job (already placed when the cycle ran
        in this process, queued when a worker runs it). A list of specs is a bulk submission."""
        if isinstance(request.data, list):
            return self._bulk(request)
        data = object_body(request)
        key = idempotency_key(request)
        name = request.query_params.get("cluster")
        cluster = selectors.cluster_for_spec(spec=data, name=name) if name else None
        replayed = False
        # The cycle request (a round trip to the cache, now and then one to the broker) is sent
        # once this request's write slot is free, before the response goes out.
        try:
            with requests_deferred(lambda send: after_write_slot(request, send)):
                if key is None:
                    job = services.job_submit(user=request.user, spec=data, cluster=cluster)
                else:
                    job, replayed = services.job_submit_once(
                        user=request.user, spec=data, cluster=cluster, idempotency_key=key
                    )
        except services.IdempotencyConflict as exc:
            return Response(
                {"Idempotency-Key": [str(exc)], "job": exc.job.pk},
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        except services.QueuedCapExceeded as exc:
            return over_queued_cap(exc)
        if cycles_run_inline():
            # The cycle ran on commit in this process and may have placed it: re-read (one query).
            job = self.get_queryset().get(pk=job.pk)
        body = JobSerializer(job, context=self.get_serializer_context()).data
        headers = {"Location": f"{request.path}{job.pk}/"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response(body, status=status.HTTP_201_CREATED, headers=headers)

    def _bulk(self, request: Request) -> Response:
        """All the list's job specs queued, or none (400 naming `[i].field`); 201 with the jobs."""
        specs = request.data
        most = settings.BULK_MAX_JOBS
        if not 1 <= len(specs) <= most:
            raise field_error("", f"a bulk submission has 1 to {most} job specs, got {len(specs)}")
        if idempotency_key(request) is not None:
            raise field_error(
                "Idempotency-Key", "not supported on a bulk submission: it is all or nothing already"
            )
        name = request.query_params.get("cluster")
        cluster = selectors.cluster_for_spec(spec={}, name=name) if name else None
        try:
            with requests_deferred(lambda send: after_write_slot(request, send)):
                jobs = services.job_submit_many(user=request.user, specs=specs, cluster=cluster)
        except services.QueuedCapExceeded as exc:
            return over_queued_cap(exc)
        if cycles_run_inline():
            jobs = list(self.get_queryset().filter(pk__in=[j.pk for j in jobs]).order_by("pk"))
        context = self.get_serializer_context()
        return Response(
            {"count": len(jobs), "results": [JobSerializer(j, context=context).data for j in jobs]},
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        summary="Cancel a job and free its GPUs",
        request=None,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk=None) -> Response:
        """Cancel the job and release its GPUs."""
        user = request.user if request.user.is_authenticated else None
        return self._manage(lambda job: services.job_cancel(job=job, user=user))

    @extend_schema(
        summary="Hold a waiting job: it stays queued but is not placed until released (operators, its account's coordinators)",
        request=None,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk=None) -> Response:
        """Hold the queued or preempted job."""
        return self._manage(lambda job: services.job_hold(job=job, user=request.user))

    @extend_schema(
        summary="Release a held job (operators, its account's coordinators)",
        request=None,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk=None) -> Response:
        """Release the held job: the next cycle may place it."""
        return self._manage(lambda job: services.job_release(job=job, user=request.user))

    @extend_schema(
        summary="Send a placing or running job back to the queue (operators, its account's coordinators)",
        request=None,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def requeue(self, request: Request, pk=None) -> Response:
        """Stop the job's ranks and queue it again (it keeps its submission time)."""
        return self._manage(lambda job: services.job_requeue(job=job, user=request.user))

    def _manage(self, service) -> Response:
        """Apply `service` to the job (a JobStateError is a 409) and answer the job as it is now."""
        job = self.get_object()
        try:
            job = service(job)
        except services.JobStateError as exc:
            return state_error(exc, exc.job.status)
        return Response(
            JobSerializer(self.get_queryset().get(pk=job.pk), context=self.get_serializer_context()).data
        )

    @extend_schema(
        summary="Launcher: the job started",
        request=None,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk=None) -> Response:
        """The launcher started the placed job (placing -> running)."""
        return self._manage(lambda job: services.job_start(job=job))

    @extend_schema(
        summary="Launcher: the job completed (GPUs released)",
        request=None,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def complete(self, request: Request, pk=None) -> Response:
        """The job finished; its GPUs go back to the queue."""
        return self._manage(lambda job: services.job_complete(job=job))

    @extend_schema(
        summary="Launcher: the job failed (GPUs released)",
        request=JobFailSerializer,
        responses={200: JobSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"])
    def fail(self, request: Request, pk=None) -> Response:
        """The job failed (optional `reason`); its GPUs go back to the queue."""
        body = JobFailSerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        reason = body.validated_data.get("reason", "")
        return self._manage(lambda job: services.job_fail(job=job, reason=reason))

    @extend_schema(
        summary="The job's placement (placement output format with predicted per-group costs)",
        responses={200: PlacementOutputSchema, 404: NOT_PLACED},
    )
    @action(detail=True, methods=["get"])
    def placement(self, request: Request, pk=None) -> Response:
        """The placement output of the job: ranks and predicted per-group costs."""
        job = self.get_object()
        out = selectors.job_placement(job=job)
        if out is None:
            return Response(_not_placed(job), status=status.HTTP_404_NOT_FOUND)
        return Response(out)

    @extend_schema(
        summary="Rank map for launchers",
        parameters=[
            OpenApiParameter("format", str, enum=list(rankmaps.FORMATS), description="default json"),
            OpenApiParameter("entrypoint", str, description="the training script (default train.py)"),
            OpenApiParameter(
                "master_port",
                int,
                description="rendezvous port (default: the generation's, as the node agents give it)",
            ),
        ],
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "text/plain"): OpenApiTypes.STR,
            (200, "text/x-shellscript"): OpenApiTypes.STR,
            404: NOT_PLACED,
        },
    )
    @action(
        detail=True,
        methods=["get"],
        renderer_classes=[
            JSONRenderer,
            OpenMpiRankfileRenderer,
            SlurmScriptRenderer,
            SlurmHostfileRenderer,
            TorchrunRenderer,
        ],
    )
    def rankmap(self, request: Request, pk=None) -> Response:
        """The rank map as ?format=openmpi (appfile), slurm (script), slurm-hostfile, torchrun or json."""
        job = self.get_object()
        ranks = selectors.job_ranks(job=job)
        if not ranks:
            return Response(_not_placed(job), status=status.HTTP_404_NOT_FOUND)
        # The port the node agents give the ranks, unless the caller launches with another.
        port = int_param(
            request.query_params.get("master_port"),
            field="master_port",
            low=1,
            high=65535,
            default=generation_master_port(job.pk, job.generation),
        )
        # The address the executors give the ranks (the node's recorded address, else its name).
        addr = selectors.job_master_addr(job=job, ranks=ranks)
        fmt = request.accepted_renderer.format
        entry = request.query_params.get("entrypoint", "train.py")
        if len(entry) > 1024 or "\x00" in entry:
            return Response({"entrypoint": ["must be at most 1024 characters, without NUL"]}, status=400)
        if fmt == "openmpi":
            return Response(
                rankmaps.openmpi_appfile(ranks, entrypoint=entry, master_port=port, master_addr=addr)
            )
        if fmt == "slurm":
            return Response(
                rankmaps.slurm_script(
                    ranks, entrypoint=entry, job=job.name, master_port=port, master_addr=addr
                )
            )
        if fmt == "slurm-hostfile":
            return Response(rankmaps.slurm_hostfile(ranks))
        if fmt == "torchrun":
            return Response(
                rankmaps.torchrun_commands(ranks, entrypoint=entry, master_port=port, master_addr=addr)
            )
        return Response(rankmaps.rankmap_json(ranks, job=job.name, master_port=port, master_addr=addr))

    @extend_schema(
        summary="The job's effective priority and its weighted terms",
        description=(
            "effective = requested + age + fair_share + qos, each term already weighted (see"
            " docs/accounts.md); the factors are the unweighted age (0 to 1, a week) and the account's"
            " fair-share factor (1 unused, 0.5 at its share, towards 0 beyond; without an account the lowest"
            " of 0.5 and every account's) and the QOS's priority."
        ),
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"])
    def priority(self, request: Request, pk=None) -> Response:
        """The effective priority of the job now, with its terms."""
        job = self.get_object()
        return Response(priority_body(job))

    @extend_schema(
        summary="Change an unfinished job's requested priority (operators, its account's coordinators)",
        description=(
            "Bounded as at submission: the job's account's `max_priority`, else"
            " TOPOWEB_MAX_PRIORITY_USER; operators up to TOPOWEB_MAX_PRIORITY_OPERATOR. Answers the"
            " effective priority as GET does."
        ),
        request=PrioritySerializer,
        responses={200: OpenApiTypes.OBJECT, 400: SPEC_ERRORS, 409: STATE_ERROR_RESPONSE},
    )
    @priority.mapping.post
    def priority_change(self, request: Request, pk=None) -> Response:
        """Set the job's requested priority."""
        job = self.get_object()
        body = PrioritySerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        try:
            job = services.job_set_priority(
                job=job, user=request.user, priority=body.validated_data["priority"]
            )
        except services.JobStateError as exc:
            return state_error(exc, exc.job.status)
        return Response(priority_body(job))

    # Last in the class body: above it, `list` names the builtin.
    def list(self, request: Request, *args, **kwargs) -> Response:
        # The page is read as rows and written as JobListSerializer would (`job_list_row`).
        rows = Rows(self.filter_queryset(self.get_queryset()), LIST_ROW_COLUMNS)
        page = self.paginate_queryset(rows)
        tz = timezone.get_current_timezone()
        if page is None:
            return Response([job_list_row(row, tz) for row in rows])
        return self.get_paginated_response([job_list_row(row, tz) for row in page])


def _not_placed(job: Job) -> dict:
    why = f": {job.pending_reason}" if job.pending_reason else ""
    return {"detail": f"job {job.pk} has no placement; it is {job.status}{why}", "status": job.status}


class PlacementPreviewView(APIView):
    """What every policy would do with a job spec on the GPUs free now; nothing is booked."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsAuthenticated]
    parser_classes = SPEC_PARSERS
    spec_limits = JOB_LIMITS

    @extend_schema(
        summary="Preview every policy's placement and the lower bound (nothing booked)",
        request=SPEC_BODY,
        parameters=[CLUSTER_PARAM],
        responses={200: PlacementPreviewSchema, 400: SPEC_ERRORS},
    )
    def post(self, request: Request) -> Response:
        """Every policy's placement of the posted spec on the free GPUs, and the lower bound."""
        data = object_body(request)
        cluster = selectors.cluster_for_spec(spec=data, name=request.query_params.get("cluster"))
        out = selectors.placement_preview(cluster=cluster, spec=data, username=request.user.get_username())
        return Response(out)


@extend_schema_view(
    list=extend_schema(summary="Migration proposals (yours; all for viewers, operators and admins)"),
    retrieve=extend_schema(summary="One migration proposal"),
)
class MigrationProposalViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Proposed moves of running jobs to better placements; operators apply or reject them."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsAuthenticated]
    serializer_class = MigrationProposalSerializer
    filter_backends = [NamedFilterBackend]
    filterset_class = MigrationProposalFilter
    pagination_class = StandardPagination
    queryset = MigrationProposal.objects.none()

    def get_queryset(self):
        return selectors.proposals_visible_to(user=self.request.user).order_by("-created_at", "-id")

    @extend_schema(
        summary="Apply a proposal: move the job's allocations if the target GPUs are still free",
        request=None,
        responses={
            200: MigrationProposalSerializer,
            409: OpenApiResponse(
                {"oneOf": [{"$ref": "#/components/schemas/MigrationProposal"}, STATE_ERROR_BODY]},
                description="Stale (the proposal as it is now) or already decided",
            ),
        },
    )
    @action(detail=True, methods=["post"], permission_classes=[holds(roles.DECIDE_MIGRATIONS)])
    def apply(self, request: Request, pk=None) -> Response:
        """Apply the proposal (200) or report it stale or decided (409)."""
        proposal = self.get_object()
        try:
            proposal = services.migration_apply(proposal=proposal, user=request.user)
        except ProposalStateError as exc:
            return Response(
                {"detail": str(exc), "status": exc.proposal.status}, status=status.HTTP_409_CONFLICT
            )
        code = status.HTTP_200_OK if proposal.status == ProposalStatus.APPLIED else status.HTTP_409_CONFLICT
        return Response(MigrationProposalSerializer(proposal).data, status=code)

    @extend_schema(
        summary="Reject a proposal",
        request=None,
        responses={200: MigrationProposalSerializer, 409: STATE_ERROR_RESPONSE},
    )
    @action(detail=True, methods=["post"], permission_classes=[holds(roles.DECIDE_MIGRATIONS)])
    def reject(self, request: Request, pk=None) -> Response:
        """Decline the proposal."""
        proposal = self.get_object()
        try:
            proposal = services.migration_reject(proposal=proposal, user=request.user)
        except ProposalStateError as exc:
            return Response(
                {"detail": str(exc), "status": exc.proposal.status}, status=status.HTTP_409_CONFLICT
            )
        return Response(MigrationProposalSerializer(proposal).data)


@extend_schema_view(
    list=extend_schema(
        summary="Scheduling cycles (viewers, operators, admins): what each cycle placed and why jobs wait"
    ),
    retrieve=extend_schema(summary="One scheduling cycle"),
)
class SchedulingCycleViewSet(viewsets.ReadOnlyModelViewSet):
    """The scheduling cycle audit log."""

    authentication_classes = AUTHENTICATION
    permission_classes = [holds(roles.SEE_CYCLES)]
    serializer_class = SchedulingCycleSerializer
    filter_backends = [NamedFilterBackend]
    filterset_class = SchedulingCycleFilter
    pagination_class = StandardPagination
    queryset = SchedulingCycle.objects.order_by("-started_at", "-id")


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """GPUs with the job and rank holding each (?cluster=, ?node=, ?free=true). Here rather than
    with the topology API: who holds a GPU is a live allocation, which scheduling owns."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsAuthenticated]
    pagination_class = StandardPagination
    filter_backends = [DjangoFilterBackend]
    serializer_class = GpuSerializer
    filterset_class = GpuFilter

    def get_queryset(self):
        live = Allocation.objects.filter(gpu=OuterRef("pk"), live=True)
        return (
            Gpu.objects.select_related("node", "domain", "nic")
            .annotate(job=Subquery(live.values("job_id")[:1]), rank=Subquery(live.values("rank")[:1]))
            .order_by("node__cluster_id", "node__position", "node_id", "index")
        )


def priority_body(job: Job) -> dict:
    """The effective priority of `job` now and its terms, as the API and the job page show them."""
    terms = accounts.job_priority(job=job)
    w = accounts.weights()
    return {
        "job": job.pk,
        "account": job.account.name if job.account_id else None,
        "qos": job.qos.name if job.qos_id else None,
        "effective": terms.effective,
        "terms": {
            "requested": terms.requested,
            "age": terms.age,
            "fair_share": terms.fair_share,
            "qos": terms.qos,
        },
        "factors": {
            "requested": job.priority,
            "age": round(terms.age_factor, 6),
            "fair_share": round(terms.fair_share_factor, 6),
            "qos": terms.qos_priority,
        },
        "weights": {"requested": w.requested, "age": w.age, "fair_share": w.fair_share, "qos": w.qos},
    }


class AccountListView(APIView):
    """Every account: members, share, and per cluster its use against its limits."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsAuthenticated]

    @extend_schema(
        summary="Accounts, their shares, and per cluster their GPUs and GPU-hours against their limits",
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        """Each account's use of every cluster against its limits."""
        return Response({"results": accounts.accounts_use()})


@extend_schema_view(
    list=extend_schema(summary="Every cluster's QOS (classes of service) with their priority and limits"),
    retrieve=extend_schema(summary="A QOS"),
    create=extend_schema(summary="Add a QOS to a cluster (operators)"),
    update=extend_schema(summary="Change a QOS (operators)"),
    partial_update=extend_schema(summary="Change some of a QOS's fields (operators)"),
    destroy=extend_schema(summary="Delete a QOS no job uses (operators; normal stays)"),
)
class QosViewSet(viewsets.ModelViewSet):
    """QOS per cluster (docs/accounts.md): any signed-in user reads them, operators change them.
    `?cluster=<name>` lists one cluster's."""

    authentication_classes = AUTHENTICATION
    permission_classes = [ModelPermissions]
    serializer_class = QosSerializer
    pagination_class = StandardPagination

    def get_queryset(self):
        rows = Qos.objects.select_related("cluster").order_by("cluster__name", "-priority", "name")
        cluster = self.request.query_params.get("cluster")
        return rows.filter(cluster__name=cluster) if cluster else rows

    def perform_destroy(self, instance: Qos) -> None:
        if instance.name == DEFAULT_QOS:
            raise field_error("name", f"{DEFAULT_QOS} is every cluster's default QOS and cannot be deleted")
        if instance.jobs.exists():
            raise field_error(
                "name", f"QOS {instance.name} still has jobs; it can be deleted once they are gone"
            )
        instance.delete()


class MembershipPermission(BasePermission):
    """Reads: signed-in users (the queryset shows what they may see). Changes (which of its
    account's QOS a member may use): the account's coordinators, and holders of
    scheduling.change_accountmembership (admins)."""

    message = "This needs a coordinator of the member's account or scheduling.change_accountmembership."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in SAFE_METHODS:
            return True
        user = request.user
        return roles.can(user, CHANGE_MEMBERSHIPS) or selectors.coordinates(user, obj.account_id)


CHANGE_MEMBERSHIPS = "scheduling.change_accountmembership"


@extend_schema_view(
    list=extend_schema(
        summary="Account memberships: yours, your coordinated accounts' (all for viewers, operators, admins)"
    ),
    retrieve=extend_schema(summary="One membership and the QOS its member may use"),
    update=extend_schema(
        summary="Set which of its account's QOS a member may use (the account's coordinators, admins)"
    ),
    partial_update=extend_schema(
        summary="Set which of its account's QOS a member may use (the account's coordinators, admins)"
    ),
)
class MembershipViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet
):
    """Members of accounts and the QOS each may use (docs/accounts.md, "Coordinators")."""

    authentication_classes = AUTHENTICATION
    permission_classes = [MembershipPermission]
    serializer_class = MembershipSerializer
    pagination_class = StandardPagination
    queryset = AccountMembership.objects.none()

    def get_queryset(self):
        user = self.request.user
        rows = AccountMembership.objects.select_related("account", "user").prefetch_related("qos__cluster")
        if not roles.can(user, roles.SEE_ALL_JOBS) and not roles.can(user, CHANGE_MEMBERSHIPS):
            rows = rows.filter(Q(user_id=user.pk) | Q(account_id__in=selectors.coordinated_accounts(user)))
        return rows.order_by("account__name", "user__username")
