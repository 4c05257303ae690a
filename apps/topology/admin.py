"""The topology editor: Django admin for every topology model.

Foreign-key dropdowns are limited to the edited object's cluster (or node), so pages stay small on
16,000-GPU clusters and a row cannot point into another cluster; model clean() reports what remains.
Every save and delete advances the cluster's `updated_at`, which invalidates cached snapshots.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.urls import reverse
from django.utils.html import format_html_join

from . import selectors, services
from .choices import SwitchTier
from .models import Cluster, Gpu, GpuModel, Link, Nic, Node, NvlinkDomain, Switch, touch_cluster

MAX_MESSAGES_PER_CLUSTER = 50
# Up to this many switches the cluster form edits them inline; past it, it links to the
# switch list filtered by cluster and tier (a 16k-GPU fabric has hundreds of switches).
INLINE_SWITCHES_MAX = 40


class ClusterLabelledChoiceField(forms.ModelChoiceField):
    """Choices from several clusters, labelled `cluster / name`."""

    def label_from_instance(self, obj) -> str:
        return f"{obj.cluster.name} / {obj}"


def edited_object(request, model):
    """The object of `model` whose change page this request is for, or None (add and list pages)."""
    match = request.resolver_match
    object_id = match.kwargs.get("object_id") if match else None
    if object_id is None:
        return None
    cache = request.__dict__.setdefault("_topology_edited", {})
    if model not in cache:
        cache[model] = model._default_manager.filter(pk=object_id).first()
    return cache[model]


def scoped_field(db_field, queryset, kwargs, *, labelled: bool):
    """A foreign-key form field over `queryset`; cluster-labelled when it spans clusters."""
    kwargs["queryset"] = queryset
    if labelled:
        kwargs["form_class"] = ClusterLabelledChoiceField
    return db_field.formfield(**kwargs)


class ClusterRowAdmin(admin.ModelAdmin):
    """Admin for rows of one cluster; `cluster_path` reaches the cluster id for bulk deletes."""

    cluster_path = "cluster"
    list_per_page = 100

    def delete_queryset(self, request, queryset):
        cluster_ids = set(queryset.values_list(self.cluster_path, flat=True))
        super().delete_queryset(request, queryset)
        for cluster_id in cluster_ids:
            touch_cluster(cluster_id)


class SameClusterFormSet(BaseInlineFormSet):
    """Inline rows that carry a `cluster` field take the parent's cluster."""

    def _construct_form(self, i, **kwargs):
        form = super()._construct_form(i, **kwargs)
        form.instance.cluster_id = self.instance.cluster_id
        return form


# --------------------------------------------------------------------------- cluster


class SwitchInline(admin.TabularInline):
    model = Switch
    fields = ["name", "tier", "position"]
    extra = 0
    show_change_link = True


