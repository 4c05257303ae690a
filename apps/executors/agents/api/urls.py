"""The node agents' API route under /api/v1/."""

from django.urls import path

from .views import AgentSyncView

urlpatterns = [path("agents/sync/", AgentSyncView.as_view(), name="agent-sync")]
