"""The node agent under every fault of its own node: killed, stopped, cut off, its state lost,
rebooted, doubled, its shim killed, a rank's fork bomb and output flood. Two jobs of two tenants
fill the two nodes (8 GPUs each, `requeue: true`, healthy); the fault hits the first job's node.
Each run ends with `chaos.finish()` (watcher findings empty, no healthy requeue job failed, no GPU
booked without a live rank, reconcile --check clean) and records its recovery time."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import httpx

from apps.scheduling import services
from apps.scheduling.choices import JobStatus, NodeState, RankState
from apps.scheduling.models import Job, NodeHealth, RankLogChunk, RankRun
from apps.scheduling.nodes import node_drain
from apps.scheduling.selectors import job_ranks
from apps.topology.models import Node
from tests.integration.agents import REPO, kill_cgroups

from .harness import Throttle, shim_pids, wait_until

NODES = ("node-a", "node-b")


def start_agents(chaos, **kw) -> None:
    for node in NODES:
        chaos.agents.start(node, multi_user=True, **kw)


def node_of(job: Job) -> str:
    return job_ranks(job=job)[0]["node"]


def alive(chaos, job: Job, generation: int | None = None) -> set[int]:
    """Ranks of `job` (of `generation`) with a live process, by the watcher's last sample."""
    return {p.rank for p in chaos.watcher.seen.live if p.job == job.pk and generation in (None, p.generation)}


def running(chaos, job: Job, generation: int | None = None) -> bool:
    """The job runs every rank (in `generation`, when given): by its record and by /proc."""
    job.refresh_from_db()
    if job.status != JobStatus.RUNNING or generation not in (None, job.generation):
        return False
    started = RankRun.objects.filter(job=job, generation=job.generation, state=RankState.STARTED).count()
    return started == job.gpus and len(alive(chaos, job, job.generation)) == job.gpus


def rerun(chaos, job: Job) -> bool:
    """The job runs again, in a new generation (its first one's ranks are gone)."""
    return running(chaos, job) and job.generation >= 2


def two_jobs(chaos, *, sleep_s: float = 600, **agent_kw) -> tuple[Job, Job, str]:
    """Both agents up, alice's and bob's 8-GPU jobs running (one per node); returns (the job on
    the node the fault hits, the other, that node)."""
    start_agents(chaos, **agent_kw)
    first = chaos.submit(0, "alice-8", 8, SLEEP_S=str(sleep_s))
    second = chaos.submit(1, "bob-8", 8, SLEEP_S=str(sleep_s))
    for job in (first, second):
        wait_until(lambda job=job: running(chaos, job), 60, f"{job.name} to run")
    assert node_of(first) != node_of(second)
    return first, second, node_of(first)


def node_state(chaos, node: str) -> str:
    health = NodeHealth.objects.filter(node__cluster=chaos.cluster, node__name=node).first()
    return health.state if health else ""


def synced_since(chaos, node: str, since: float) -> bool:
    """The node's agent reached the server after `since` (wall clock) and the node is up. The row
    exists without `last_seen` between an agent's claim of the node and its first heartbeat."""
    health = NodeHealth.objects.filter(node__cluster=chaos.cluster, node__name=node).first()
    seen = health.last_seen if health else None
    return bool(seen and seen.timestamp() > since and health.state == NodeState.UP)


def down_timeout(settings) -> float:
    """How long the checker may take to declare a silent node down, with room for a busy machine."""
    return settings.TOPOWEB_AGENT_DOWN_AFTER_S + 30


def lease_timeout(settings) -> float:
    return settings.TOPOWEB_AGENT_DOWN_AFTER_S + settings.TOPOWEB_AGENT_FENCE_AFTER_S + 60


def steady(chaos, jobs: tuple[Job, ...], node: str, since: float):
    """Every job runs on in its first generation and the node's agent is back."""
    return lambda: synced_since(chaos, node, since) and all(running(chaos, j, 1) for j in jobs)


def exit_cause(run: RankRun) -> str:
    """The cause an exit carries apart from its code (the rank's own exit, lost, fenced, stopped,
    a limit)."""
    names = {f.name for f in RankRun._meta.get_fields()}
    found = next((n for n in ("exit_cause", "cause") if n in names), None)
    assert found, f"rank runs record no exit cause apart from the code (fields: {sorted(names)})"
    return str(getattr(run, found))


# -- 1. SIGKILL and restart ------------------------------------------------------------------------


