"""Scheduling API routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import JobViewSet, MigrationProposalViewSet, PlacementPreviewView, SchedulingCycleViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("migrations", MigrationProposalViewSet, basename="migration")
router.register("cycles", SchedulingCycleViewSet, basename="cycle")

urlpatterns = [
    path("placements/preview/", PlacementPreviewView.as_view(), name="placement-preview"),
    *router.urls,
]
