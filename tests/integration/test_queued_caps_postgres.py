"""The cap on waiting jobs on the real Postgres under concurrency: racing clients of one user
(single and bulk submissions, each in its own thread and connection) never take the user past
TOPOWEB_MAX_QUEUED_PER_USER, and every refused submission queued nothing.

The window between counting and inserting is widened (each check sleeps after it took the user's
lock): without the lock every client would count the same queue and all of them would pass."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.placement.topology import read_spec_file
from apps.scheduling import accounts, cycle, services
from apps.scheduling.choices import WAITING_STATUSES
from apps.scheduling.models import Job
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

CAP = 20
CLIENTS = 20
WAIT_S = 120.0


def spec(name: str) -> dict:
    return {
        "version": 1,
        "name": name,
        "cluster": "case-4-4",
        "gpus": 2,
        "parallelism": {"tp": 1, "pp": 1, "dp": 2},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
    }


def test_racing_clients_of_one_user_stay_within_the_cap(transactional_db, settings, monkeypatch):
    settings.MAX_QUEUED_PER_USER = CAP
    topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    user = get_user_model().objects.create_user("racer")
    other = get_user_model().objects.create_user("bystander")
    # The jobs stay queued: no cycle places them while the clients race.
    monkeypatch.setattr(cycle, "request_cycle", lambda *args, **kwargs: False)
    for i in range(CAP - 8):
        services.job_submit(user=user, spec=spec(f"before-{i}"))
    original = accounts.queued_caps

    def slow_caps(who, *args):
        time.sleep(0.05)
        return original(who, *args)

    monkeypatch.setattr(accounts, "queued_caps", slow_caps)
    start = threading.Barrier(CLIENTS + 1)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        size = 1 + i % 3  # single submissions and bulk lists of 2 and 3
        try:
            start.wait(WAIT_S)
            if size == 1:
                services.job_submit(user=user, spec=spec(f"race-{i}"))
            else:
                services.job_submit_many(user=user, specs=[spec(f"race-{i}-{k}") for k in range(size)])
            result = "queued"
        except services.QueuedCapExceeded as exc:
            assert (exc.limit, exc.value) == ("TOPOWEB_MAX_QUEUED_PER_USER", CAP)
            assert exc.queued + size > CAP
            result = "refused"
        except Exception as exc:  # reported below, not lost in the thread
            result = repr(exc)
        finally:
            connection.close()
        with lock:
            outcomes.append((size, result))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    start.wait(WAIT_S)
    # Another user's submission is not held up by the racing user's lock.
    services.job_submit(user=other, spec=spec("bystander"))
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    assert {r for _, r in outcomes} <= {"queued", "refused"}, outcomes
    queued = Job.objects.filter(owner=user, status__in=WAITING_STATUSES).count()
    assert queued == CAP - 8 + sum(size for size, r in outcomes if r == "queued")
    assert queued <= CAP
    # The cap was reached, and by whole submissions only: every refused one would have gone past.
    assert any(r == "refused" for _, r in outcomes)
    assert all(queued + size > CAP for size, r in outcomes if r == "refused")


@pytest.mark.parametrize("where", ["qos", "account"])
def test_racing_members_of_one_account_stay_within_its_cap(transactional_db, monkeypatch, where):
    """A cap on an account's waiting jobs, a QOS's (MaxSubmitJobsPerAccount) or the account's own
    (`max_queued_jobs`), counts every member's: members racing each other (each locking only
    their own user row would let them all pass) stay within it."""
    from apps.scheduling.models import Account, AccountMembership, Qos

    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    team = Account.objects.create(name="team", max_queued_jobs=CAP if where == "account" else None)
    high = Qos.objects.create(
        cluster=cluster, name="high", max_queued_per_account=CAP if where == "qos" else None
    )
    team.qos.add(high)
    expected_limit = (
        "QOS high: queued jobs per account (team)" if where == "qos" else "account team: queued jobs"
    )
    members = [get_user_model().objects.create_user(f"member-{i}") for i in range(CLIENTS)]
    for user in members:
        AccountMembership.objects.create(user=user, account=team, is_default=True)
    monkeypatch.setattr(cycle, "request_cycle", lambda *args, **kwargs: False)
    original = accounts.queued_caps

    def slow_caps(who, *args):
        time.sleep(0.05)
        return original(who, *args)

    monkeypatch.setattr(accounts, "queued_caps", slow_caps)
    start = threading.Barrier(CLIENTS)
    outcomes: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        try:
            start.wait(WAIT_S)
            specs = [dict(spec(f"m{i}-{k}"), qos="high") for k in range(2)]
            services.job_submit_many(user=members[i], specs=specs)
            result = "queued"
        except services.QueuedCapExceeded as exc:
            assert exc.limit == expected_limit
            result = "refused"
        except Exception as exc:
            result = repr(exc)
        finally:
            connection.close()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    assert set(outcomes) <= {"queued", "refused"}, outcomes
    queued = Job.objects.filter(account=team, qos=high, status__in=WAITING_STATUSES).count()
    assert queued == 2 * outcomes.count("queued") == CAP
    assert outcomes.count("refused") == CLIENTS - CAP // 2
