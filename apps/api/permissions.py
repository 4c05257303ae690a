"""Who may do what, by Django model permissions (the role set in roles.py), so the admin site and
the API agree; launcher tokens by the actions a view grants them on their own cluster."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission, DjangoModelPermissions

from . import roles
from .authentication import launcher_of

LIFECYCLE_ACTIONS = frozenset({"start", "complete", "fail"})
# Operators' actions on a job that its account's coordinators may take too (and its owner, cancel).
MANAGE_ACTIONS = frozenset({"cancel", "hold", "release", "requeue", "priority_change"})
JOB_READS = frozenset({"list", "retrieve", "placement", "rankmap"})


def cluster_id_of(obj) -> int | None:
    """The cluster an object belongs to: its `cluster_id`, or its own pk for a cluster."""
    if hasattr(obj, "cluster_id"):
        return obj.cluster_id
    job = getattr(obj, "job", None)
    if job is not None:
        return job.cluster_id
    return obj.pk if obj._meta.model_name == "cluster" else None


class LauncherTokenPermission(BasePermission):
    """A launcher token may call the view actions in `launcher_actions` (a view attribute, or this
    class's default) on objects of its own cluster, and nothing else. Compose it with a user
    permission: `permission_classes = [LauncherTokenPermission | JobPermission]`."""

    message = "A launcher token may only start, complete or fail its own cluster's jobs."
    launcher_actions: frozenset[str] = JOB_READS | LIFECYCLE_ACTIONS

    def has_permission(self, request, view) -> bool:
        if launcher_of(request) is None:
            return False
        allowed = getattr(view, "launcher_actions", self.launcher_actions)
        return getattr(view, "action", None) in allowed

    def has_object_permission(self, request, view, obj) -> bool:
        token = launcher_of(request)
        return token is not None and cluster_id_of(obj) == token.cluster_id


class JobPermission(BasePermission):
    """Users (never launchers): reads for any signed-in user (the queryset hides other users' jobs
    unless the user may see all or coordinates their account); submit with `can_submit`; cancel
    their own jobs; cancel, hold, release, requeue and re-prioritise any job with
    scheduling.change_job (operators) or, when the view's `coordinates(user, job)` says so, as
    its account's coordinator; the lifecycle actions (start, complete, fail) always need
    scheduling.change_job."""

    message = (
        "This needs the operator role (scheduling.change_job), a coordinator of the job's account,"
        " or (to cancel) your own job."
    )

    def has_permission(self, request, view) -> bool:
        user = request.user
        if launcher_of(request) is not None or not user.is_authenticated:
            return False
        action = getattr(view, "action", None)
        if action == "create":
            return roles.can_submit(user)
        if action in LIFECYCLE_ACTIONS:
            return roles.can(user, roles.MANAGE_JOBS)
        return True

    def has_object_permission(self, request, view, obj) -> bool:
        user = request.user
        if roles.can(user, roles.MANAGE_JOBS):
            return True
        action = getattr(view, "action", None)
        if action in LIFECYCLE_ACTIONS:
            return False
        if request.method in SAFE_METHODS:
            return True  # the queryset shows only the jobs the user may see
        coordinates = getattr(view, "coordinates", None)
        if action in MANAGE_ACTIONS and coordinates is not None and coordinates(user, obj):
            return True
        return action == "cancel" and obj.owner_id == user.pk


def holds(perm: str) -> type[BasePermission]:
    """A permission class: a signed-in user holding `perm` (e.g. "scheduling.view_schedulingcycle")."""

    class Holds(BasePermission):
        message = f"This needs the {perm} permission."

        def has_permission(self, request, view) -> bool:
            return roles.can(request.user, perm)

    Holds.__name__ = Holds.__qualname__ = f"Holds({perm})"
    return Holds


class ModelPermissions(DjangoModelPermissions):
    """Django's model permissions as the admin site applies them: reads for any signed-in user,
    POST add, PUT and PATCH change, DELETE delete. Launcher tokens are anonymous here: refused."""

    authenticated_users_only = True
