"""Topology REST views: clusters (import, export, settings) and read-only switches, links and
nodes. Writes go through apps.topology.services. GPUs, listed with the job and rank holding each,
are scheduling's (apps/scheduling/api/views.py: GpuViewSet), as the allocations are.

The views name no authentication classes: they take the project's default (settings REST_FRAMEWORK
DEFAULT_AUTHENTICATION_CLASSES: user tokens, sessions, launcher tokens), which is the scheduling
API's AUTHENTICATION; topology does not import the scheduling app that owns the launcher tokens."""

from __future__ import annotations

import re

from django.db.models import Count, Prefetch
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api import roles
from apps.api.pagination import StandardPagination
from apps.api.parsers import SPEC_PARSERS
from apps.api.permissions import ModelPermissions
from apps.api.renderers import YAMLRenderer
from apps.api.schemas import FIELD_ERRORS_RESPONSE
from apps.api.validation import check_body, field_error, object_body, shown
from apps.placement.convert import IMPORTERS, MEDIA_TYPES, Source
from apps.placement.convert.base import MAX_SOURCE_BYTES
from apps.placement.topology import TOPOLOGY_LIMITS, SpecError, parse_spec_text

from .. import conversion, selectors, services
from ..models import Cluster, ClusterImport, Link, Nic, Node, Switch
from .filters import LinkFilter, NodeFilter, SwitchFilter
from .renderers import CONVERTED_FORMATS, CONVERTED_RENDERERS
from .schemas import IMPORT_BODY, TOPOLOGY_SPEC
from .serializers import (
    ClusterSerializer,
    LinkSerializer,
    NodeSerializer,
    SwitchSerializer,
)

SPEC_BODY = IMPORT_BODY
SPEC_ERRORS = FIELD_ERRORS_RESPONSE


class TopologySpecRenderer(JSONRenderer):
    """`?format=topology-v1`: the spec v1 as JSON."""

    format = "topology-v1"


