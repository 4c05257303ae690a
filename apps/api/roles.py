"""The role set: four groups of Django model permissions that the admin site, the API and the
dashboard all check, so the three agree.

- viewer: reads everything, including every user's jobs, cycles and migration proposals.
- submitter: submits jobs and cancels their own (every signed-in user is one while
  `TOPOWEB_ANY_USER_SUBMITS` is on, the default).
- operator: a viewer who also changes cluster settings (policy, preemption, backfill), adds,
  changes and deletes QOS, drains and resumes nodes, cancels, starts, completes and fails any job, and applies or rejects migration proposals.
- admin: every permission on the topology and scheduling models: imports, replaces and deletes
  clusters, edits topology rows, creates launcher tokens.

A superuser has every permission; the staff flag alone only opens the admin site's door.

Beside the roles, a **coordinator** of an account (`AccountMembership.is_coordinator`, Slurm's
account coordinator) is an operator scoped to that account's jobs: cancels, holds, releases,
requeues and re-prioritises them, and chooses which of the account's QOS each member may use.
Everything cluster-wide (settings, drains, imports, QOS definitions) stays with the roles above.
Who coordinates what is the scheduling app's (`apps.scheduling.selectors.coordinates`); views
tell the permissions here through their `coordinates(user, obj)` method.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

APPS = ("topology", "scheduling")
VIEW_ALL = (
    "scheduling.view_job",
    "scheduling.view_schedulingcycle",
    "scheduling.view_migrationproposal",
    "scheduling.view_allocation",
    "topology.view_cluster",
    "topology.view_switch",
    "topology.view_link",
    "topology.view_node",
    "topology.view_nic",
    "topology.view_gpu",
    "topology.view_gpumodel",
    "topology.view_nvlinkdomain",
    "scheduling.view_nodehealth",
    "scheduling.view_rankrun",
)
ROLES: dict[str, tuple[str, ...]] = {
    "viewer": VIEW_ALL,
    "submitter": ("scheduling.add_job", "topology.view_cluster"),
    "operator": (
        *VIEW_ALL,
        "scheduling.add_job",
        "scheduling.change_job",
        "scheduling.change_migrationproposal",
        "topology.change_cluster",
        "scheduling.change_nodehealth",
        "scheduling.view_qos",
        "scheduling.add_qos",
        "scheduling.change_qos",
        "scheduling.delete_qos",
    ),
    # Every permission of APPS (see roles_ensure).
    "admin": (),
}

SUBMIT = "scheduling.add_job"
SEE_ALL_JOBS = "scheduling.view_job"
MANAGE_JOBS = "scheduling.change_job"
DECIDE_MIGRATIONS = "scheduling.change_migrationproposal"
SEE_CYCLES = "scheduling.view_schedulingcycle"
IMPORT_CLUSTERS = "topology.add_cluster"
CHANGE_CLUSTERS = "topology.change_cluster"
MANAGE_NODES = "scheduling.change_nodehealth"


def can(user: AbstractBaseUser | AnonymousUser | None, perm: str) -> bool:
    """True if `user` is signed in and holds `perm` (through a role, directly, or as superuser)."""
    return bool(user is not None and user.is_authenticated and user.has_perm(perm))


def can_submit(user) -> bool:
    """True if `user` may submit jobs: every signed-in user unless TOPOWEB_ANY_USER_SUBMITS is
    off, then the submitter role (or any role holding scheduling.add_job)."""
    if user is None or not user.is_authenticated:
        return False
    return settings.ANY_USER_SUBMITS or user.has_perm(SUBMIT)


def sees_all_jobs(user) -> bool:
    """True if `user` sees every user's jobs in full (viewer, operator, admin)."""
    return can(user, SEE_ALL_JOBS)


def roles_ensure() -> dict[str, int]:
    """Create or update the role groups and their permissions; returns each role's permission
    count. Idempotent: extra permissions an administrator added to a group are kept."""
    from django.contrib.auth.models import Group, Permission

    everything = Permission.objects.filter(content_type__app_label__in=APPS)
    counts = {}
    for role, names in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        if names:
            wanted = [
                p
                for p in everything.select_related("content_type")
                if f"{p.content_type.app_label}.{p.codename}" in names
            ]
        else:
            wanted = list(everything)
        group.permissions.add(*wanted)
        counts[role] = len(wanted)
    return counts


def roles_ensure_after_migrate(sender, **kwargs) -> None:
    """post_migrate receiver: the groups follow once the permissions exist."""
    if sender.label in APPS:
        roles_ensure()


def role_grant(*, user: AbstractBaseUser, role: str) -> None:
    """Add `user` to the role's group (creating the role groups if they are missing)."""
    from django.contrib.auth.models import Group

    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    group = Group.objects.filter(name=role).first()
    if group is None:
        roles_ensure()
        group = Group.objects.get(name=role)
    user.groups.add(group)
