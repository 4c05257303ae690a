"""Faults on the real services: Redis stopped, Postgres unreachable, a worker SIGKILLed around a
cycle, a web worker SIGKILLed mid-POST.

The stack under test runs as real processes: granian (2 workers), two Celery workers (prefork,
one child each) and beat, on a private redis-server this module starts (never the shared one) and
on the test database through a TCP proxy the tests can cut. After each fault: no GPU is held
twice, every accepted job is present once, and scheduling resumes within seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import suppress
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from rest_framework.authtoken.models import Token

from apps.placement.topology import read_spec_file
from apps.scheduling import services
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.scheduling.models import Job, SchedulingCycle
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES, wait_for
from tests.integration.test_worker_race import violations

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

REPO = Path(__file__).resolve().parents[2]
REDIS_PORT = 8121
PG_PROXY_PORT = 8122
WEB_PORT = 8123
START_TIMEOUT_S = 60.0
RESUME_S = 30.0  # scheduling must resume within this long after a fault ends (beat ticks every 10 s)
HANG_S = 15.0  # longer than any degraded path takes (1 s cache timeouts, ~1 s publish retries)


def free_port(port: int) -> int:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            pytest.fail(f"port {port} is taken; the fault tests need it")
    return port


class CuttableProxy:
    """A TCP proxy on 127.0.0.1:`port` to `target`; `cut()` drops every connection and refuses
    new ones (as a stopped server does) until `restore()`."""

    def __init__(self, port: int, target: tuple[str, int]):
        self.port = port
        self.target = target
        self.cut_flag = threading.Event()
        self.stopping = threading.Event()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> CuttableProxy:
        self._listen()
        self.thread.start()
        return self

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.1)
        self.listener = listener

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if self.cut_flag.is_set() or self.listener is None:
                time.sleep(0.05)
                continue
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=3)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cut_flag.set()
        # Closing the listener makes new connections fail with "connection refused".
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def restore(self) -> None:
        if self.listener is None:
            self._listen()
        self.cut_flag.clear()

    def stop(self) -> None:
        self.cut()
        self.stopping.set()
        if self.thread.ident is not None:  # not started when the stack's start failed first
            self.thread.join(timeout=5)


class Stack:
    """The processes under test and the knobs to break them."""

    def __init__(self, root: Path):
        self.root = root
        self.faults = root / "faults"
        self.faults.mkdir()
        self.procs: dict[str, subprocess.Popen] = {}
        self.redis: subprocess.Popen | None = None
        s = connection.settings_dict
        self.pg = CuttableProxy(free_port(PG_PROXY_PORT), (s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
        auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
        self.env = dict(
            os.environ,
            DATABASE_URL=f"postgres://{auth}@127.0.0.1:{PG_PROXY_PORT}/{s['NAME']}",
            CELERY_BROKER_URL=f"redis://127.0.0.1:{REDIS_PORT}/0",
            CACHE_URL=f"redis://127.0.0.1:{REDIS_PORT}/1",
            TOPOWEB_TESTING="1",
            TOPOWEB_FAULT_DIR=str(self.faults),
            TOPOWEB_LOG_LEVEL="INFO",
        )
        self.url = f"http://127.0.0.1:{WEB_PORT}"

    # -- processes

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen(
            args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(REDIS_PORT),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            + ["--dir", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.redis_answers, timeout_s=10, what="the private redis-server")

    def redis_answers(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", REDIS_PORT)) != 0:
                return False
            s.sendall(b"PING\r\n")
            with suppress(OSError):
                return s.recv(16).startswith(b"+PONG")
        return False

    def stop_redis(self) -> None:
        if self.redis is not None:
            self.redis.kill()
            self.redis.wait(timeout=10)
            self.redis = None

    def start_worker(self, name: str) -> None:
        self._spawn(
            name,
            [sys.executable, "-m", "celery", "-A", "topoweb", "worker", "--concurrency", "1"]
            + ["-n", f"{name}@localhost", "--include", "tests.integration.fault_hooks", "--loglevel", "INFO"]
            + ["--without-gossip", "--without-mingle"],
        )

    def worker_children(self, name: str) -> list[int]:
        """Pids of the pool children of worker `name`."""
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.procs[name].pid)], capture_output=True, text=True
        ).stdout
        return [int(p) for p in out.split()]

    def start(self) -> None:
        free_port(REDIS_PORT)
        free_port(WEB_PORT)
        self.start_redis()
        self.pg.start()
        self._spawn(
            "web",
            [sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1"]
            + ["--port", str(WEB_PORT), "--workers", "2", "--respawn-failed-workers"]
            + ["--workers-kill-timeout", "5", "tests.integration.fault_hooks:application"],
        )
        for name in ("w1", "w2"):
            self.start_worker(name)
        self._spawn(
            "beat",
            [sys.executable, "-m", "celery", "-A", "topoweb", "beat", "--loglevel", "INFO"]
            + ["--schedule", str(self.root / "beat-schedule")],
        )
        wait_for(self.web_answers, timeout_s=START_TIMEOUT_S, what="the web server to answer /healthz")
        wait_for(
            lambda: all(self.worker_children(n) for n in ("w1", "w2")),
            timeout_s=START_TIMEOUT_S,
            what="both workers' pool children",
        )

    def web_answers(self) -> bool:
        with suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        return False

    def stop(self) -> None:
        for proc in self.procs.values():
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.stop_redis()
        self.pg.stop()

    # -- fault switches

    def pause(self, name: str) -> None:
        for old in self.faults.glob("*-held*"):
            old.unlink()
        (self.faults / name).write_text("")

    def resume(self, name: str) -> None:
        with suppress(FileNotFoundError):
            (self.faults / name).unlink()

    def held_pid(self, mark: str) -> int:
        found = wait_for(lambda: list(self.faults.glob(f"{mark}-*")), timeout_s=20, what=f"a {mark} process")
        return int(found[0].name.rsplit("-", 1)[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory, django_db_setup, django_db_blocker):
    if shutil.which("redis-server") is None:
        from tests.conftest import service_missing

        service_missing("the fault tests need redis-server to start a private Redis")
    running = Stack(tmp_path_factory.mktemp("faults"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def other_sessions() -> int:
    """Sessions on the test database other than this process's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.fixture
