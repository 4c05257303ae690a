"""Dashboard pages, mounted at the site root."""

from django.urls import path, re_path

from .views import cluster, imports, job, nodes, now, queue, search, usage, vendor

app_name = "dashboard"

urlpatterns = [
    path("", cluster.cluster_page, name="home"),
    path("clusters/", cluster.cluster_pick, name="cluster-pick"),
    path("clusters/<str:name>/", cluster.cluster_page, name="cluster"),
    path("clusters/<str:name>/version/", cluster.cluster_version, name="cluster-version"),
    path("clusters/<str:name>/measured/", cluster.cluster_measured, name="cluster-measured"),
    path("clusters/<str:name>/path/", cluster.cluster_path, name="cluster-path"),
    path("clusters/<str:name>/leaf-matrix/", cluster.cluster_leaf_matrix, name="cluster-leaf-matrix"),
    path(
        "clusters/<str:name>/node-health/drain/",
        nodes.node_health_decide,
        {"action": "drain"},
        name="node-drain",
    ),
    path(
        "clusters/<str:name>/node-health/resume/",
        nodes.node_health_decide,
        {"action": "resume"},
        name="node-resume",
    ),
    path("clusters/<str:name>/nodes/", nodes.node_list, name="nodes"),
    path("clusters/<str:name>/links/", nodes.links_page, name="links"),
    path("clusters/<str:name>/nodes/<str:node>/", nodes.node_page, name="node"),
    path("clusters/<str:name>/switches/<str:switch>/", nodes.switch_page, name="switch"),
    path("search/", search.search_page, name="search"),
    path("now/", now.now_page, name="now"),
    path("usage/", usage.usage_page, name="usage"),
    path("usage.csv", usage.usage_page, {"csv": True}, name="usage-csv"),
    path("welcome/", now.landing, name="landing"),
    path("queue/", queue.queue_page, name="queue"),
    path("jobs/<int:pk>/", job.job_page, name="job"),
    re_path(
        r"^jobs/(?P<pk>[0-9]{1,18})/(?P<action>cancel|hold|release|requeue|priority)/$",
        job.job_manage,
        name="job-manage",
    ),
    path(
        "jobs/<int:pk>/migrations/<int:proposal>/apply/",
        job.proposal_decide,
        {"action": "apply"},
        name="proposal-apply",
    ),
    path(
        "jobs/<int:pk>/migrations/<int:proposal>/reject/",
        job.proposal_decide,
        {"action": "reject"},
        name="proposal-reject",
    ),
    path("import/", imports.topology_import, name="import"),
    path(
        "vendor/plotly-basic-<str:version>.min.js",
        vendor.plotly_js,
        {"bundle": "basic"},
        name="plotly-basic-js",
    ),
    path("vendor/plotly-<str:version>.min.js", vendor.plotly_js, name="plotly-js"),
]
