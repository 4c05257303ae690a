"""Admin pages for jobs, allocations, scheduling cycles, migration proposals, launcher tokens and
node agent tokens and the Unix accounts users' ranks run as.

Admin actions call the services, so the admin never books or releases GPUs behind their back.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages

from . import executor, nodes, services
from .account_models import DEFAULT_QOS
from .models import (
    Account,
    AccountLimit,
    AccountMembership,
    Allocation,
    Job,
    LauncherToken,
    MigrationProposal,
    NodeHealth,
    Qos,
    SchedulingCycle,
    UnixAccount,
)
from .proposals import ProposalStateError
from .selectors import spec_shown


class AllocationInline(admin.TabularInline):
    model = Allocation
    fields = ["rank", "gpu", "live", "created_at", "released_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["rank"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "cluster",
        "owner",
        "status",
        "priority",
        "qos",
        "gpus",
        "submitted_at",
        "overdue",
    ]
    list_filter = ["status", "cluster", "overdue", "policy"]
    search_fields = ["name", "owner__username"]
    list_select_related = ["cluster", "owner", "qos"]
    # Every field read-only (new ones too): the scheduler alone sets status, generation, account,
    # borrowed, the placement times and predictions; the API and the actions below change jobs
    # through the services. The spec is shown with its env values masked.
    readonly_fields = [
        "spec_masked",
        *(f.name for f in Job._meta.concrete_fields if f.name not in ("id", "spec")),
    ]
    inlines = [AllocationInline]
    actions = ["cancel_jobs", "hold_jobs", "release_jobs", "run_cycle"]
    exclude = ["spec"]

    @admin.display(description="spec")
    def spec_masked(self, obj: Job) -> str:
        # Launch env values are the owner's (the API shows them to the owner): here the names only.
        return json.dumps(spec_shown(job=obj), indent=1, sort_keys=True)

    def has_add_permission(self, request) -> bool:
        # Jobs enter through job_submit (REST or the dashboard), which validates the spec.
        return False

    @admin.action(description="Cancel the selected jobs", permissions=["change"])
    def cancel_jobs(self, request, queryset):
        self._each(request, queryset, services.job_cancel, "Cancelled")

    @admin.action(description="Hold the selected waiting jobs", permissions=["change"])
    def hold_jobs(self, request, queryset):
        self._each(request, queryset, services.job_hold, "Held")

    @admin.action(description="Release the selected held jobs", permissions=["change"])
    def release_jobs(self, request, queryset):
        self._each(request, queryset, services.job_release, "Released")

    def _each(self, request, queryset, service, done_text: str) -> None:
        done = 0
        for job in queryset:
            try:
                service(job=job, user=request.user)
                done += 1
            except services.JobStateError as exc:
                self.message_user(request, str(exc), messages.WARNING)
        self.message_user(request, f"{done_text} {done} jobs.")

    @admin.action(description="Run a scheduling cycle on the selected jobs' clusters")
    def run_cycle(self, request, queryset):
        for cluster in {job.cluster for job in queryset.select_related("cluster")}:
            cycle = services.schedule_cluster(cluster=cluster)
            self.message_user(request, f"{cluster.name}: placed {cycle.placed} jobs.")


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "rank", "gpu", "live", "created_at", "released_at"]
    list_filter = ["live", "job__cluster"]
    list_select_related = ["job", "gpu", "gpu__node"]
    raw_id_fields = ["job", "gpu"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SchedulingCycle)
class SchedulingCycleAdmin(admin.ModelAdmin):
    list_display = ["id", "cluster", "started_at", "policy", "duration_ms", "placed", "status"]
    list_filter = ["status", "cluster"]
    readonly_fields = [f.name for f in SchedulingCycle._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(MigrationProposal)
class MigrationProposalAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "job",
        "status",
        "predicted_gain",
        "predicted_old_step_ms",
        "predicted_new_step_ms",
        "created_at",
    ]
    list_filter = ["status", "job__cluster"]
    list_select_related = ["job"]
    readonly_fields = [f.name for f in MigrationProposal._meta.fields]
    actions = ["apply_proposals", "reject_proposals"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Apply the selected proposals")
    def apply_proposals(self, request, queryset):
        for proposal in queryset:
            try:
                result = services.migration_apply(proposal=proposal, user=request.user)
            except ProposalStateError as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            level = messages.SUCCESS if result.status == "applied" else messages.WARNING
            self.message_user(request, f"Proposal {result.pk}: {result.status}", level)

    @admin.action(description="Reject the selected proposals")
    def reject_proposals(self, request, queryset):
        for proposal in queryset:
            try:
                services.migration_reject(proposal=proposal, user=request.user)
            except ProposalStateError as exc:
                self.message_user(request, str(exc), messages.WARNING)


@admin.register(LauncherToken)
class LauncherTokenAdmin(admin.ModelAdmin):
    """Launcher tokens by their key's prefix (only its hash is stored); deleting one revokes it.
    New ones come from `manage.py create_launcher_token`, which shows the key once."""

    list_display = ["id", "prefix", "cluster", "created_at"]
    list_filter = ["cluster"]
    fields = ["cluster", "prefix", "created_at"]
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(NodeHealth)
class NodeHealthAdmin(admin.ModelAdmin):
    """Node health: drain (the reason field says why) and resume through the services."""

    list_display = ["node", "state", "reason", "last_seen", "version", "running"]
    list_filter = ["state", "node__cluster"]
    search_fields = ["node__name"]
    list_select_related = ["node"]
    readonly_fields = [
        "node",
        "state",
        "last_seen",
        "version",
        "addr",
        "inventory",
        "unhealthy_gpus",
        "running",
        "isolation",
    ]
    fields = [*readonly_fields[:2], "reason", *readonly_fields[2:]]
    actions = ["drain", "resume"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Drain the selected nodes (reason: the node's reason field, else 'admin')")
    def drain(self, request, queryset):
        done = 0
        for agent in queryset.select_related("node"):
            try:
                nodes.node_drain(node=agent.node, reason=agent.reason or "drained from the admin")
                done += 1
            except executor.Refused as exc:
                self.message_user(request, str(exc), messages.ERROR)
        self.message_user(request, f"{done} nodes draining or drained", messages.SUCCESS)

    @admin.action(description="Resume the selected nodes")
    def resume(self, request, queryset):
        done = 0
        for agent in queryset.select_related("node"):
            try:
                nodes.node_resume(node=agent.node)
                done += 1
            except executor.Refused as exc:
                self.message_user(request, str(exc), messages.ERROR)
        self.message_user(request, f"{done} nodes resumed", messages.SUCCESS)


class AccountMembershipInline(admin.TabularInline):
    model = AccountMembership
    extra = 0
    raw_id_fields = ["user"]
    fields = ["user", "is_default", "is_coordinator", "qos"]


class AccountLimitInline(admin.TabularInline):
    model = AccountLimit
    extra = 0
    fields = [
        "cluster",
        "max_running_gpus",
        "max_running_jobs",
        "gpu_hours_per_period",
        "period_h",
        "may_borrow",
    ]


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    """Accounts with their members and per-cluster limits (the model validators bound every number)."""

    list_display = ["name", "share", "max_priority", "max_queued_jobs", "default_qos", "description"]
    search_fields = ["name", "memberships__user__username"]
    filter_horizontal = ["qos"]
    inlines = [AccountMembershipInline, AccountLimitInline]


@admin.register(Qos)
class QosAdmin(admin.ModelAdmin):
    """Classes of service per cluster: priority term, limits (blank: none), borrowing, preemption.
    Every cluster keeps its `normal`."""

    list_display = [
        "name",
        "cluster",
        "priority",
        "max_gpus_per_job",
        "max_running_gpus",
        "max_running_gpus_per_user",
        "max_running_gpus_per_account",
        "max_queued_per_user",
        "max_wall_s",
        "gpu_hours_per_period",
        "may_borrow",
        "preemptible",
    ]
    list_filter = ["cluster", "may_borrow", "preemptible"]
    search_fields = ["name", "cluster__name"]

    def get_readonly_fields(self, request, obj=None):
        return ["name", "cluster"] if obj is not None and obj.name == DEFAULT_QOS else []

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and (obj.name == DEFAULT_QOS or obj.jobs.exists()):
            return False
        return super().has_delete_permission(request, obj)


@admin.register(UnixAccount)
class UnixAccountAdmin(admin.ModelAdmin):
    """Which Unix account a user's ranks run as on the nodes (a user without one: the username)."""

    list_display = ["user", "name"]
    search_fields = ["user__username", "name"]
    list_select_related = ["user"]
