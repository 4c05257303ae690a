"""FilterSets of the scheduling API (also usable by admin and dashboard views)."""

from __future__ import annotations

import django_filters
from django_filters.rest_framework import DjangoFilterBackend

from apps.api.filters import FilterSet, IdOrNameFilter, IntegerFilter
from apps.topology.models import Gpu

from ..choices import JobStatus, ProposalStatus
from ..models import Job, MigrationProposal, SchedulingCycle


class NamedFilterBackend(DjangoFilterBackend):
    """DjangoFilterBackend that builds its FilterSet (a form per request) only when a query
    parameter may belong to one of its filters: without one the FilterSet would return the
    queryset as is."""

    def filter_queryset(self, request, queryset, view):
        filterset_class = self.get_filterset_class(view, queryset)
        names = filterset_class.base_filters if filterset_class is not None else {}
        # A prefix match keeps suffixed parameters (range filters' `<name>_min`) filtering.
        if filterset_class is not None and not any(
            param.startswith(name) for param in request.query_params for name in names
        ):
            return queryset
        return super().filter_queryset(request, queryset, view)


class JobFilter(FilterSet):
    """?status=queued&status=running, ?owner=<username or id>, ?cluster=<name or id>, ?overdue=true,
    ?account=<name or id>, ?qos=<name or id> (a name matches that QOS on every cluster), ?held=true."""

    # distinct=False: a status is a column of the row, no join can repeat it (DISTINCT over a
    # million rows cost 0.9 s per page).
    status = django_filters.MultipleChoiceFilter(choices=JobStatus.choices, distinct=False)
    owner = IdOrNameFilter(path="owner", name_field="username", label="owner (username or id)")
    cluster = IdOrNameFilter(path="cluster")
    priority_min = IntegerFilter(field_name="priority", lookup_expr="gte")
    overdue = django_filters.BooleanFilter()
    name = django_filters.CharFilter(lookup_expr="icontains")
    account = IdOrNameFilter(path="account")
    qos = IdOrNameFilter(path="qos")
    held = django_filters.BooleanFilter()

    class Meta:
        model = Job
        fields = ["status", "owner", "cluster", "priority_min", "overdue", "name", "account", "qos", "held"]


class MigrationProposalFilter(FilterSet):
    """?status=proposed, ?cluster=<name or id>, ?job=<id>."""

    status = django_filters.MultipleChoiceFilter(choices=ProposalStatus.choices, distinct=False)
    cluster = IdOrNameFilter(path="job__cluster")
    job = IntegerFilter(field_name="job_id")

    class Meta:
        model = MigrationProposal
        fields = ["status", "cluster", "job"]


class SchedulingCycleFilter(FilterSet):
    """?cluster=<name or id>, ?placed_min=1."""

    cluster = IdOrNameFilter(path="cluster")
    placed_min = IntegerFilter(field_name="placed", lookup_expr="gte")

    class Meta:
        model = SchedulingCycle
        fields = ["cluster", "placed_min", "status"]


class GpuFilter(FilterSet):
    """?cluster=<name or id>, ?node=<name>, ?index=, ?free=true (no live allocation)."""

    cluster = IdOrNameFilter(path="node__cluster")
    node = django_filters.CharFilter(field_name="node__name", label="node name")
    free = django_filters.BooleanFilter(method="filter_free", label="true: no live allocation")

    class Meta:
        model = Gpu
        fields = ["cluster", "node", "index", "free"]

    def filter_free(self, queryset, name, value):
        return queryset.filter(job__isnull=value)


__all__ = ["GpuFilter", "JobFilter", "MigrationProposalFilter", "NamedFilterBackend", "SchedulingCycleFilter"]
