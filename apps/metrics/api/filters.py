"""FilterSets of the metrics API."""

from __future__ import annotations

import django_filters

from ..choices import ScrapeState
from ..models import GpuLatest, GpuRollup, GpuSample, NodeScrape


class GpuMetricsFilter(django_filters.FilterSet):
    """?cluster=<name or id>, ?node=<name>, ?index=<GPU index>, ?instance=<MIG id> ("" whole GPUs)."""

    cluster = django_filters.CharFilter(method="filter_cluster", label="cluster (name or id)")
    node = django_filters.CharFilter(field_name="gpu__node__name")
    index = django_filters.NumberFilter(field_name="gpu__index")
    instance = django_filters.CharFilter()

    class Meta:
        model = GpuLatest
        fields = ["cluster", "node", "index", "instance"]

    def filter_cluster(self, queryset, name, value):
        if value.isdigit():
            return queryset.filter(gpu__node__cluster_id=int(value))
        return queryset.filter(gpu__node__cluster__name=value)


class GpuSampleFilter(GpuMetricsFilter):
    class Meta(GpuMetricsFilter.Meta):
        model = GpuSample


class GpuRollupFilter(GpuMetricsFilter):
    class Meta(GpuMetricsFilter.Meta):
        model = GpuRollup


GPU_FILTERS = {GpuLatest: GpuMetricsFilter, GpuSample: GpuSampleFilter, GpuRollup: GpuRollupFilter}


class NodeScrapeFilter(django_filters.FilterSet):
    """?cluster=<name or id>, ?state=ok|stale|error, ?node=<name>."""

    cluster = django_filters.CharFilter(method="filter_cluster", label="cluster (name or id)")
    state = django_filters.MultipleChoiceFilter(choices=ScrapeState.choices, distinct=False)
    node = django_filters.CharFilter(field_name="node__name")

    class Meta:
        model = NodeScrape
        fields = ["cluster", "state", "node"]

    def filter_cluster(self, queryset, name, value):
        if value.isdigit():
            return queryset.filter(node__cluster_id=int(value))
        return queryset.filter(node__cluster__name=value)
