"""The header's search: jobs (by id or name), nodes, switches, clusters and users, as `user` may see
them. Matching is a bounded, case-insensitive substring (the ORM escapes it); an exact name or id
is marked so the search can jump straight to it."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
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


def _ranked(qs: QuerySet, field: str, query: str, order: str) -> list:
    """Up to PER_KIND rows of `qs` whose `field` holds `query`: exact names first, then names
    starting with it, then the rest, each tier by `order`. Every tier is its own query cut to
    PER_KIND (rows an earlier tier took are dropped here, not excluded in SQL: a planner cannot
    estimate "contains but does not start with" and may scan the whole table for it), so a
    one-letter query on a million jobs reads a few rows instead of ranking every match."""
    rows: list = []
    for lookup in ("iexact", "istartswith", "icontains"):
        for row in qs.filter(**{f"{field}__{lookup}": query}).order_by(order)[:PER_KIND]:
            if row not in rows:
                rows.append(row)
        if len(rows) >= PER_KIND:
            break
    return rows[:PER_KIND]


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
    # Newest first: the job an operator looks for is most likely a recent one.
    for job in _ranked(jobs, "name", query, "-pk"):
        if not any(h.kind == "job" and h.url.endswith(f"/{job.pk}/") for h in hits):
            url = reverse("dashboard:job", args=[job.pk])
            hits.append(SearchHit("job", job_label(user, job), url, job.name == query))
    for node in _ranked(Node.objects.select_related("cluster"), "name", query, "name"):
        url = reverse("dashboard:node", args=[node.cluster.name, node.name])
        hits.append(SearchHit("node", f"node {node.name} ({node.cluster.name})", url, node.name == query))
    for switch in _ranked(Switch.objects.select_related("cluster"), "name", query, "name"):
        url = reverse("dashboard:switch", args=[switch.cluster.name, switch.name])
        label = f"{switch.tier} {switch.name} ({switch.cluster.name})"
        hits.append(SearchHit("switch", label, url, switch.name == query))
    for name in _ranked(Cluster.objects.values_list("name", flat=True), "name", query, "name"):
        hits.append(
            SearchHit("cluster", f"cluster {name}", reverse("dashboard:cluster", args=[name]), name == query)
        )
    users = get_user_model().objects.filter(is_active=True)
    if not roles.sees_all_jobs(user):
        users = users.filter(pk=user.pk)
    field = get_user_model().USERNAME_FIELD
    for name in _ranked(users.values_list(field, flat=True), field, query, field):
        url = reverse("dashboard:queue") + "?" + urlencode({"owner": name})
        hits.append(SearchHit("user", f"user {name}: their jobs", url, name == query))
    return hits


def exact_target(hits: list[SearchHit]) -> str | None:
    """The one place an exact query names, or None when it names none or several."""
    exact = {h.url for h in hits if h.exact}
    return exact.pop() if len(exact) == 1 else None
