"""A submission does not wait for a running scheduling cycle on the real Postgres.

Each job INSERT takes a key-share lock on its cluster's row (the foreign key check). The cycle
holds that row locked from its snapshot to its commit: with FOR UPDATE every submission waited
for the cycle to commit; with FOR NO KEY UPDATE it goes through, while cycles still exclude
each other.
"""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

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
    original = snap.cluster_snapshot

    def held_snapshot(*, cluster):
        # Called by the cycle with the cluster's row locked: hold the lock until released.
        locked.set()
        release.wait(WAIT_S * 3)
        return original(cluster=cluster)

    monkeypatch.setattr(snap, "cluster_snapshot", held_snapshot)
    monkeypatch.setattr(cycle, "request_cycle", lambda *args, **kwargs: False)
    cycled: dict = {}
    cycle_thread = in_thread(lambda: services.schedule_cluster(cluster=cluster), cycled)
    try:
        assert locked.wait(WAIT_S), "the cycle did not reach its snapshot"
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
