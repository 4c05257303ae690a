"""Writes that lose SQLite's write lock are retried; other errors and broken transactions are not.
The embedded database runs in WAL mode so that readers never wait for the writer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import DatabaseError, IntegrityError, OperationalError, transaction

from apps.topology.retry import is_lock_error, retry_when_locked

REPO = Path(__file__).resolve().parents[3]


class Flaky:
    """Fails with `error` the first `failures` calls, then answers "done"."""

    def __init__(self, failures: int, error: Exception | None = None):
        self.failures, self.calls = failures, 0
        self.error = error or OperationalError("database is locked")

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def test_a_locked_write_is_retried_with_growing_waits():
    fn, waits = Flaky(3), []
    assert retry_when_locked(fn, sleep=waits.append, first_delay_s=0.01) == "done"
    assert fn.calls == 4
    assert len(waits) == 3
    # Doubling with up to 100% jitter: each wait lies in [d, 2d) for d = 0.01, 0.02, 0.04.
    for wait, base in zip(waits, (0.01, 0.02, 0.04), strict=True):
        assert base <= wait < 2 * base


def test_it_gives_up_after_the_last_attempt_with_the_lock_error():
    fn, waits = Flaky(10), []
    with pytest.raises(OperationalError, match="database is locked"):
        retry_when_locked(fn, attempts=3, sleep=waits.append)
    assert fn.calls == 3 and len(waits) == 2


@pytest.mark.parametrize(
    "error",
    [OperationalError("no such table: x"), IntegrityError("UNIQUE constraint failed"), ValueError("bad")],
)
def test_other_errors_are_not_retried(error):
    fn = Flaky(1, error)
    with pytest.raises(type(error)):
        retry_when_locked(fn, sleep=lambda s: pytest.fail("slept"))
    assert fn.calls == 1


def test_lock_errors_are_recognised_by_message():
    assert is_lock_error(OperationalError("database is locked"))
    assert is_lock_error(OperationalError("database table is locked: metrics_gpulatest"))
    assert not is_lock_error(OperationalError("disk I/O error"))
    assert not is_lock_error(DatabaseError("database is locked"))


@pytest.mark.django_db
def test_inside_an_outer_transaction_the_error_propagates_at_once():
    fn = Flaky(1)
    with pytest.raises(OperationalError), transaction.atomic():
        retry_when_locked(fn, sleep=lambda s: pytest.fail("slept"))
    assert fn.calls == 1


def test_the_embedded_database_runs_in_wal_mode_with_a_busy_timeout(tmp_path):
    code = (
        "import json, django; django.setup(); from django.db import connection; "
        "c = connection.cursor(); c.execute('PRAGMA journal_mode'); mode = c.fetchone()[0]; "
        "c.execute('PRAGMA busy_timeout'); print(json.dumps([mode, c.fetchone()[0]]))"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "topoweb.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == ["wal", 20000]