def _true(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@extend_schema_view(
    list=extend_schema(summary="Clusters with node, GPU and switch counts"),
    retrieve=extend_schema(summary="One cluster"),
    update=extend_schema(
        summary="Change a cluster's description, policy, preemption or backfill (topology.change_cluster)"
    ),
    partial_update=extend_schema(summary="Change some of a cluster's settings (topology.change_cluster)"),
    destroy=extend_schema(summary="Delete a cluster and everything on it (topology.delete_cluster)"),
)
class ClusterViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Clusters: read for every signed-in user; writes by Django model permission, as in the admin."""

    permission_classes = [ModelPermissions]
    serializer_class = ClusterSerializer
    pagination_class = StandardPagination
    parser_classes = [*SPEC_PARSERS, MultiPartParser]
    queryset = Cluster.objects.none()

    def get_queryset(self):
        return selectors.cluster_list()

    @extend_schema(
        summary="Create a cluster from a topology spec v1 body (topology.add_cluster)",
        request=SPEC_BODY,
        responses={201: ClusterSerializer, 400: SPEC_ERRORS},
    )
    def create(self, request: Request) -> Response:
        """Create a cluster from a topology spec v1 body."""
        return self._import(request, replace=False)

    @extend_schema(
        summary="Import a topology spec v1 (a multipart `file` or a JSON/YAML body), or another tool's files "
        "with ?from= (multipart `file` fields and an optional `defaults` mapping); ?replace=true overwrites",
        request=SPEC_BODY,
        parameters=[
            OpenApiParameter("replace", bool, description="replace the cluster of the same name"),
            OpenApiParameter(
                "from", str, enum=list(IMPORTERS), description="input format, default topology-v1"
            ),
        ],
        responses={201: ClusterSerializer, 200: ClusterSerializer, 400: SPEC_ERRORS},
    )
    @action(detail=False, methods=["post"], url_path="import", url_name="import")
    def import_spec(self, request: Request) -> Response:
        """Import a topology spec v1 from a file upload or a JSON/YAML body."""
        # A multipart form carries `replace` as a field; a spec body's keys are the spec's own.
        form = request.data if hasattr(request.data, "getlist") else {}
        replace = _true(request.query_params.get("replace", "")) or _true(form.get("replace", ""))
        return self._import(request, replace=replace)

    def _import(self, request: Request, *, replace: bool) -> Response:
        if replace and not roles.can(request.user, roles.CHANGE_CLUSTERS):
            raise PermissionDenied(f"replacing a cluster's topology needs {roles.CHANGE_CLUSTERS}")
        fmt = request.query_params.get("from") or _form_value(request, "from") or "topology-v1"
        notes = None
        if fmt == "topology-v1":
            data = _spec_from_request(request)
        else:
            data, notes = _converted_from_request(request, fmt)
        if _true(request.query_params.get("background", "")) or _true(
            _form_value(request, "background") or ""
        ):
            queued = services.cluster_import_queue(data=data, replace=replace, user=request.user, notes=notes)
            queued.refresh_from_db()
            return Response(
                import_body(queued), status=status.HTTP_202_ACCEPTED, headers={"Location": import_url(queued)}
            )
        existed = Cluster.objects.filter(name=str(data.get("name"))).exists()
        cluster = services.cluster_import(data=data, replace=replace)
        body = ClusterSerializer(selectors.cluster_list().get(pk=cluster.pk)).data
        if notes is not None:
            body = {**body, "notes": notes}
        return Response(body, status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)

    @extend_schema(
        summary="Export the cluster as topology spec v1 (?format=topology-v1 JSON, or yaml) or in another "
        "tool's format (?format=slurm-tree, slurm-block, slurm-yaml, topograph, kueue)",
        parameters=[
            OpenApiParameter(
                "format",
                str,
                enum=["topology-v1", "json", "yaml", *CONVERTED_FORMATS],
                description="default json",
            )
        ],
        responses={
            (200, "application/json"): TOPOLOGY_SPEC,
            (200, "application/yaml"): TOPOLOGY_SPEC,
            (200, "text/plain"): OpenApiTypes.STR,
            400: SPEC_ERRORS,
        },
    )
    @action(
        detail=True,
        methods=["get"],
        renderer_classes=[JSONRenderer, TopologySpecRenderer, YAMLRenderer, *CONVERTED_RENDERERS],
    )
    def export(self, request: Request, pk=None) -> Response:
        """The cluster as topology spec v1, or in another tool's format."""
        cluster = self.get_object()
        fmt = request.accepted_renderer.format
        if fmt in CONVERTED_FORMATS:
            text = conversion.cluster_export_format(cluster=cluster, fmt=fmt)
            filename = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{cluster.name}.{fmt}.{MEDIA_TYPES[fmt][1]}")
            return Response(text, headers={"Content-Disposition": f'inline; filename="{filename}"'})
        return Response(services.cluster_to_spec(cluster=cluster))


def _spec_from_request(request: Request):
    """The spec of an import: an uploaded `file` (multipart) or the parsed body."""
    upload = request.FILES.get("file") if hasattr(request, "FILES") else None
    if upload is not None:
        try:
            # One byte past the limit is enough for the loader to refuse it.
            data = parse_spec_text(upload.read(TOPOLOGY_LIMITS.max_bytes + 1))
        except SpecError as exc:
            raise SpecError([(f"file{'.' + f if f else ''}", m) for f, m in exc.errors]) from None
        if not isinstance(data, dict):
            raise field_error("file", f"must hold a topology spec object, got {type(data).__name__}")
        return check_body(data)
    if hasattr(request.data, "getlist"):
        # A form without a file: nothing to import.
        raise field_error("file", "upload a topology spec file, or send the spec as a JSON or YAML body")
    return object_body(request)


def _form_value(request: Request, key: str) -> str | None:
    """A multipart form field's value (None for JSON and YAML bodies)."""
    data = request.data
    return data.get(key) if hasattr(data, "getlist") else None


def _converted_from_request(request: Request, fmt: str) -> tuple[dict, list[str]]:
    """(spec v1, notes) from multipart `file` uploads in format `fmt` and an optional `defaults`
    field (a YAML or JSON mapping of the values the files lack)."""
    if fmt not in IMPORTERS:
        raise SpecError([("from", f"unknown input format {shown(fmt)}; one of {', '.join(IMPORTERS)}")])
    uploads = request.FILES.getlist("file") if hasattr(request, "FILES") else []
    if not uploads:
        raise SpecError([("file", f"upload the {fmt} file(s) as multipart `file` fields")])
    sources = []
    for upload in uploads:
        if upload.size > MAX_SOURCE_BYTES:
            raise SpecError([("file", f"{upload.name} is larger than {MAX_SOURCE_BYTES} bytes")])
        try:
            sources.append(Source(upload.name, upload.read().decode("utf-8")))
        except UnicodeDecodeError as exc:
            raise SpecError([("file", f"{upload.name} is not UTF-8 text: {exc}")]) from exc
    defaults = conversion.defaults_from_text(_form_value(request, "defaults") or "")
    return conversion.spec_from_format(fmt=fmt, sources=sources, defaults=defaults)


class _ReadOnly(viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsAuthenticated]
    pagination_class = StandardPagination
    filter_backends = [DjangoFilterBackend]


class SwitchViewSet(_ReadOnly):
    """Switches of every cluster (?cluster=, ?tier=)."""

    serializer_class = SwitchSerializer
    filterset_class = SwitchFilter
    queryset = Switch.objects.order_by("cluster_id", "position", "id")


class LinkViewSet(_ReadOnly):
    """Switch-to-switch links (?cluster=, ?switch=)."""

    serializer_class = LinkSerializer
    filterset_class = LinkFilter
    queryset = Link.objects.select_related("a", "b").order_by("cluster_id", "position", "id")


class NodeViewSet(_ReadOnly):
    """Nodes with their NICs (?cluster=, ?leaf=)."""

    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    queryset = (
        Node.objects.select_related("gpu_model", "leaf")
        .prefetch_related(Prefetch("nics", queryset=Nic.objects.select_related("leaf").order_by("id")))
        .annotate(gpu_count=Count("gpus"))
        .order_by("cluster_id", "position", "id")
    )


def import_url(job: ClusterImport) -> str:
    return f"/api/v1/imports/{job.pk}/"


def import_body(job: ClusterImport) -> dict:
    """A background import as the API shows it: status, stage, progress, cluster or errors."""
    return {
        "id": job.pk,
        "url": import_url(job),
        "status": job.status,
        "stage": job.stage,
        "progress": job.progress,
        "replace": job.replace,
        "cluster": job.cluster.name if job.cluster_id else None,
        "errors": job.errors,
        "notes": job.notes,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
    }


class ClusterImportView(APIView):
    """A background import's progress (`?background=true` on the import): who may import may read it."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        summary="A background topology import: status, stage, progress, cluster or errors",
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request, pk: int) -> Response:
        if not roles.can(request.user, roles.IMPORT_CLUSTERS):
            raise NotFound()
        job = ClusterImport.objects.select_related("cluster").filter(pk=pk).first()
        if job is None:
            raise NotFound()
        return Response(import_body(job))
