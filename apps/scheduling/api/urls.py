"""Scheduling API routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from .node_views import JobLogsView, NodeHealthViewSet, RankLogView
from .views import (
    AccountListView,
    GpuViewSet,
    JobViewSet,
    MembershipViewSet,
    MigrationProposalViewSet,
    PlacementPreviewView,
    QosViewSet,
    SchedulingCycleViewSet,
)

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("migrations", MigrationProposalViewSet, basename="migration")
router.register("cycles", SchedulingCycleViewSet, basename="cycle")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("node-health", NodeHealthViewSet, basename="node-health")
router.register("qos", QosViewSet, basename="qos")
router.register("memberships", MembershipViewSet, basename="membership")

urlpatterns = [
    path("placements/preview/", PlacementPreviewView.as_view(), name="placement-preview"),
    path("accounts/", AccountListView.as_view(), name="account-list"),
    path("jobs/<int:pk>/logs/", JobLogsView.as_view(), name="job-logs"),
    path("jobs/<int:pk>/logs/<int:rank>/", RankLogView.as_view(), name="rank-log"),
    *router.urls,
]
