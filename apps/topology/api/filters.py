"""FilterSets of the topology API: every list filters by cluster (name or id)."""

from __future__ import annotations

import django_filters

from apps.api.filters import FilterSet, IdOrNameFilter

from ..choices import SwitchTier
from ..models import Link, Node, Switch


class _ByCluster(FilterSet):
    cluster = IdOrNameFilter(path="cluster")


class SwitchFilter(_ByCluster):
    tier = django_filters.ChoiceFilter(choices=SwitchTier.choices)

    class Meta:
        model = Switch
        fields = ["cluster", "tier", "name"]


class LinkFilter(_ByCluster):
    switch = django_filters.CharFilter(method="filter_switch", label="either end's switch name")

    class Meta:
        model = Link
        fields = ["cluster", "switch"]

    def filter_switch(self, queryset, name, value):
        return queryset.filter(a__name=value) | queryset.filter(b__name=value)


class NodeFilter(_ByCluster):
    leaf = django_filters.CharFilter(field_name="leaf__name", label="leaf switch name")

    class Meta:
        model = Node
        fields = ["cluster", "leaf", "name", "standalone"]
