"""Admin pages of the executors: which clusters Slurm runs and how TopoWeb reaches it, the Slurm
job of each TopoWeb job generation, and the GPUs jobs submitted straight to Slurm hold."""

from __future__ import annotations

from django.contrib import admin

from .models import ClusterExecutor, ForeignAllocation, SlurmSubmission


@admin.register(ClusterExecutor)
class ClusterExecutorAdmin(admin.ModelAdmin):
    list_display = [
        "cluster",
        "kind",
        "slurmrestd_url",
        "slurm_user",
        "submit_as_owner",
        "last_sync_at",
        "last_error",
    ]
    list_filter = ["kind"]
    readonly_fields = ["last_sync_at", "last_error"]


@admin.register(SlurmSubmission)
class SlurmSubmissionAdmin(admin.ModelAdmin):
    list_display = ["job", "generation", "slurm_job_id", "slurm_user", "state", "reason", "submitted_at"]
    list_filter = ["state"]
    search_fields = ["slurm_job_id", "job__name"]
    list_select_related = ["job"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ForeignAllocation)
class ForeignAllocationAdmin(admin.ModelAdmin):
    list_display = ["cluster", "node", "gpu_index", "slurm_job_id", "user", "name", "seen_at"]
    search_fields = ["slurm_job_id", "user", "node__name"]
    list_select_related = ["cluster", "node"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
