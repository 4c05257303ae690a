"""Root URLs: admin, login, REST API v1 with its OpenAPI schema and docs, health check, dashboard."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.dashboard.api import UsageView
from apps.metrics.ops import metrics_view
from topoweb.views import healthz

admin.site.site_header = "TopoWeb topology editor"
admin.site.site_title = "TopoWeb admin"

urlpatterns = [
    # First: the agents' sync is most of the requests (every node, every poll).
    path("api/v1/", include("apps.executors.agents.api.urls")),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/usage/", UsageView.as_view(), name="usage-api"),
    path("api/v1/", include("apps.topology.api.urls")),
    path("api/v1/", include("apps.scheduling.api.urls")),
    path("api/v1/", include("apps.metrics.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("simulations/", include("apps.simulations.urls")),
    path("", include("apps.dashboard.urls")),
]

handler404 = "apps.api.views.not_found"
