"""`manage.py reconcile --check` names what does not converge and exits 1; a healthy cluster 0."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.scheduling import services
from apps.scheduling.choices import JobStatus, RankState
from apps.scheduling.models import Allocation, Job, RankRun
from apps.topology.models import Node

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def check(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("reconcile", "--check", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


def test_a_healthy_cluster_has_no_findings(case44, alice, committed):
    committed(services.job_submit, user=alice, spec=small_spec("j", 8))
    assert check() == (0, "0 findings\n")


def test_each_kind_of_drift_is_named_and_fails_the_check(case44, alice, committed):
    booked = committed(services.job_submit, user=alice, spec=small_spec("booked", 8))
    # Rows written behind the lifecycle's back: a finished job still booking its GPUs ...
    Job.objects.filter(pk=booked.pk).update(status=JobStatus.FAILED)
    doubled = committed(services.job_submit, user=alice, spec=small_spec("doubled", 8))
    node = Node.objects.get(cluster=case44, name=Allocation.objects.filter(job=doubled).first().node_name)
    # ... a job with ranks of two generations running, one told to stop long ago ...
    long_ago = timezone.now() - timedelta(hours=2)
    RankRun.objects.create(job=doubled, generation=1, rank=0, node=node, state=RankState.STARTED)
    RankRun.objects.create(
        job=doubled, generation=0, rank=0, node=node, state=RankState.STARTED, stop_requested_at=long_ago
    )
    code, out = check("--cluster", "case-4-4")
    assert code == 1
    assert out.count("booked-without-rank") == 8
    assert f"job {booked.pk} generation 1" in out
    assert f"case-4-4: two-generations: job {doubled.pk} runs ranks of 2 generations at once" in out
    assert f"stop-overdue: rank 0 of job {doubled.pk} generation 0" in out
    assert out.endswith("10 findings\n")


def test_an_unknown_cluster_is_an_error_naming_the_option(case44):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="cluster: no cluster named 'nope'"):
        call_command("reconcile", "--check", "--cluster", "nope", stdout=StringIO())