def test_kill_short(chaos, settings):
    """SIGKILL, restart 2 s later: the ranks are re-adopted and run on, nothing is requeued."""
    first, second, node = two_jobs(chaos)
    chaos.agents.kill(node)
    chaos.fault()
    time.sleep(2)
    restarted = time.time()
    chaos.agents.start(node, multi_user=True)
    chaos.recovered(steady(chaos, (first, second), node, restarted), 60, "the ranks re-adopted, running on")
    chaos.finish()


def test_kill_long(chaos, settings):
    """SIGKILL, restart after the node was declared down but within the lease (fence 20 s > down
    6 s): the ranks ran on meanwhile and are re-adopted; the jobs stay in their first generation."""
    first, second, node = two_jobs(chaos)
    chaos.agents.kill(node)
    chaos.fault()
    wait_until(lambda: node_state(chaos, node) == NodeState.DOWN, down_timeout(settings), "the node down")
    assert time.monotonic() - chaos.fault_at < settings.TOPOWEB_AGENT_FENCE_AFTER_S - 2, (
        "too slow for the lease"
    )
    restarted = time.time()
    chaos.agents.start(node, multi_user=True)
    chaos.recovered(steady(chaos, (first, second), node, restarted), 60, "the ranks re-adopted, running on")
    chaos.finish()


# -- 2. SIGKILL during a rank's start -------------------------------------------------------------


def test_kill_during_rank_start(chaos, settings, tmp_path):
    """The agent is killed after a rank's record and cgroup exist and its shim runs, before the
    record names the shim (its start report not sent). The window is hit for real: both agents
    run throttled to 2 % of a CPU while they start the job's ranks, and a loop kills the agent
    the moment a shim runs whose record lacks its pid (a few attempts, each a new job). Restarted,
    the agent re-adopts that rank by its running shim: the job runs in its first generation."""
    start_agents(chaos)
    hit = None
    attempts = 0
    for attempt in range(8):
        attempts = attempt + 1
        throttle = Throttle(f"topoweb-chaos-throttle-{os.getpid()}")
        try:
            for node in NODES:
                throttle.add(chaos.agents.procs[node].pid)
            job = chaos.submit(0, f"starting-{attempt}", 8)
            hit = _kill_in_start_window(chaos, job, tmp_path)
        finally:
            throttle.release()
        if hit:
            break
        services.job_cancel(job=job)
        wait_until(
            lambda job=job: not alive(chaos, job) and not job.allocations.filter(live=True).exists(),
            60,
            "the missed attempt's ranks to stop",
        )
    chaos.extra.update(attempts=attempts, window_hit=bool(hit))
    assert hit, f"the start window was not hit in {attempts} attempts"
    node, record = hit
    restarted = time.time()
    chaos.agents.start(node, multi_user=True)
    chaos.recovered(steady(chaos, (job,), node, restarted), 90, "the job running in generation 1")
    chaos.finish()


def _kill_in_start_window(chaos, job: Job, tmp_path):
    """Poll the agents' state directories; SIGKILL the agent once a rank's shim runs while its
    record has no shim pid. Returns (node, record) when the window was hit, None when the job's
    ranks all started first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for node in NODES:
            for record in (tmp_path / f"state-{node}").glob(f"job-{job.pk}-gen-*-rank-*"):
                spec = record / "spec.json"
                if not spec.exists():
                    continue
                try:
                    if json.loads((record / "rank.json").read_text()).get("shim_pid"):
                        continue
                except (OSError, ValueError):
                    continue
                if str(spec) not in shim_pids():
                    continue
                chaos.agents.kill(node)
                chaos.fault()
                # Confirm: the dead agent's record lacks the shim's pid, and the shim runs.
                data = json.loads((record / "rank.json").read_text())
                if data.get("shim_pid") is None and str(spec) in shim_pids():
                    return node, record
                chaos.agents.start(node, multi_user=True)
                return None
        if RankRun.objects.filter(job=job).count() == job.gpus:
            return None
        time.sleep(0.003)
    return None


def test_cancel_before_the_starts_are_reported(chaos, settings, tmp_path):
    """The agent is killed once the first of a job's ranks is recorded with its shim, before any
    start was reported (it starts all eight, throttled to 2 % of a CPU, before it syncs again).
    The job is cancelled meanwhile: the server, having heard of no rank, frees its GPUs at once,
    and the next job gets the same node (the other is drained). The restarted agent re-adopts the first rank and stops
    it; the next job's ranks start only once it is gone (no GPU used by both, from /proc)."""
    start_agents(chaos)
    throttle = Throttle(f"topoweb-chaos-throttle-{os.getpid()}")
    try:
        for node in NODES:
            throttle.add(chaos.agents.procs[node].pid)
        job = chaos.submit(0, "starting", 8)
        node = wait_until(lambda: _first_recorded(tmp_path, job), 120, "a rank recorded with its shim")
        chaos.agents.kill(node)
        chaos.fault()
        assert not RankRun.objects.filter(job=job).exists(), "a start was reported before the kill"
        chaos.agents.start(node, multi_user=True)
    finally:
        throttle.release()
    other = Node.objects.get(cluster=chaos.cluster, name=next(n for n in NODES if n != node))
    node_drain(node=other, reason="the following job goes where the cancelled one was")
    services.job_cancel(job=job)
    # Unless the restarted agent reported a start first: then the following job waits for it.
    chaos.extra["freed_at_cancel"] = not job.allocations.filter(live=True).exists()
    following = chaos.submit(0, "following", 8)
    chaos.recovered(lambda: running(chaos, following, 1), 90, "the following job running")
    assert node_of(following) == node
    wait_until(lambda: not alive(chaos, job), 60, "the cancelled job's ranks gone")
    chaos.finish()


