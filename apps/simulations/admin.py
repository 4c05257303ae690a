from django.contrib import admin

from .models import SimulationRun


@admin.register(SimulationRun)
class SimulationRunAdmin(admin.ModelAdmin):
    list_display = ("id", "cluster_name", "trace", "job_limit", "seed", "load", "status", "created_at")
    list_filter = ("status", "trace")
    readonly_fields = ("result", "jobs_done", "jobs_total", "started_at", "finished_at", "error")
