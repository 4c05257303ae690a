"""Submissions on the real Postgres: they do not wait for a running scheduling cycle, and the
one INSERT committed by itself recovers from a refused key.

Each job INSERT takes a key-share lock on its cluster's row (the foreign key check). The cycle
holds that row locked from its snapshot to its commit: with FOR UPDATE every submission waited
for the cycle to commit; with FOR NO KEY UPDATE it goes through, while cycles still exclude
each other.
"""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection

from apps.placement.topology import read_spec_file
from apps.scheduling import cycle, services
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

WAIT_S = 10.0


def spec(name: str) -> dict:
    return {
        "version": 1,
        "name": name,
        "cluster": "pod-256",
        "gpus": 8,
        "parallelism": {"tp": 8, "pp": 1, "dp": 1},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}],
    }


def in_thread(target, out: dict) -> threading.Thread:
    """`target()` in a thread with its own database connection; its result or error in `out`."""

    def run() -> None:
        try:
            out["result"] = target()
        except Exception as exc:  # reported by the test, not lost in the thread
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_submission_goes_through_while_a_cycle_holds_the_cluster(transactional_db, monkeypatch):
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))
    user = get_user_model().objects.create_user("submitter")
    services.job_submit(user=user, spec=spec("queued-before"))
    locked, release = threading.Event(), threading.Event()
    original = snap.queued_jobs

    def held_queue(**kwargs):
        # Called by the cycle with the cluster's row locked: hold the lock until released.
        locked.set()
        release.wait(WAIT_S * 3)
        return original(**kwargs)

    monkeypatch.setattr(snap, "queued_jobs", held_queue)
    monkeypatch.setattr(cycle, "request_cycle", lambda *args, **kwargs: False)
    cycled: dict = {}
    cycle_thread = in_thread(lambda: services.schedule_cluster(cluster=cluster), cycled)
    try:
        assert locked.wait(WAIT_S), "the cycle did not reach its queue"
        submitted: dict = {}
        submit_thread = in_thread(
            lambda: services.job_submit(user=user, spec=spec("during-cycle")), submitted
        )
        submit_thread.join(WAIT_S)
        assert not submit_thread.is_alive(), "the submission waited for the cycle's lock on the cluster"
        assert "error" not in submitted, submitted
        assert submitted["result"].status == JobStatus.QUEUED
    finally:
        release.set()
        cycle_thread.join(WAIT_S * 3)
    assert "error" not in cycled, cycled
    assert cycled["result"].status == CycleStatus.COMPLETED
    assert cycled["result"].placed >= 1


def test_a_refused_insert_outside_a_transaction_leaves_the_connection_usable(transactional_db, monkeypatch):
    # A submission outside a transaction is one INSERT committed by itself: when the unique key
    # refuses it (a concurrent retry with the same Idempotency-Key won), the next query works and
    # job_submit_once answers with the winner's job.
    topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))
    user = get_user_model().objects.create_user("retrier")
    monkeypatch.setattr(cycle, "request_cycle", lambda *args, **kwargs: False)
    body = spec("keyed")
    first, replayed = services.job_submit_once(user=user, spec=body, idempotency_key="k-1")
    assert not replayed
    digest = services.submission_digest(spec=body, cluster_name=None)
    assert not connection.in_atomic_block
    with pytest.raises(IntegrityError):
        services.job_submit(user=user, spec=body, idempotency=("k-1", digest))
    assert services.Job.objects.filter(owner=user).count() == 1
    again, replayed = services.job_submit_once(user=user, spec=body, idempotency_key="k-1")
    assert (again.pk, replayed) == (first.pk, True)