def _first_recorded(tmp_path, job: Job) -> str | None:
    """The node whose agent recorded one of `job`'s ranks with its shim's pid, if any."""
    for node in NODES:
        for record in (tmp_path / f"state-{node}").glob(f"job-{job.pk}-gen-*-rank-*/rank.json"):
            try:
                if json.loads(record.read_text()).get("shim_pid"):
                    return node
            except (OSError, ValueError):
                continue
    return None


# -- 3. SIGTERM restart ----------------------------------------------------------------------------


def test_sigterm_restart(chaos, settings):
    first, second, node = two_jobs(chaos)
    chaos.fault()
    assert chaos.agents.terminate(node) == 0
    restarted = time.time()
    chaos.agents.start(node, multi_user=True)
    chaos.recovered(steady(chaos, (first, second), node, restarted), 60, "the ranks re-adopted, running on")
    chaos.finish()


# -- 4. SIGSTOP beyond the down time ---------------------------------------------------------------


def test_sigstop_beyond_down(chaos, settings):
    first, second, node = two_jobs(chaos)
    proc = chaos.agents.procs[node]
    proc.send_signal(signal.SIGSTOP)
    chaos.fault()
    try:
        wait_until(lambda: node_state(chaos, node) == NodeState.DOWN, down_timeout(settings), "the node down")
        time.sleep(1)
    finally:
        proc.send_signal(signal.SIGCONT)
    resumed = time.time()
    chaos.recovered(steady(chaos, (first, second), node, resumed), 60, "the node back, its ranks running on")
    chaos.finish()


# -- 5. a TCP cut between agent and server --------------------------------------------------------


def test_tcp_cut(chaos, settings, live_server):
    from urllib.parse import urlparse

    from tests.integration.agents import TcpProxy

    where = urlparse(live_server.url)
    proxy = TcpProxy((where.hostname, where.port))
    cut, direct = NODES
    try:
        # node-a reaches the server through the proxy, node-b directly: the cut is a partition
        # between node-a and the control plane while the server goes on answering node-b.
        chaos.agents.start(cut, multi_user=True, server=proxy.url)
        chaos.agents.start(direct, multi_user=True)
        first = chaos.submit(0, "alice-8", 8)
        second = chaos.submit(1, "bob-8", 8)
        for job in (first, second):
            wait_until(lambda job=job: running(chaos, job), 60, f"{job.name} to run")
        proxy.cut()
        chaos.fault()
        # Beyond its down time (the server answered node-b meanwhile), within its lease.
        wait_until(lambda: node_state(chaos, cut) == NodeState.DOWN, down_timeout(settings), f"{cut} down")
        time.sleep(1)
        proxy.heal()
        healed = time.time()
        chaos.recovered(
            lambda: synced_since(chaos, cut, healed)
            and node_state(chaos, cut) == NodeState.UP
            and all(running(chaos, j, 1) for j in (first, second)),
            60,
            f"{cut} back up, every rank running on in its first generation",
        )
        chaos.finish()
    finally:
        proxy.close()


# -- 6. the state directory deleted or corrupted --------------------------------------------------