class GpuModelInline(admin.TabularInline):
    model = GpuModel
    fields = ["name", "peak_tflops", "speed"]
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "policy", "node_count", "gpu_count", "switch_count", "updated_at"]
    list_filter = ["policy", "preemption_enabled", "backfill_enabled"]
    search_fields = ["name", "description"]
    readonly_fields = ["summary", "rows", "created_at", "updated_at"]
    fields = ["name", "description", "policy", "preemption_enabled", "backfill_enabled", *readonly_fields]
    inlines = [GpuModelInline, SwitchInline]
    actions = ["validate_against_spec"]

    def get_inlines(self, request, obj):
        if obj is not None and obj.switches.count() > INLINE_SWITCHES_MAX:
            return [GpuModelInline]
        return self.inlines

    @admin.display(description="topology rows")
    def rows(self, obj) -> str:
        """Links to this cluster's switches (per tier), links, nodes, NICs, GPUs and domains."""
        if obj.pk is None:
            return "-"
        by_tier = {r["tier"]: r["n"] for r in obj.switches.values("tier").annotate(n=Count("id")).order_by()}
        items = [
            (f"{by_tier.get(t, 0)} {t} switches", "switch", f"cluster__id__exact={obj.pk}&tier__exact={t}")
            for t in SwitchTier.values
            if by_tier.get(t)
        ]
        items += [
            (f"{obj.links.count()} links", "link", f"cluster__id__exact={obj.pk}"),
            (f"{obj.nodes.count()} nodes", "node", f"cluster__id__exact={obj.pk}"),
            ("NICs", "nic", f"node__cluster__id__exact={obj.pk}"),
            ("GPUs", "gpu", f"node__cluster__id__exact={obj.pk}"),
            ("NVLink domains", "nvlinkdomain", f"cluster__id__exact={obj.pk}"),
        ]
        return format_html_join(
            " · ",
            '<a href="{}?{}">{}</a>',
            ((reverse(f"admin:topology_{model}_changelist"), query, label) for label, model, query in items),
        )

    def get_queryset(self, request):
        return selectors.cluster_list()

    @admin.display(description="nodes", ordering="node_count")
    def node_count(self, obj) -> int:
        return obj.node_count

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_count(self, obj) -> int:
        return obj.gpu_count

    @admin.display(description="switches", ordering="switch_count")
    def switch_count(self, obj) -> int:
        return obj.switch_count

    @admin.display(description="summary")
    def summary(self, obj) -> str:
        if obj.pk is None:
            return "-"
        s = selectors.cluster_summary(cluster=obj)
        tiers = ", ".join(f"{n} {tier}" for tier, n in s["switches"].items())
        return f"{s['nodes']} nodes, {s['gpus']} GPUs, {s['nvlink_domains']} NVLink domains, {tiers} switches, {s['links']} links"

    @admin.action(description="Validate against spec v1")
    def validate_against_spec(self, request, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            problems = services.cluster_validate(cluster=cluster)
            if not problems:
                self.message_user(request, f"{cluster.name}: valid against spec v1", messages.SUCCESS)
                continue
            for field, message in problems[:MAX_MESSAGES_PER_CLUSTER]:
                self.message_user(request, f"{cluster.name}: {field}: {message}", messages.ERROR)
            if len(problems) > MAX_MESSAGES_PER_CLUSTER:
                more = len(problems) - MAX_MESSAGES_PER_CLUSTER
                self.message_user(request, f"{cluster.name}: {more} more problems not shown", messages.ERROR)


@admin.register(GpuModel)
class GpuModelAdmin(ClusterRowAdmin):
    list_display = ["name", "cluster", "peak_tflops"]
    list_filter = ["cluster"]
    list_select_related = ["cluster"]
    search_fields = ["name", "cluster__name"]


# --------------------------------------------------------------------------- switches and links


class LinkInline(admin.TabularInline):
    model = Link
    fk_name = "a"
    formset = SameClusterFormSet
    fields = ["b", "bw_GBps", "latency_us", "position"]
    extra = 0
    verbose_name = "uplink"
    verbose_name_plural = "uplinks (links from this switch)"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("b")

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        switch = edited_object(request, Switch)
        if db_field.name == "b" and switch is not None:
            return scoped_field(
                db_field, Switch.objects.filter(cluster_id=switch.cluster_id), kwargs, labelled=False
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Switch)
class SwitchAdmin(ClusterRowAdmin):
    list_display = ["name", "tier", "cluster", "position"]
    list_filter = ["cluster", "tier"]
    list_select_related = ["cluster"]
    search_fields = ["name", "cluster__name"]
    inlines = [LinkInline]


@admin.register(Link)
class LinkAdmin(ClusterRowAdmin):
    list_display = ["__str__", "cluster", "a", "b", "bw_GBps", "latency_us", "position"]
    list_filter = ["cluster", "a__tier", "b__tier"]
    list_select_related = ["cluster", "a", "b"]
    search_fields = ["a__name", "b__name", "cluster__name"]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name in ("a", "b"):
            link = edited_object(request, Link)
            if link is not None:
                qs = Switch.objects.filter(cluster_id=link.cluster_id)
                return scoped_field(db_field, qs, kwargs, labelled=False)
            return scoped_field(db_field, Switch.objects.select_related("cluster"), kwargs, labelled=True)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


# --------------------------------------------------------------------------- nodes, NICs, GPUs


@admin.register(NvlinkDomain)
class NvlinkDomainAdmin(ClusterRowAdmin):
    list_display = ["name", "cluster", "bw_GBps", "latency_us", "nvls", "gpu_count"]
    list_filter = ["cluster"]
    list_select_related = ["cluster"]
    search_fields = ["name", "cluster__name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(gpu_count=Count("gpus"))

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_count(self, obj) -> int:
        return obj.gpu_count


class NicInline(admin.TabularInline):
    model = Nic
    fields = ["name", "leaf", "bw_GBps", "latency_us"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("leaf")

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        node = edited_object(request, Node)
        if db_field.name == "leaf":
            leaves = Switch.objects.filter(tier=SwitchTier.LEAF)
            if node is not None:
                return scoped_field(
                    db_field, leaves.filter(cluster_id=node.cluster_id), kwargs, labelled=False
                )
            return scoped_field(db_field, leaves.select_related("cluster"), kwargs, labelled=True)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class GpuInline(admin.TabularInline):
    model = Gpu
    fields = ["index", "domain", "nic"]
    # A cluster can have thousands of NVLink domains: an id field with a lookup, not a dropdown per GPU.
    raw_id_fields = ["domain"]
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("domain", "nic")

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        node = edited_object(request, Node)
        if db_field.name == "nic":
            # A new node's NICs do not exist yet: save the node with its NICs, then assign GPUs.
            nics = Nic.objects.filter(node=node).select_related("node") if node else Nic.objects.none()
            return scoped_field(db_field, nics, kwargs, labelled=False)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Node)
class NodeAdmin(ClusterRowAdmin):
    list_display = ["name", "cluster", "leaf", "gpu_model", "standalone", "position"]
    list_filter = ["cluster", ("leaf", admin.RelatedOnlyFieldListFilter), "standalone"]
    list_select_related = ["cluster", "leaf", "gpu_model"]
    search_fields = ["name", "cluster__name", "dcgm_url"]
    fields = ["cluster", "name", "gpu_model", "leaf", "dcgm_url", "standalone", "position", "intra"]
    # Intra links come in with the topology (import or replace); shown, not edited here.
    readonly_fields = ["leaf", "intra"]
    inlines = [NicInline, GpuInline]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "gpu_model":
            node = edited_object(request, Node)
            if node is not None:
                qs = GpuModel.objects.filter(cluster_id=node.cluster_id)
                return scoped_field(db_field, qs, kwargs, labelled=False)
            return scoped_field(db_field, GpuModel.objects.select_related("cluster"), kwargs, labelled=True)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        services.node_refresh_leaf(node=form.instance)


@admin.register(Nic)
class NicAdmin(ClusterRowAdmin):
    cluster_path = "node__cluster"
    list_display = ["name", "node", "leaf", "bw_GBps", "latency_us"]
    list_filter = ["node__cluster", ("leaf", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["node", "leaf"]
    search_fields = ["name", "node__name", "leaf__name"]
    raw_id_fields = ["node"]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "leaf":
            nic = edited_object(request, Nic)
            leaves = Switch.objects.filter(tier=SwitchTier.LEAF)
            if nic is not None:
                qs = leaves.filter(cluster_id=nic.node.cluster_id)
                return scoped_field(db_field, qs, kwargs, labelled=False)
            return scoped_field(db_field, leaves.select_related("cluster"), kwargs, labelled=True)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        services.node_refresh_leaf(node=obj.node)

    def delete_model(self, request, obj):
        node = obj.node
        super().delete_model(request, obj)
        services.node_refresh_leaf(node=node)

    def delete_queryset(self, request, queryset):
        nodes = list(Node.objects.filter(pk__in=queryset.values("node_id")))
        super().delete_queryset(request, queryset)
        for node in nodes:
            services.node_refresh_leaf(node=node)


@admin.register(Gpu)
class GpuAdmin(ClusterRowAdmin):
    cluster_path = "node__cluster"
    list_display = ["__str__", "node", "index", "domain", "nic"]
    list_filter = ["node__cluster", ("nic__leaf", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["node", "domain", "nic", "nic__node"]
    search_fields = ["node__name", "domain__name", "nic__name"]
    raw_id_fields = ["node", "domain", "nic"]