def world(stack, transactional_db):
    """pod-256, a user with a token, and an HTTP client for the web under test. On the way out
    the stack is cut off the database, so the test database's flush never races its cycles."""
    stack.pg.restore()
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))
    user = get_user_model().objects.create_user(f"fault-{uuid.uuid4().hex[:6]}")
    token = Token.objects.create(user=user).key
    client = httpx.Client(base_url=stack.url, headers={"Authorization": f"Token {token}"}, timeout=20)
    yield {"cluster": cluster, "user": user, "api": client}
    client.close()
    stack.pg.cut()
    deadline = time.monotonic() + 10
    while other_sessions() and time.monotonic() < deadline:
        time.sleep(0.05)


def job_spec(name: str, gpus: int = 8) -> dict:
    return {
        "version": 1,
        "name": name,
        "cluster": "pod-256",
        "gpus": gpus,
        "parallelism": {"tp": min(gpus, 8), "pp": 1, "dp": max(gpus // 8, 1)},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}],
        "estimated_runtime_s": 3600,
    }


def submit(api: httpx.Client, name: str, **headers) -> int:
    started = time.monotonic()
    response = api.post("/api/v1/jobs/", json=job_spec(name), headers=headers)
    assert response.status_code == 201, response.text
    # A guard against hanging on a dead service, not a speed target (the machine is shared).
    assert time.monotonic() - started < HANG_S, f"a submission took more than {HANG_S} s"
    return response.json()["id"]


def placed(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status__in=[JobStatus.PLACING, JobStatus.RUNNING]).count() == len(
        ids
    )


def assert_invariants(accepted: list[int]) -> None:
    """No GPU held twice, every job holds exactly its GPUs or none, every accepted job once."""
    assert violations() == []
    assert sorted(Job.objects.filter(pk__in=accepted).values_list("pk", flat=True)) == sorted(accepted)
    names = list(Job.objects.values_list("name", flat=True))
    assert len(names) == len(set(names)), "a job was stored twice"


def cycles_settled(quiet_s: float = 1.0) -> None:
    """Return once no scheduling cycle has been recorded for `quiet_s`: a cycle the submissions
    above requested may still run after their jobs were placed (another worker waiting for the
    cluster lock), and one running when Redis stops would rightly place jobs submitted meanwhile."""
    count, since = SchedulingCycle.objects.count(), time.monotonic()
    deadline = since + RESUME_S
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "scheduling cycles never settled"
        time.sleep(0.05)
        now = SchedulingCycle.objects.count()
        if now != count:
            count, since = now, time.monotonic()


def test_intake_keeps_working_while_redis_is_down_and_jobs_are_placed_when_it_returns(stack, world):
    api = world["api"]
    before = [submit(api, f"before-{i}") for i in range(3)]
    wait_for(lambda: placed(before), timeout_s=RESUME_S, what="the first jobs to be placed")
    cycles_settled()
    launcher = httpx.Client(
        base_url=stack.url,
        headers={"Authorization": f"Launcher {services.launcher_token_create(cluster=world['cluster'])[1]}"},
        timeout=20,
    )
    stack.stop_redis()
    try:
        during = [submit(api, f"during-{i}") for i in range(6)]
        assert api.get("/api/v1/jobs/").status_code == 200
        for pk in before:
            assert launcher.post(f"/api/v1/jobs/{pk}/start/").status_code == 200
            assert launcher.post(f"/api/v1/jobs/{pk}/complete/").status_code == 200
        assert set(Job.objects.filter(pk__in=during).values_list("status", flat=True)) == {JobStatus.QUEUED}
    finally:
        launcher.close()
        stack.start_redis()
    back = time.monotonic()
    wait_for(lambda: placed(during), timeout_s=RESUME_S, what="the jobs accepted while Redis was down")
    print(f"jobs accepted while Redis was down placed {time.monotonic() - back:.1f} s after it returned")
    assert set(Job.objects.filter(pk__in=before).values_list("status", flat=True)) == {JobStatus.COMPLETED}
    assert_invariants(before + during)


def test_a_503_with_retry_after_while_postgres_is_unreachable_then_service_resumes(stack, world, db):
    api = world["api"]
    first = [submit(api, "first")]
    browser = Client()
    browser.force_login(world["user"])
    session = browser.cookies["sessionid"].value
    stack.pg.cut()
    try:
        time.sleep(0.2)
        for method, path in (
            ("GET", "/api/v1/jobs/"),
            ("POST", "/api/v1/jobs/"),
            ("GET", "/api/v1/clusters/"),
        ):
            response = api.request(method, path, json=job_spec("refused") if method == "POST" else None)
            assert response.status_code == 503, (method, path, response.text[:300])
            assert response.headers["content-type"] == "application/json"
            assert int(response.headers["retry-after"]) > 0
        page = httpx.get(f"{stack.url}/queue/", cookies={"sessionid": session}, timeout=20)
        assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
        assert "briefly unavailable" in page.text and int(page.headers["retry-after"]) > 0
    finally:
        stack.pg.restore()
    back = time.monotonic()
    after = [submit(api, "after")]
    wait_for(lambda: placed(first + after), timeout_s=RESUME_S, what="scheduling after Postgres returned")
    print(f"a job submitted after Postgres returned placed in {time.monotonic() - back:.1f} s")
    assert not Job.objects.filter(name="refused").exists()
    assert_invariants(first + after)


def kill_held_cycle(
    stack: Stack, world: dict, name: str, kill, *, where: str = "before-lock"
) -> tuple[list[int], float]:
    """Submit job `name`, hold its cycle before the lock (or `where="under-lock"`: inside its
    transaction), call `kill(pid of the process holding it)`, let go; returns ([job id], when it
    was killed)."""
    mark = "cycle-held" if where == "before-lock" else "locked-held"
    stack.pause(f"pause-{where}")
    try:
        ids = [submit(world["api"], name)]
        kill(stack.held_pid(f"{mark}-{world['cluster'].pk}"))
        return ids, time.monotonic()
    finally:
        stack.resume(f"pause-{where}")


def test_a_cycle_whose_worker_child_is_killed_before_the_lock_is_retried_and_audited(stack, world):
    ids, killed = kill_held_cycle(stack, world, "held", lambda pid: os.kill(pid, signal.SIGKILL))
    wait_for(lambda: placed(ids), timeout_s=RESUME_S, what="the job of the killed cycle to be placed")
    print(f"cycle retried and placed the job {time.monotonic() - killed:.1f} s after the SIGKILL")
    assert time.monotonic() - killed < HANG_S
    lost = SchedulingCycle.objects.filter(
        cluster=world["cluster"], status=CycleStatus.FAILED, error__startswith="WorkerLost:"
    )
    wait_for(lost.exists, timeout_s=RESUME_S, what="the redelivered cycle's audit record")
    print(f"the redelivered cycle was audited {time.monotonic() - killed:.1f} s after the SIGKILL")
    assert_invariants(ids)


def test_a_cycle_killed_under_the_cluster_lock_books_nothing_and_is_retried(stack, world):
    ids, killed = kill_held_cycle(
        stack, world, "locked", lambda pid: os.kill(pid, signal.SIGKILL), where="under-lock"
    )
    wait_for(lambda: placed(ids), timeout_s=RESUME_S, what="the job of the cycle killed under the lock")
    print(
        f"a cycle killed under the lock was retried and placed the job {time.monotonic() - killed:.1f} s later"
    )
    assert time.monotonic() - killed < HANG_S
    lost = SchedulingCycle.objects.filter(cluster=world["cluster"], error__startswith="WorkerLost:")
    wait_for(lost.exists, timeout_s=RESUME_S, what="the redelivered cycle's audit record")
    assert_invariants(ids)


def test_a_submission_cut_off_after_its_commit_is_retried_with_its_key_without_a_duplicate(stack, world):
    api = world["api"]
    key = f"cut-{uuid.uuid4().hex}"
    outcome: dict = {}

    def first_try():
        try:
            outcome["response"] = api.post(
                "/api/v1/jobs/", json=job_spec("cut-off"), headers={"Idempotency-Key": key}
            )
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    stack.pause("pause-after-commit")
    try:
        thread = threading.Thread(target=first_try)
        thread.start()
        pid = stack.held_pid("post-held")
        os.kill(pid, signal.SIGKILL)
        thread.join(timeout=20)
    finally:
        stack.resume("pause-after-commit")
    assert "error" in outcome, f"the first POST was answered: {outcome}"
    [stored] = Job.objects.filter(name="cut-off")
    wait_for(stack.web_answers, timeout_s=START_TIMEOUT_S, what="the web server to replace its worker")
    retry = api.post("/api/v1/jobs/", json=job_spec("cut-off"), headers={"Idempotency-Key": key})
    assert retry.status_code == 201 and retry.json()["id"] == stored.pk
    assert retry.headers["idempotent-replayed"] == "true"
    wait_for(lambda: placed([stored.pk]), timeout_s=RESUME_S, what="the cut-off job to be placed")
    assert Job.objects.filter(name="cut-off").count() == 1
    assert_invariants([stored.pk])


def test_a_whole_worker_killed_before_the_lock_does_not_hold_scheduling_back(stack, world):
    killed_worker: list[str] = []

    def kill_worker(pid: int) -> None:
        worker = next(name for name in ("w1", "w2") if pid in stack.worker_children(name))
        os.killpg(stack.procs[worker].pid, signal.SIGKILL)
        killed_worker.append(worker)

    ids, killed = kill_held_cycle(stack, world, "orphaned", kill_worker)
    [worker] = killed_worker
    try:
        # Its message waits out the visibility timeout; beat's next tick must not be absorbed.
        wait_for(lambda: placed(ids), timeout_s=RESUME_S, what="beat's cycle to place the orphaned job")
        print(f"beat placed the orphaned job {time.monotonic() - killed:.1f} s after the worker died")
        assert_invariants(ids)
    finally:
        stack.procs[worker].wait(timeout=10)
        stack.start_worker(worker)
