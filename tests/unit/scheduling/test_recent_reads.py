"""A REST submission reuses what this process read about its submitter a moment ago (their account,
the QOS they may use, the executor's owner check: three queries fewer), sees its own process's
changes at once and others' within RECENT_S, is never refused because of a kept answer, and never
passes a cap on waiting jobs set meanwhile by another process: the caps are read afresh with the
submitter's lock."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.scheduling import cycle, recent, services
from apps.scheduling.choices import WAITING_STATUSES
from apps.scheduling.models import Account, AccountMembership, Job, Qos

from .conftest import small_spec

# Outside a test transaction: a submission committed by itself is the one that may reuse answers.
pytestmark = pytest.mark.django_db(transaction=True)

READS = ("scheduling_accountmembership", "scheduling_qos", "executors_clusterexecutor")


@pytest.fixture(autouse=True)
def no_cycles(monkeypatch):
    """The jobs stay queued (no cycle runs on commit): the queries counted are the submission's."""
    monkeypatch.setattr(cycle, "request_cycle", lambda *args, **kwargs: False)


@pytest.fixture
def team(case44, alice):
    """Account research (alice's default) may use normal and high on case-4-4."""
    research = Account.objects.create(name="research", share=1)
    AccountMembership.objects.create(user=alice, account=research, is_default=True)
    high = Qos.objects.create(cluster=case44, name="high", priority=50)
    research.qos.add(Qos.objects.get(cluster=case44, name="normal"), high)
    return research, high


def reads(queries) -> int:
    """Queries of the submitter's account, QOS or the cluster's executor (not the user's lock,
    which reads the caps afresh)."""
    return sum(
        any(f'FROM "{table}"' in q["sql"] for table in READS) and 'FROM "auth_user"' not in q["sql"]
        for q in queries.captured_queries
    )


def submit(user, name: str, **extra) -> Job:
    return services.job_submit(user=user, spec=small_spec(name, 1, **extra))


def test_a_second_submission_reads_no_account_qos_or_executor(team, alice):
    research, high = team
    with CaptureQueriesContext(connection) as first:
        submit(alice, "first", qos="high")
    assert reads(first) == 3
    with CaptureQueriesContext(connection) as second:
        job = submit(alice, "second", qos="high")
    assert reads(second) == 0
    job = Job.objects.get(pk=job.pk)
    assert (job.account, job.qos) == (research, high)


def test_a_change_made_in_this_process_is_seen_at_once(team, case44, alice):
    research, _ = team
    assert submit(alice, "a").account == research
    other = Account.objects.create(name="other", share=1)
    AccountMembership.objects.filter(user=alice).update(is_default=False)
    AccountMembership.objects.create(user=alice, account=other, is_default=True)
    assert submit(alice, "b").account == other


def test_another_process_change_is_seen_after_recent_s(team, alice, clock):
    research, _ = team
    other = Account.objects.create(name="other", share=1)
    assert submit(alice, "a").account == research
    clock[0] += 0.1
    # UPDATEs and bulk INSERTs send no signal here, as changes made by another process.
    AccountMembership.objects.filter(user=alice).update(is_default=False)
    AccountMembership.objects.bulk_create([AccountMembership(user=alice, account=other, is_default=True)])
    clock[0] += recent.RECENT_S * 0.8
    assert submit(alice, "kept").account == research
    clock[0] += recent.RECENT_S * 0.3
    assert submit(alice, "fresh").account == other


def test_a_kept_answer_never_costs_a_refusal(team, case44, alice):
    research, _ = team
    submit(alice, "a")
    # Another process lets the account use a new QOS: the kept answer does not list it.
    gold = Qos.objects.create(cluster=case44, name="gold")
    recent_qos = Account.qos.through
    recent_qos.objects.bulk_create([recent_qos(account_id=research.pk, qos_id=gold.pk)])
    # (Creating the QOS here forgot the kept answers; keep one again, then change the list.)
    submit(alice, "b")
    silver = Qos.objects.bulk_create([Qos(cluster=case44, name="silver")])[0]
    recent_qos.objects.bulk_create([recent_qos(account_id=research.pk, qos_id=silver.pk)])
    assert submit(alice, "c", qos="silver").qos.name == "silver"
    # A refusal that a fresh read confirms is still one.
    with pytest.raises(services.SpecError) as exc:
        submit(alice, "d", qos="nonesuch")
    assert exc.value.errors[0][0] == "qos"


@pytest.mark.parametrize("where", ["qos", "account"])
def test_a_cap_set_by_another_process_holds_at_once(team, alice, where):
    research, high = team
    submit(alice, "a", qos="high")
    submit(alice, "b", qos="high")
    # Another process sets a cap of 2 (an UPDATE: no signal, the kept rows have no cap).
    if where == "qos":
        Qos.objects.filter(pk=high.pk).update(max_queued_per_user=2)
        limit = "QOS high: queued jobs per user"
    else:
        Account.objects.filter(pk=research.pk).update(max_queued_jobs=2)
        limit = "account research: queued jobs"
    with pytest.raises(services.QueuedCapExceeded) as exc:
        submit(alice, "c", qos="high")
    assert (exc.value.limit, exc.value.value, exc.value.queued) == (limit, 2, 2)
    assert Job.objects.filter(owner=alice, status__in=WAITING_STATUSES).count() == 2
    # Raised again elsewhere: the kept cap of 2 does not refuse.
    Qos.objects.filter(pk=high.pk).update(max_queued_per_user=None)
    Account.objects.filter(pk=research.pk).update(max_queued_jobs=None)
    submit(alice, "d", qos="high")


def test_a_lowered_cap_reports_the_count_up_to_one_past_it(case44, alice, settings):
    for i in range(4):
        submit(alice, f"j{i}")
    settings.MAX_QUEUED_PER_USER = 2
    with pytest.raises(services.QueuedCapExceeded) as exc:
        submit(alice, "over")
    assert (exc.value.value, exc.value.queued, exc.value.adding) == (2, 3, 1)
    assert Job.objects.filter(owner=alice).count() == 4


def test_caps_unchanged_since_they_were_kept_cost_no_second_try(team, alice):
    research, high = team
    Account.objects.filter(pk=research.pk).update(max_queued_jobs=9)
    Qos.objects.filter(pk=high.pk).update(max_queued_per_user=5, max_queued_per_account=7)
    submit(alice, "a", qos="high")
    with CaptureQueriesContext(connection) as queries:
        submit(alice, "b", qos="high")
    assert reads(queries) == 0
    # Each cap counted, and enforced: the user's cap in the QOS is the lowest.
    for i in range(3):
        submit(alice, f"c{i}", qos="high")
    with pytest.raises(services.QueuedCapExceeded) as exc:
        submit(alice, "over", qos="high")
    assert (exc.value.limit, exc.value.queued) == ("QOS high: queued jobs per user", 5)
