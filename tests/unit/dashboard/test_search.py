"""The header's search: jobs by id or name, nodes, switches, users; exact matches jump."""

from __future__ import annotations

from django.urls import reverse

from apps.dashboard.search import QUERY_MAX_CHARS
from apps.topology.models import Switch


def find(client, q, **extra):
    return client.get(reverse("dashboard:search"), {"q": q, **extra})


def test_exact_job_id_or_name_jumps_to_the_job(client, people, naive_case44):
    client.force_login(people["alice"])
    job_url = reverse("dashboard:job", args=[naive_case44.pk])
    for q in (str(naive_case44.pk), f"#{naive_case44.pk}", f"job {naive_case44.pk}", "bert-large-16"):
        response = find(client, q)
        assert response.status_code == 302 and response["Location"] == job_url, q


def test_exact_node_jumps_and_a_partial_name_lists_results(client, people, naive_case44):
    client.force_login(people["bob"])
    response = find(client, "node-a")
    assert response["Location"] == reverse("dashboard:node", args=["case-4-4", "node-a"])
    html = find(client, "node").content.decode()
    assert 'id="search-results"' in html and "node node-a (case-4-4)" in html and "node node-b" in html


def test_suggestions_as_json_with_the_exact_target(client, people, naive_case44):
    leaf = Switch.objects.filter(cluster=naive_case44.cluster, tier="leaf").first()
    client.force_login(people["ops"])
    body = find(client, leaf.name, format="json").json()
    assert body["exact"] == reverse("dashboard:switch", args=["case-4-4", leaf.name])
    assert body["results"][0] == {
        "kind": "switch",
        "label": f"leaf {leaf.name} (case-4-4)",
        "url": body["exact"],
        "exact": True,
    }
    users = find(client, "ali", format="json").json()
    assert [h["label"] for h in users["results"] if h["kind"] == "user"] == ["user alice: their jobs"]


def test_search_hides_other_users_jobs_and_names(client, people, naive_case44):
    client.force_login(people["bob"])
    body = find(client, "bert", format="json").json()
    assert body["results"] == []
    assert find(client, str(naive_case44.pk), format="json").json()["exact"] is None
    # A plain user finds only themselves among users.
    assert [
        h["label"] for h in find(client, "a", format="json").json()["results"] if h["kind"] == "user"
    ] == []
    assert find(client, "bob", format="json").json()["exact"] == "/queue/?owner=bob"


def test_query_length_is_bounded_and_patterns_are_literal(client, people, naive_case44):
    client.force_login(people["alice"])
    too_long = find(client, "x" * (QUERY_MAX_CHARS + 1), format="json")
    assert too_long.status_code == 400 and "q" in too_long.json()
    assert find(client, "x" * (QUERY_MAX_CHARS + 1)).status_code == 400
    # LIKE wildcards and regex syntax match only themselves.
    for q in ("%", "_", ".*", "node-%", "(", "\\"):
        assert find(client, q, format="json").json()["results"] == [], q
    assert find(client, "   ").status_code == 200


def test_job_hits_rank_exact_then_prefix_then_substring_newest_first_and_stop_at_the_limit(
    client, people, case44_db
):
    from apps.dashboard.search import PER_KIND
    from apps.scheduling import services

    from .conftest import job_spec

    alice = people["alice"]
    names = ["pre-llama", "llama-7b", "llama", "my-llama", "llama-13b"] + [
        f"x-llama-{i}" for i in range(PER_KIND)
    ]
    jobs = {n: services.job_submit(user=alice, spec=job_spec(2, name=n), cluster=case44_db) for n in names}
    client.force_login(alice)
    labels = [
        h["label"] for h in find(client, "LLAMA", format="json").json()["results"] if h["kind"] == "job"
    ]
    newest_substring = [f"x-llama-{i}" for i in reversed(range(PER_KIND))]
    expected = ["llama", "llama-13b", "llama-7b", *newest_substring][:PER_KIND]
    assert labels == [f"job {jobs[n].pk} · {n} (alice)" for n in expected]
