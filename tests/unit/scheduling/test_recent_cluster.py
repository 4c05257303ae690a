"""Submissions reuse the cluster row this process read a moment ago (one query and a fifth of a
submission's CPU fewer), see their own process's changes at once, others' within
RECENT_CLUSTER_S, and are never lost to a row that changed meanwhile."""

from __future__ import annotations

import copy

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.placement.topology import SpecError, read_spec_file
from apps.scheduling import services
from apps.scheduling.models import Job
from apps.topology import selectors as topology_selectors
from apps.topology import services as topology_services
from apps.topology.models import Cluster, Node, touch_cluster

from .conftest import EXAMPLES, small_spec

# Outside a test transaction: a submission committed by itself is the one that may reuse the row.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def nothing_kept():
    topology_selectors.forget_recent_clusters()
    yield
    topology_selectors.forget_recent_clusters()


def lookups_by_name(queries) -> int:
    return sum('"topology_cluster"."name" =' in q["sql"] for q in queries.captured_queries)


def test_a_second_submission_reads_no_cluster_row(case44, alice):
    services.job_submit(user=alice, spec=small_spec("first", 1))
    with CaptureQueriesContext(connection) as queries:
        job = services.job_submit(user=alice, spec=small_spec("second", 1))
    assert lookups_by_name(queries) == 0
    assert job.cluster_id == case44.pk and Job.objects.filter(name="second", cluster=case44).exists()


def test_a_change_made_in_this_process_is_seen_at_once(case44, alice, clock):
    kept = topology_selectors.cluster_named("case-4-4", recent=True)
    assert topology_selectors.cluster_named("case-4-4", recent=True) is kept
    case44.policy = "naive"
    case44.save()
    assert topology_selectors.cluster_named("case-4-4", recent=True).policy == "naive"
    kept = topology_selectors.cluster_named("case-4-4", recent=True)
    touch_cluster(case44.pk)
    assert topology_selectors.cluster_named("case-4-4", recent=True) is not kept


def test_another_process_change_is_seen_after_recent_cluster_s(case44, clock):
    kept = topology_selectors.cluster_named("case-4-4", recent=True)
    # An UPDATE sends no signal here, as a change made by another process.
    Cluster.objects.filter(pk=case44.pk).update(policy="naive")
    clock[0] += topology_selectors.RECENT_CLUSTER_S * 0.9
    assert topology_selectors.cluster_named("case-4-4", recent=True) is kept
    clock[0] += topology_selectors.RECENT_CLUSTER_S * 0.2
    assert topology_selectors.cluster_named("case-4-4", recent=True).policy == "naive"
    assert topology_selectors.cluster_named("case-4-4").policy == "naive"


def test_a_row_deleted_by_another_process_costs_no_submission(case44, alice):
    topology_selectors.cluster_named("case-4-4", recent=True)
    # What another process leaves this one holding: the row of a cluster since deleted and
    # imported again under the same name (a new id).
    gone = copy.copy(case44)
    gone.pk = case44.pk + 1000
    topology_selectors._recent["case-4-4"] = (float("inf"), gone)
    job = services.job_submit(user=alice, spec=small_spec("lands", 2))
    assert job.cluster_id == case44.pk
    assert Job.objects.get(name="lands").cluster_id == case44.pk
    # And the stale row is gone: the next submission reuses the fresh one.
    assert topology_selectors.cluster_named("case-4-4", recent=True).pk == case44.pk


def test_a_grown_cluster_takes_what_the_kept_row_would_refuse(case44, alice):
    Node.objects.filter(cluster=case44, name="node-b").delete()
    kept = topology_selectors.cluster_named("case-4-4", recent=True)
    eight = topology_services.cluster_topology(cluster=kept, fresh=True)
    assert eight.n_gpus == 8
    topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"), replace=True)
    # What another process still holds after this import: the row it read and its topology.
    topology_selectors._recent["case-4-4"] = (float("inf"), kept)
    topology_services._CACHE[case44.pk] = (kept.updated_at, eight)
    job = services.job_submit(user=alice, spec=small_spec("sixteen", 16))
    assert job.gpus == 16 and Job.objects.filter(name="sixteen").exists()


def test_a_bad_spec_is_refused_with_one_more_query_and_nothing_else(case44, alice):
    kept = topology_selectors.cluster_named("case-4-4", recent=True)
    topology_services.cluster_topology(cluster=kept, fresh=True)
    with CaptureQueriesContext(connection) as queries, pytest.raises(SpecError) as refused:
        services.job_submit(user=alice, spec=small_spec("huge", 64))
    assert refused.value.errors[0][0] == "gpus"
    # The kept row is checked once (it is current), and nothing is written.
    assert len(queries) == 1 and not Job.objects.exists()
