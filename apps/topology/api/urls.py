"""Topology API routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import ClusterImportView, ClusterViewSet, LinkViewSet, NodeViewSet, SwitchViewSet

router = SimpleRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("switches", SwitchViewSet, basename="switch")
router.register("links", LinkViewSet, basename="link")
router.register("nodes", NodeViewSet, basename="node")

urlpatterns = [
    path("imports/<int:pk>/", ClusterImportView.as_view(), name="cluster-import-status"),
    *router.urls,
]
