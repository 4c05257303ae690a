"""Who may do what: users their own jobs, staff everything, launchers their cluster's lifecycle."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from .authentication import launcher_of

LIFECYCLE_ACTIONS = frozenset({"start", "complete", "fail"})
LAUNCHER_JOB_ACTIONS = frozenset({"list", "retrieve", "placement", "rankmap"}) | LIFECYCLE_ACTIONS


def is_staff(request) -> bool:
    """True for an authenticated staff user."""
    user = getattr(request, "user", None)
    return bool(user and user.is_authenticated and user.is_staff)


def is_user(request) -> bool:
    """True for any authenticated user (not a launcher token)."""
    user = getattr(request, "user", None)
    return bool(user and user.is_authenticated)


class JobPermission(BasePermission):
    """Users read, submit and cancel their own jobs (the queryset hides others' jobs: 404);
    lifecycle actions need staff or a launcher token of the job's cluster; staff do anything."""

    message = "Job lifecycle actions need a staff user or the cluster's launcher token."

    def has_permission(self, request, view) -> bool:
        action = getattr(view, "action", None)
        if launcher_of(request) is not None:
            return action in LAUNCHER_JOB_ACTIONS
        if not is_user(request):
            return False
        if action in LIFECYCLE_ACTIONS:
            return is_staff(request)
        return True

    def has_object_permission(self, request, view, obj) -> bool:
        token = launcher_of(request)
        if token is not None:
            return obj.cluster_id == token.cluster_id
        return is_staff(request) or obj.owner_id == request.user.pk


class StaffWrites(BasePermission):
    """Reads for any authenticated user; writes for staff."""

    message = "Only staff may change this."

    def has_permission(self, request, view) -> bool:
        if not is_user(request):
            return False
        return request.method in SAFE_METHODS or is_staff(request)


class ClusterPermission(BasePermission):
    """Clusters: reads for users and launchers; writes for staff, or for a launcher on its own
    cluster (settings and topology re-import, not deletion)."""

    message = "Topology writes need a staff user or this cluster's launcher token."

    def has_permission(self, request, view) -> bool:
        token = launcher_of(request)
        if request.method in SAFE_METHODS:
            return token is not None or is_user(request)
        if is_staff(request):
            return True
        return token is not None and getattr(view, "action", None) in {
            "update",
            "partial_update",
            "import_spec",
        }

    def has_object_permission(self, request, view, obj) -> bool:
        token = launcher_of(request)
        if token is not None:
            return obj.pk == token.cluster_id
        return request.method in SAFE_METHODS or is_staff(request)
