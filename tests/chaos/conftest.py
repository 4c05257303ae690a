"""The fault matrix (`-m chaos`): real agent and rank processes, two Unix tenants, per-rank cgroups
and a /proc watcher (harness.py), against Django's live server (or granian, the production web
server) on Postgres.

Everything here carries the `chaos` marker and runs only when `-m` names it (`make chaos`): the
unit run (`-m "not integration"`) and the integration run (`-m integration`) leave it out. The
3-minute outage also carries `chaos_slow` (the fast subset: `-m "chaos and not chaos_slow"`).
TOPOWEB_CHAOS_ROUNDS=N runs every class N times (CI: 2). Each run appends its figures to the
results file (harness.RESULTS); `bench/chaos_report.py` prints the table."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.agents import Agents, cgroups_writable, kill_cgroups
from tests.integration.test_agents import agents, cluster, eager_cycles  # noqa: F401

from .harness import Checker, Watcher, rank_command, rank_processes, record_result, wait_until

HERE = Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("TOPOWEB_CHAOS_ROUNDS", "1"))
TENANTS = ("topoweb-chaos-a", "topoweb-chaos-b")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    mine = [i for i in items if HERE in Path(i.path).resolve().parents]
    for item in mine:
        item.add_marker(pytest.mark.chaos)
    if "chaos" not in (config.option.markexpr or ""):
        # Only a run that asks for the matrix by name runs it.
        config.hook.pytest_deselected(items=mine)
        items[:] = [i for i in items if i not in mine]


def pytest_generate_tests(metafunc):
    if "chaos_round" in metafunc.fixturenames:
        metafunc.parametrize("chaos_round", range(1, ROUNDS + 1), ids=lambda r: f"round{r}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" or report.failed:
        item.chaos_outcome = report.outcome if report.when == "call" else f"{report.when} {report.outcome}"
        if report.failed:
            item.chaos_error = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
    return report


@pytest.fixture(scope="session")
def django_db_setup(require_postgres, django_db_setup):
    """The test database is Postgres: checked before it is created."""
    yield


@pytest.fixture(scope="session")
def tenants() -> tuple[str, str]:
    """Two Unix accounts (uid >= 1000, made once, left in place) the two users' ranks run as."""
    if os.geteuid() != 0 or not cgroups_writable() or shutil.which("useradd") is None:
        from tests.conftest import service_missing

        service_missing("the fault matrix needs root, useradd and a writable cgroup hierarchy")
    for name in TENANTS:
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            subprocess.run(
                ["useradd", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", name], check=True
            )
    return TENANTS


@pytest.fixture
def shared_dir():
    """A folder both tenants can write (pytest's own is root's alone): the ranks' OUT_DIR, and
    the watcher's marker."""
    path = Path(tempfile.mkdtemp(prefix="topoweb-chaos-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Chaos:
    """One run of one fault class: the agents, the two tenants' users, the watcher, the checker,
    and what the final checks and the results need."""

    klass: str
    round: int
    agents: Agents
    cluster: object
    users: tuple
    out: Path
    watcher: Watcher
    checker: Checker | None
    # The product's lease settings as configured, before the fixture shortened them.
    defaults: dict = field(default_factory=dict)
    healthy_requeue: set[int] = field(default_factory=set)
    fault_at: float | None = None
    recovery_s: float | None = None
    extra: dict = field(default_factory=dict)
    finished: bool = False

    def submit(self, owner: int, name: str, gpus: int, *, requeue: bool = True, healthy: bool = True, **env):
        """Submit a job of user `owner` (0: alice, 1: bob) running the rank program with `env`
        (BEHAVIOUR sleep by default); a healthy `requeue: true` job must never end failed."""
        from apps.scheduling import services

        body = {
            "version": 1,
            "name": name,
            "cluster": self.cluster.name,
            "gpus": gpus,
            "parallelism": {"tp": 1, "pp": 1, "dp": gpus},
            "step": {"compute_ms": 100},
            "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
            "command": rank_command(),
            "env": {"OUT_DIR": str(self.out), "BEHAVIOUR": "sleep", "SLEEP_S": "600", **env},
            "stop_grace_s": 2,
            "requeue": requeue,
        }
        job = services.job_submit(user=self.users[owner], spec=body)
        if requeue and healthy:
            self.healthy_requeue.add(job.pk)
        return job

    def fault(self) -> None:
        """The fault is injected now: recovery counts from here."""
        self.fault_at = time.monotonic()

    def recovered(self, check, timeout_s: float, what: str):
        """Wait for `check()` (every affected job running again, or its expected end), and
        record the recovery time."""
        value = wait_until(check, timeout_s, what, explain=self.describe)
        assert self.fault_at is not None
        self.recovery_s = round(time.monotonic() - self.fault_at, 2)
        return value

    def finish(self, *, booked_timeout_s: float = 30.0) -> None:
        """The checks every run ends with: the watcher found nothing, no healthy `requeue: true`
        job failed, no GPU is booked without a live rank, `reconcile --check` is clean."""
        from apps.scheduling.choices import JobStatus
        from apps.scheduling.models import Job
        from tests.integration.test_lifecycle_faults import reconcile_clean

        wait_until(self.booked_without_rank_is_none, booked_timeout_s, "every booked GPU to have a live rank")
        seen = self.watcher.seen
        assert seen.samples >= 5, f"the watcher sampled {seen.samples} times"
        assert seen.gpu_double == [], seen.gpu_double[:5]
        assert seen.ranks_twice == [], seen.ranks_twice[:5]
        assert seen.generation_overlaps == [], seen.generation_overlaps[:5]
        failed = Job.objects.filter(pk__in=self.healthy_requeue, status=JobStatus.FAILED)
        assert not failed.exists(), [(j.pk, j.name, j.pending_reason[:300]) for j in failed]
        reconcile_clean()
        self.finished = True

    def describe(self) -> str:
        """The jobs and nodes as the server has them, for a failure's message."""
        from apps.scheduling.models import Job, NodeHealth

        jobs = [
            f"job {j.pk} {j.name} {j.status} gen {j.generation} ({j.pending_reason[:160]!r})"
            for j in Job.objects.filter(cluster=self.cluster).order_by("pk")
        ]
        nodes = [f"{h.node.name} {h.state}" for h in NodeHealth.objects.filter(node__cluster=self.cluster)]
        return "; ".join(jobs + nodes)

    def booked_without_rank(self) -> list[str]:
        """Live allocations whose GPU no live process of their job uses (by /proc)."""
        from apps.scheduling.models import Allocation

        using = {(p.job, p.node, g) for p in self.watcher.seen.live for g in p.gpus}
        return [
            f"job {job} GPU {node}:{gpu}"
            for job, node, gpu in Allocation.objects.filter(live=True, job__cluster=self.cluster).values_list(
                "job_id", "node_name", "gpu_index"
            )
            if (job, node, str(gpu)) not in using
        ]

    def booked_without_rank_is_none(self) -> bool:
        time.sleep(self.watcher.period_s * 2)  # a fresh sample
        return not self.booked_without_rank()

    def healthy_failed(self) -> int:
        from apps.scheduling.choices import JobStatus
        from apps.scheduling.models import Job

        return Job.objects.filter(pk__in=self.healthy_requeue, status=JobStatus.FAILED).count()


@pytest.fixture
def chaos(request, chaos_round, agents, cluster, tenants, shared_dir, settings, transactional_db):  # noqa: F811
    """A run of the test's fault class (its name, without `test_`): users alice and bob mapped to
    the two tenants, the watcher on, the scheduler's periodic work running. Short timings by
    default (agents poll each second, down after 6 s, lease 20 s: beyond the down time); a test
    may change them. Everything started is stopped and its cgroups removed, whatever happened."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    defaults = {
        k: getattr(settings, k) for k in ("TOPOWEB_AGENT_DOWN_AFTER_S", "TOPOWEB_AGENT_FENCE_AFTER_S")
    }
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 6.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = 20.0
    users = []
    for name, account in zip(("alice", "bob"), tenants, strict=True):
        users.append(get_user_model().objects.create_user(name, password="pw"))
        call_command("unix_account", name, account, stdout=open(os.devnull, "w"))
    watcher = Watcher(shared_dir).start()
    run = Chaos(
        klass=request.node.originalname.removeprefix("test_"),
        round=chaos_round,
        agents=agents,
        cluster=cluster,
        users=tuple(users),
        out=shared_dir,
        watcher=watcher,
        checker=Checker().start(),
        defaults=defaults,
    )
    started = time.time()
    try:
        yield run
    finally:
        if run.checker is not None:
            run.checker.stop()
        seen = watcher.stop()
        record_result(
            {
                "class": run.klass,
                "round": chaos_round,
                "outcome": getattr(request.node, "chaos_outcome", "unknown"),
                "error": getattr(request.node, "chaos_error", ""),
                "gpu_double_s": round(seen.gpu_double_s, 2),
                "rank_twice_s": round(seen.rank_twice_s, 2),
                "ranks_twice": len({f.split(" runs twice")[0] for f in seen.ranks_twice}),
                "generation_overlaps": len(seen.generation_overlaps),
                "healthy_requeue_failed": _safe(run.healthy_failed),
                "recovery_s": run.recovery_s,
                "duration_s": round(time.time() - started, 1),
                **run.extra,
            }
        )
        # Ranks that escaped every cgroup (a fault may have made them): by /proc, under the marker.
        for _ in range(3):
            for proc in rank_processes(str(shared_dir)):
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)
        kill_cgroups(agents.cgroup_dirs())


def _safe(count) -> int | None:
    try:
        return count()
    except Exception:  # noqa: BLE001 - the database may be the fault
        return None
