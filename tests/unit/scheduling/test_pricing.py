"""Running jobs' predictions stay current: a link edited like the admin does re-prices the jobs
that cross it within one cycle of the periodic scheduler, and only those."""

import pytest

from apps.scheduling.demo import load_demo_jobs
from apps.scheduling.embedded import PeriodicScheduler
from apps.scheduling.models import Job
from apps.scheduling.pricing import active_jobs_reprice
from apps.topology.models import Link, Nic


def test_a_link_bandwidth_edit_reprices_the_jobs_crossing_it_within_one_cycle(pod256):
    load_demo_jobs()
    before = dict(Job.objects.filter(cluster=pod256).values_list("name", "predicted_step_ms"))
    for link in Link.objects.filter(cluster=pod256, a__name__in=["leaf-2", "leaf-3"]):
        link.bw_GBps = link.bw_GBps / 8  # what the admin's change form saves
        link.save()
    PeriodicScheduler(interval_s=3600).tick()
    after = dict(Job.objects.filter(cluster=pod256).values_list("name", "predicted_step_ms"))
    assert Job.objects.get(name="llm-tp8-dp2-naive").predicted["step_ms"] == after["llm-tp8-dp2-naive"]
    assert after["llm-tp8-dp2-naive"] > before["llm-tp8-dp2-naive"] + 10  # its DP ring crosses the spine
    unchanged = [n for n in before if n != "llm-tp8-dp2-naive" and before[n] is not None]
    assert all(after[n] == pytest.approx(before[n]) for n in unchanged)


def test_repricing_follows_a_nic_edit_and_then_changes_nothing(case44):
    load_demo_jobs()
    job = Job.objects.get(cluster=case44)
    assert job.predicted_step_ms == pytest.approx(209.09, abs=0.01)
    for nic in Nic.objects.filter(node__cluster=case44):
        nic.bw_GBps = 22.0
        nic.save()
    assert active_jobs_reprice(cluster=case44) == [job.pk]
    job.refresh_from_db()
    assert job.predicted_step_ms == pytest.approx(100 + 1.2e9 / 22e9 * 1e3, rel=1e-3)
    assert job.predicted["step_ms"] == pytest.approx(job.predicted_step_ms)
    assert active_jobs_reprice(cluster=case44) == []
