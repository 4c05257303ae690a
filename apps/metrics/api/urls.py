"""Metrics API routes under /api/v1/."""

from django.urls import path

from .views import GpuMetricsView, JobMetricsView, JobReportView, NodeScrapeListView

urlpatterns = [
    path("metrics/gpus/", GpuMetricsView.as_view(), name="metrics-gpus"),
    path("metrics/nodes/", NodeScrapeListView.as_view(), name="metrics-nodes"),
    path("metrics/jobs/<int:pk>/", JobMetricsView.as_view(), name="metrics-job"),
    path("jobs/<int:pk>/report/", JobReportView.as_view(), name="job-report"),
]
