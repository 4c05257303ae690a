"""A submission's INSERT on the real Postgres: sent with the caps' lock and count in one round trip
(`lifecycle.submit_statement`), writing what `Model.save` writes; by itself before an account's
lock when a cap counts the account's jobs; through `save` when something listens for a Job's
save signals."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext

from apps.placement.topology import read_spec_file
from apps.scheduling import lifecycle, services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Account, AccountMembership, Job
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

INSERT = 'INSERT INTO "scheduling_job"'


def spec(name: str, **extra) -> dict:
    return {
        "version": 1,
        "name": name,
        "cluster": "case-4-4",
        "gpus": 2,
        "parallelism": {"tp": 1, "pp": 1, "dp": 2},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
        "estimated_runtime_s": 600,
        **extra,
    }


@pytest.fixture
def setup(db):
    topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    return get_user_model().objects.create_user("submitter")


def inserts(queries) -> list[str]:
    return [q["sql"] for q in queries if INSERT in q["sql"]]


def test_the_insert_goes_with_the_lock_and_the_count(setup):
    with CaptureQueriesContext(connection) as ctx:
        job = services.job_submit(user=setup, spec=spec("one"))
    (sql,) = inserts(ctx.captured_queries)
    assert "FOR NO KEY UPDATE" in sql and "COUNT(*)" in sql
    assert sql.index(INSERT) < sql.index("FOR NO KEY UPDATE") < sql.index("COUNT(*)")
    assert job.pk is not None and not job._state.adding
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED


def test_the_statement_writes_what_save_writes(setup, monkeypatch):
    by_statement = services.job_submit(user=setup, spec=spec("same", priority=3))
    monkeypatch.setattr(lifecycle, "submit_statement", lambda job: None)
    with CaptureQueriesContext(connection) as ctx:
        by_save = services.job_submit(user=setup, spec=spec("same", priority=3))
    (sql,) = inserts(ctx.captured_queries)
    assert "FOR NO KEY UPDATE" not in sql  # the ORM's save, on its own
    rows = {j["id"]: j for j in Job.objects.filter(pk__in=[by_statement.pk, by_save.pk]).values()}
    a, b = rows.pop(by_statement.pk), rows.pop(by_save.pk)
    for row in (a, b):
        row.pop("id")
        row.pop("submitted_at")
    assert a == b
    assert by_statement.submitted_at == Job.objects.get(pk=by_statement.pk).submitted_at


def test_with_an_account_cap_the_insert_comes_before_the_accounts_lock(setup):
    team = Account.objects.create(name="team", max_queued_jobs=1)
    AccountMembership.objects.create(user=setup, account=team, is_default=True)
    with CaptureQueriesContext(connection) as ctx:
        services.job_submit(user=setup, spec=spec("first"))
    sqls = [q["sql"] for q in ctx.captured_queries]
    (insert,) = inserts(ctx.captured_queries)
    account_lock = next(
        i for i, s in enumerate(sqls) if '"scheduling_account"' in s and "FOR NO KEY UPDATE" in s
    )
    assert "FOR NO KEY UPDATE" not in insert
    assert sqls.index(insert) < account_lock
    with pytest.raises(services.QueuedCapExceeded):
        services.job_submit(user=setup, spec=spec("second"))
    assert Job.objects.filter(owner=setup).count() == 1


def test_a_listener_of_job_saves_hears_every_submission(setup):
    heard = []

    def listener(sender, instance, created, **kwargs):
        heard.append((instance.name, created))

    post_save.connect(listener, sender=Job, dispatch_uid="test.submit_statement")
    try:
        services.job_submit(user=setup, spec=spec("heard"))
    finally:
        post_save.disconnect(dispatch_uid="test.submit_statement", sender=Job)
    assert heard == [("heard", True)]
