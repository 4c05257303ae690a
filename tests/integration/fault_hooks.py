"""Hooks the fault tests load into the real web and worker processes they start, to hold a
request or a cycle at a chosen point while the test kills the process holding it.

Both hooks do nothing unless TOPOWEB_FAULT_DIR is set and the test created the pause file there:
- workers (`celery worker --include tests.integration.fault_hooks`): a scheduling-cycle task
  whose pause file `pause-before-lock` exists writes `cycle-held-<cluster id>-<pid>` and waits
  before it runs (so before it locks the cluster) until the file is gone; with `pause-under-lock`
  it writes `locked-held-<cluster id>-<pid>` and waits inside the cycle's transaction, holding
  the cluster's row lock;
- web (`granian --interface wsgi tests.integration.fault_hooks:application`): a job submission whose pause file
  `pause-after-commit` exists is committed, then writes `post-held-<pid>` and waits before it
  answers until the file is gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery.signals import task_prerun

HOLD_MAX_S = 30.0


def _fault_dir() -> Path | None:
    value = os.environ.get("TOPOWEB_FAULT_DIR")
    return Path(value) if value else None


def _hold(pause: str, mark: str) -> None:
    """If the pause file exists: write the mark file (named with this pid) and wait for the pause
    file to go (HOLD_MAX_S at most)."""
    where = _fault_dir()
    if where is None or not (where / pause).exists():
        return
    (where / f"{mark}-{os.getpid()}").write_text(str(os.getpid()))
    deadline = time.monotonic() + HOLD_MAX_S
    while (where / pause).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@task_prerun.connect
def hold_cycle(sender=None, args=(), **kwargs) -> None:
    if getattr(sender, "name", "") == "scheduling.schedule_cluster":
        _hold("pause-before-lock", f"cycle-held-{args[0] if args else ''}")
        _hold_under_lock()


def _hold_under_lock() -> None:
    """Make the cycle's planning step (inside its transaction, under the cluster's row lock) hold
    while `pause-under-lock` exists, writing `locked-held-<cluster id>-<pid>`."""
    from apps.scheduling import cycle

    if getattr(cycle.plan_cycle, "held", False):
        return
    plan = cycle.plan_cycle

    def held_plan(snapshot, *args, **kwargs):
        _hold("pause-under-lock", f"locked-held-{snapshot.cluster_id}")
        return plan(snapshot, *args, **kwargs)

    held_plan.held = True
    cycle.plan_cycle = held_plan


_inner = None


def application(environ, start_response):
    """The project's WSGI application, holding job submissions after their commit on demand."""
    global _inner
    if _inner is None:
        from topoweb.wsgi import application as inner

        _inner = inner
    response = _inner(environ, start_response)
    if environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") == "/api/v1/jobs/":
        _hold("pause-after-commit", "post-held")
    return response
