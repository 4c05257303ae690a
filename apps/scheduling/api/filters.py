"""FilterSets of the scheduling API (also usable by admin and dashboard views)."""

from __future__ import annotations

import django_filters
from django_filters.rest_framework import DjangoFilterBackend

from ..choices import JobStatus, ProposalStatus
from ..models import Job, MigrationProposal, SchedulingCycle


def _id_or_name(queryset, field: str, value: str):
    """Filter `field` (a FK) by primary key when `value` is a number, else by name."""
    if value.isdigit():
        return queryset.filter(**{f"{field}_id": int(value)})
    return queryset.filter(**{f"{field}__name": value})


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


class JobFilter(django_filters.FilterSet):
    """?status=queued&status=running, ?owner=<username or id>, ?cluster=<name or id>, ?overdue=true."""

    status = django_filters.MultipleChoiceFilter(choices=JobStatus.choices)
    owner = django_filters.CharFilter(method="filter_owner", label="owner (username or id)")
    cluster = django_filters.CharFilter(method="filter_cluster", label="cluster (name or id)")
    priority_min = django_filters.NumberFilter(field_name="priority", lookup_expr="gte")
    overdue = django_filters.BooleanFilter()
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Job
        fields = ["status", "owner", "cluster", "priority_min", "overdue", "name"]

    def filter_owner(self, queryset, name, value):
        if value.isdigit():
            return queryset.filter(owner_id=int(value))
        return queryset.filter(owner__username=value)

    def filter_cluster(self, queryset, name, value):
        return _id_or_name(queryset, "cluster", value)


class MigrationProposalFilter(django_filters.FilterSet):
    """?status=proposed, ?cluster=<name or id>, ?job=<id>."""

    status = django_filters.MultipleChoiceFilter(choices=ProposalStatus.choices)
    cluster = django_filters.CharFilter(method="filter_cluster", label="cluster (name or id)")
    job = django_filters.NumberFilter(field_name="job_id")

    class Meta:
        model = MigrationProposal
        fields = ["status", "cluster", "job"]

    def filter_cluster(self, queryset, name, value):
        if value.isdigit():
            return queryset.filter(job__cluster_id=int(value))
        return queryset.filter(job__cluster__name=value)


class SchedulingCycleFilter(django_filters.FilterSet):
    """?cluster=<name or id>, ?placed_min=1."""

    cluster = django_filters.CharFilter(method="filter_cluster", label="cluster (name or id)")
    placed_min = django_filters.NumberFilter(field_name="placed", lookup_expr="gte")

    class Meta:
        model = SchedulingCycle
        fields = ["cluster", "placed_min", "status"]

    def filter_cluster(self, queryset, name, value):
        return _id_or_name(queryset, "cluster", value)


__all__ = ["JobFilter", "MigrationProposalFilter", "NamedFilterBackend", "SchedulingCycleFilter"]