def _lose_state(chaos, settings, tmp_path, spoil) -> None:
    first, second, node = two_jobs(chaos)
    chaos.agents.kill(node)
    chaos.fault()
    spoil(tmp_path / f"state-{node}")
    restarted = time.time()
    chaos.agents.start(node, multi_user=True)
    # The ranks whose records are gone are orphans: stopped through their cgroups; the healthy
    # `requeue: true` job runs again (a new generation, only once its old ranks are gone).
    chaos.recovered(
        lambda: synced_since(chaos, node, restarted) and rerun(chaos, first) and running(chaos, second, 1),
        lease_timeout(settings),
        "the job on the node that lost its state running again",
    )
    chaos.finish()


def test_state_dir_deleted(chaos, settings, tmp_path):
    _lose_state(chaos, settings, tmp_path, lambda state: shutil.rmtree(state))


def test_state_dir_corrupted(chaos, settings, tmp_path):
    def spoil(state):
        for index, record in enumerate(sorted(state.glob("job-*-gen-*-rank-*/rank.json"))):
            raw = record.read_bytes()
            # Half truncated mid-record, half garbage.
            record.write_bytes(raw[: len(raw) // 2] if index % 2 else b"\x00\xffgarbage{" * 7)
        for other in state.glob("*.json"):
            other.write_bytes(b"\x00not json")

    _lose_state(chaos, settings, tmp_path, spoil)


# -- 7. a reboot -----------------------------------------------------------------------------------


def test_reboot(chaos, settings, tmp_path):
    """The agent and every rank process of the node die at once; the state directory survives
    (the boot id too, on this machine: pids may or may not be reused). The healthy jobs of the
    node run again in a new generation, none fails."""
    first, second, node = two_jobs(chaos)
    chaos.agents.kill(node)
    # Everything of the node dies at once: the shims too (outside the ranks' cgroups), before
    # they could record how their rank ended.
    state = str(tmp_path / f"state-{node}") + "/"
    for spec, pid in shim_pids().items():
        if spec.startswith(state):
            os.kill(pid, signal.SIGKILL)
    kill_cgroups([d / node for d in chaos.agents.cgroup_dirs()])
    chaos.fault()
    restarted = time.time()
    chaos.agents.start(node, multi_user=True)
    chaos.recovered(
        lambda: synced_since(chaos, node, restarted) and rerun(chaos, first) and running(chaos, second, 1),
        lease_timeout(settings),
        "the rebooted node's job running again",
    )
    chaos.finish()


# -- 8. two agents on one credential ---------------------------------------------------------------


def test_two_agents_one_credential(chaos, settings, tmp_path):
    """A second agent (another host: its own state directory, log directory and cgroup tree) with
    the same token and --node is refused (409 naming the node) and starts nothing; the first runs on."""
    first, second, node = two_jobs(chaos)
    agents = chaos.agents
    argv = agents.argv(node, 1.0, multi_user=True) + [
        "--state-dir",
        str(tmp_path / f"state-{node}-second"),
        "--log-dir",
        str(tmp_path / f"logs-{node}-second"),
        "--cgroup-name",
        f"{agents.cgroup_name}/{node}-second",
        # Another host: its own node lock too (on one host the lock refuses it, exit 75).
        "--lock-dir",
        str(tmp_path / "locks-second"),
    ]
    out = tmp_path / "second-agent.out"
    chaos.fault()
    with out.open("ab") as log:
        twin = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        chaos.recovered(
            lambda: "409" in out.read_text(errors="replace"), 30, "the second agent refused (409)"
        )
        time.sleep(5)  # several more polls of both
        assert node in out.read_text(errors="replace")
        assert running(chaos, first, 1) and running(chaos, second, 1)
    finally:
        twin.kill()
        twin.wait(timeout=15)
    time.sleep(2)
    assert running(chaos, first, 1)
    chaos.finish()


# -- 11. a killed shim -----------------------------------------------------------------------------


def test_killed_shim(chaos, settings, tmp_path):
    """SIGKILL of a rank's shim (its parent): the rank runs on to its end, watched through its
    cgroup. Its exit status died with the shim, so its end is reported `lost` (not the job's own
    failure): the `requeue: true` job runs again and completes; the other job is untouched."""
    first, second, node = two_jobs(chaos, sleep_s=15)
    rank = job_ranks(job=first)[0]["rank"]
    spec = str(tmp_path / f"state-{node}" / f"job-{first.pk}-gen-1-rank-{rank}" / "spec.json")
    shim = shim_pids()[spec]
    os.kill(shim, signal.SIGKILL)
    chaos.fault()
    # The agent does not stop the orphaned rank: it is alive well after its shim died.
    time.sleep(3)
    assert rank in alive(chaos, first, 1), "the rank died with its shim"
    chaos.recovered(
        lambda: first.refresh_from_db() or first.status in (JobStatus.COMPLETED, JobStatus.FAILED),
        120,
        "the job to end",
    )
    assert first.status == JobStatus.COMPLETED, first.pending_reason
    orphaned = RankRun.objects.get(job=first, generation=1, rank=rank)
    assert orphaned.exit_cause == "lost" and "shim" in orphaned.log_tail, (
        orphaned.exit_cause,
        orphaned.log_tail,
    )
    wait_until(
        lambda: second.refresh_from_db() or second.status == JobStatus.COMPLETED,
        60,
        "the other job to complete",
    )
    chaos.finish()


# -- 12. a fork bomb -------------------------------------------------------------------------------

PIDS_MAX = 32


def test_fork_bomb(chaos, settings):
    """alice's ranks fork without end under --pids-max 32: stopped at the limit with exit cause
    pids_limit (the job fails: the rank's own doing); bob's job on the other node completes."""
    start_agents(chaos, extra=["--pids-max", str(PIDS_MAX)])
    bomb = chaos.submit(0, "bomb", 8, requeue=False, BEHAVIOUR="forkbomb")
    calm = chaos.submit(1, "calm", 8, SLEEP_S="20")
    chaos.fault()
    chaos.recovered(
        lambda: bomb.refresh_from_db() or bomb.status in (JobStatus.FAILED, JobStatus.COMPLETED),
        120,
        "the fork bomb stopped",
    )
    assert bomb.status == JobStatus.FAILED
    causes = {exit_cause(r) for r in RankRun.objects.filter(job=bomb).exclude(exit_code=None)}
    assert any("pids" in c for c in causes), causes
    most = max(n for (job, _), n in chaos.watcher.seen.most_processes.items() if job == bomb.pk)
    chaos.extra.update(most_processes=most)
    assert most <= PIDS_MAX
    wait_until(
        lambda: calm.refresh_from_db() or calm.status in (JobStatus.COMPLETED, JobStatus.FAILED),
        90,
        "the other job to end",
    )
    assert calm.status == JobStatus.COMPLETED, calm.pending_reason
    chaos.finish()


# -- 13. an output flood ---------------------------------------------------------------------------


def test_output_flood(chaos, settings, live_server):
    """Two ranks write 6 MB each of NUL and invalid UTF-8: the server keeps a valid, bounded text
    copy (TOPOWEB_RANK_LOG_MAX_MB 1), the job completes, and the server answers throughout."""
    from apps.scheduling.selectors import rank_log_max_bytes

    settings.TOPOWEB_RANK_LOG_MAX_MB = 1
    start_agents(chaos)
    calm = chaos.submit(1, "calm", 8)
    wait_until(lambda: running(chaos, calm), 60, "the other job to run")
    latencies: list[float] = []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            began = time.monotonic()
            try:
                httpx.get(f"{live_server.url}/healthz", timeout=30)
            except httpx.HTTPError:
                pass
            latencies.append(time.monotonic() - began)
            stop.wait(0.5)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        flood = chaos.submit(0, "flood", 2, BEHAVIOUR="flood", FLOOD_MB="6")
        chaos.fault()
        chaos.recovered(
            lambda: flood.refresh_from_db() or flood.status in (JobStatus.COMPLETED, JobStatus.FAILED),
            180,
            "the flooding job to end",
        )
    finally:
        stop.set()
        prober.join(timeout=40)
    assert flood.status == JobStatus.COMPLETED, flood.pending_reason
    chaos.extra.update(probe_max_s=round(max(latencies), 2), probes=len(latencies))
    assert latencies and max(latencies) < 5.0, f"the server answered /healthz in up to {max(latencies):.1f} s"
    runs = list(RankRun.objects.filter(job=flood))
    wait_until(
        lambda: all(RankLogChunk.objects.filter(run=r).exists() for r in runs),
        60,
        "the server's copies of the logs",
    )
    for run in runs:
        chunks = RankLogChunk.objects.filter(run=run).order_by("offset")
        text = "".join(chunks.values_list("text", flat=True))
        assert "\x00" not in text and "\ufffd" in text
        text.encode("utf-8")  # valid text
        # Bounded by the output bytes it stands for (one U+FFFD per bad byte: one character each).
        stored = sum(chunks.values_list("size", flat=True))
        assert 0 < stored <= rank_log_max_bytes() and len(text) <= rank_log_max_bytes(), (stored, len(text))
        assert "\x00" not in run.log_tail
    assert running(chaos, calm, 1)
    chaos.finish()
