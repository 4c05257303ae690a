"""The header's search: jobs (by id or name), nodes, switches, clusters and users, as `user` may see
them. Matching is a bounded, case-insensitive substring (the ORM escapes it); an exact name or id
is marked so the search can jump straight to it."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from django.contrib.auth import get_user_model
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.urls import reverse
from django.utils.http import urlencode

from apps.api import roles
from apps.dashboard.selectors import job_label, visible_jobs
from apps.topology.models import Cluster, Node, Switch

QUERY_MAX_CHARS = 100
PER_KIND = 8
# "12", "#12", "job 12", "job #12": a job id.
JOB_ID = re.compile(r"^(?:job\s*)?#?(\d{1,12})$", re.IGNORECASE)


@dataclass(frozen=True)
class SearchHit:
    """One result: what it is, how it reads, where it goes, and whether the query named it exactly."""

    kind: str
    label: str
    url: str
    exact: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _prefix_first(qs: QuerySet, field: str, query: str) -> QuerySet:
    # Exact names first, then names starting with the query, then the rest, each by name.
    rank = Case(
        When(**{f"{field}__iexact": query}, then=Value(0)),
        When(**{f"{field}__istartswith": query}, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    return qs.filter(**{f"{field}__icontains": query}).annotate(hit_rank=rank).order_by("hit_rank", field)


def search(*, user, query: str) -> list[SearchHit]:
    """Up to PER_KIND hits of each kind for `query` (at most QUERY_MAX_CHARS characters, checked
    by the caller): jobs `user` may open, nodes, switches, clusters, and users (every user for
    those who see all jobs, else only themselves)."""
    query = query.strip()
    if not query:
        return []
    hits: list[SearchHit] = []
    jobs = visible_jobs(user)
    if m := JOB_ID.match(query):
        job = jobs.filter(pk=int(m.group(1))).first()
        if job is not None:
            hits.append(SearchHit("job", job_label(user, job), reverse("dashboard:job", args=[job.pk]), True))
    for job in _prefix_first(jobs, "name", query)[:PER_KIND]:
        if not any(h.kind == "job" and h.url.endswith(f"/{job.pk}/") for h in hits):
            url = reverse("dashboard:job", args=[job.pk])
            hits.append(SearchHit("job", job_label(user, job), url, job.name == query))
    for node in _prefix_first(Node.objects.select_related("cluster"), "name", query)[:PER_KIND]:
        url = reverse("dashboard:node", args=[node.cluster.name, node.name])
        hits.append(SearchHit("node", f"node {node.name} ({node.cluster.name})", url, node.name == query))
    for switch in _prefix_first(Switch.objects.select_related("cluster"), "name", query)[:PER_KIND]:
        url = reverse("dashboard:switch", args=[switch.cluster.name, switch.name])
        label = f"{switch.tier} {switch.name} ({switch.cluster.name})"
        hits.append(SearchHit("switch", label, url, switch.name == query))
    for name in _prefix_first(Cluster.objects.all(), "name", query).values_list("name", flat=True)[:PER_KIND]:
        hits.append(
            SearchHit("cluster", f"cluster {name}", reverse("dashboard:cluster", args=[name]), name == query)
        )
    users = get_user_model().objects.filter(is_active=True)
    if not roles.sees_all_jobs(user):
        users = users.filter(pk=user.pk)
    field = get_user_model().USERNAME_FIELD
    for name in _prefix_first(users, field, query).values_list(field, flat=True)[:PER_KIND]:
        url = reverse("dashboard:queue") + "?" + urlencode({"owner": name})
        hits.append(SearchHit("user", f"user {name}: their jobs", url, name == query))
    return hits


def exact_target(hits: list[SearchHit]) -> str | None:
    """The one place an exact query names, or None when it names none or several."""
    exact = {h.url for h in hits if h.exact}
    return exact.pop() if len(exact) == 1 else None
