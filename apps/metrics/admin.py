"""Admin pages: each cluster's metrics source (dcgm or prometheus, label mapping), node scrape
states and hotspots (read only). Node `dcgm_url`s are edited on the topology's node page."""

from django.contrib import admin

from .models import Hotspot, MetricsSource, NodeScrape


@admin.register(MetricsSource)
class MetricsSourceAdmin(admin.ModelAdmin):
    list_display = ["cluster", "kind", "prometheus_url", "interval_s", "timeout_s"]
    list_filter = ["kind"]
    fields = [
        "cluster",
        "kind",
        "prometheus_url",
        "node_label",
        "gpu_label",
        "node_suffix",
        "interval_s",
        "timeout_s",
    ]


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(NodeScrape)
class NodeScrapeAdmin(ReadOnly):
    list_display = [
        "node",
        "state",
        "last_success_at",
        "last_attempt_at",
        "gpus_read",
        "rejected",
        "last_error",
    ]
    list_filter = ["state", "node__cluster"]
    search_fields = ["node__name", "last_error"]
    list_select_related = ["node"]


@admin.register(Hotspot)
class HotspotAdmin(ReadOnly):
    list_display = [
        "id",
        "cluster",
        "kind",
        "job",
        "leaf",
        "opened_at",
        "last_seen_at",
        "closed_at",
        "intervals",
    ]
    list_filter = ["kind", "cluster"]
    list_select_related = ["cluster", "job"]
