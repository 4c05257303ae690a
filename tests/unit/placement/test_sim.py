"""The trace-driven simulator: trace adapters, profiles, the event engine, metrics and its CLI."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from apps.placement.__main__ import main
from apps.placement.jobs import load_job
from apps.placement.sim import (
    SimConfig,
    TraceError,
    TraceJob,
    TraceRead,
    arrival_scale,
    arrival_window,
    offered_load,
    read_trace,
    simulate,
)
from apps.placement.sim.engine import Replay, ideal_steps
from apps.placement.sim.metrics import summarize, time_weighted_mean
from apps.placement.sim.profiles import Profile, assign_profiles
from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "examples" / "traces"
SHARED = Path("/work/shared/data/traces")
POD256 = str(ROOT / "examples" / "pod-256.yaml")


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# Trace adapters


def test_philly_rows_become_jobs_relative_to_the_first_arrival():
    trace = read_trace(str(TRACES / "philly_multigpu_first80.csv"))
    assert trace.fmt == "philly"
    assert len(trace.jobs) == 80 and not trace.malformed
    assert trace.jobs[0].arrival_s == 0.0
    assert trace.jobs[0].gpus == 8 and trace.jobs[0].duration_s == 2240194.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(trace.jobs, trace.jobs[1:], strict=False))


def test_tiresias_and_pollux_traces_are_detected_from_their_headers():
    tiresias = read_trace(str(TRACES / "tiresias_60_job.csv"))
    pollux = read_trace(str(TRACES / "pollux_workload-6_first40.csv"))
    assert (tiresias.fmt, len(tiresias.jobs)) == ("tiresias", 60)
    assert tiresias.jobs[0].app == "vgg19" and tiresias.jobs[0].duration_s == 164
    assert (pollux.fmt, len(pollux.jobs)) == ("pollux", 40)
    assert {j.app for j in pollux.jobs} <= {"cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet"}


def test_a_malformed_row_is_reported_with_its_line_and_skipped(tmp_path):
    path = write(
        tmp_path,
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,1,0,10,vgg,100,1\n"
        "1,abc,5,10,vgg,100,1\n"
        "2,2,nan,10,vgg,100,1\n"
        "3,4,9,10,vgg,-5,1\n"
        "4,2,10,10\n"
        "5,8,12,10,vgg,50,1\n",
    )
    trace = read_trace(path)
    assert [j.name for j in trace.jobs] == ["tiresias-0", "tiresias-5"]
    lines = [line for line, _ in trace.malformed]
    assert lines == [3, 4, 5, 6]
    assert "num_gpu" in trace.malformed[0][1] and "submit_time" in trace.malformed[1][1]
    with pytest.raises(TraceError) as err:
        read_trace(path, strict=True)
    assert err.value.line == 3 and "num_gpu" in str(err.value)


def test_alibaba_pods_without_gpus_or_never_scheduled_are_left_out_and_counted(tmp_path):
    path = write(
        tmp_path,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,1000,1024,1,500,,LS,Running,10,110,20\n"
        "p1,1000,1024,0,0,,LS,Running,12,50,12\n"
        "p2,1000,1024,8,1000,,LS,Pending,15,,\n"
        "p3,1000,1024,4,1000,,LS,Failed,30,90,40\n",
    )
    trace = read_trace(path)
    assert [(j.name, j.arrival_s, j.gpus, j.duration_s) for j in trace.jobs] == [
        ("p0", 0.0, 1, 90.0),
        ("p3", 20.0, 4, 50.0),
    ]
    assert sum(trace.ignored.values()) == 2


def test_an_unknown_header_or_format_is_an_error(tmp_path):
    with pytest.raises(TraceError, match="unknown trace header"):
        read_trace(write(tmp_path, "a,b\n1,2\n"))
    with pytest.raises(TraceError, match="format"):
        read_trace(str(TRACES / "tiresias_60_job.csv"), "slurm")
    with pytest.raises(TraceError, match="needs the columns"):
        read_trace(str(TRACES / "tiresias_60_job.csv"), "philly")


@pytest.mark.skipif(not SHARED.exists(), reason="the shared traces are not on this machine")
def test_alibaba_multigpu50_takes_times_from_the_default_list_beside_it():
    trace = read_trace(str(SHARED / "alibaba_v2023_openb_pod_list_multigpu50.csv"), seed=3)
    again = read_trace(str(SHARED / "alibaba_v2023_openb_pod_list_multigpu50.csv"), seed=3)
    default = read_trace(str(SHARED / "alibaba_v2023_openb_pod_list_default.csv"))
    assert trace.jobs == again.jobs
    timed = {j.name: j for j in default.jobs}
    shared = [j for j in trace.jobs if j.name in timed]
    assert len(shared) == len(default.jobs)
    assert all(j.duration_s == timed[j.name].duration_s for j in shared)
    assert trace.ignored["times drawn (no times in the trace)"] == len(trace.jobs) - len(shared)
    assert sum(j.gpus == 8 for j in trace.jobs) > sum(j.gpus == 8 for j in default.jobs)
    # Drawn pods arrive when timed pods do, not spread over the span a few early pods stretch.
    arrivals = {j.arrival_s for j in trace.jobs if j.name in timed}
    assert all(j.arrival_s in arrivals for j in trace.jobs if j.name not in timed)


# Profiles


def test_profiles_are_seeded_and_match_the_trace_gpus(pod256):
    jobs = [
        TraceJob(f"j{i}", float(i), g, 100.0) for i, g in enumerate([1, 2, 4, 8, 16, 32, 64, 128, 12] * 20)
    ]
    a = assign_profiles(jobs, pod256, seed=5)
    b = assign_profiles(jobs, pod256, seed=5)
    assert [p.spec for p in a] == [p.spec for p in b]
    assert [p.spec.gpus for p in a] == [j.gpus for j in jobs]
    assert all(p.spec.estimated_runtime_s == 100.0 for p in a)
    by_kind = {p.profile for p in a}
    assert {"single", "moe"} <= by_kind and by_kind & {"resnet50", "bert-large"}
    for p in a:
        if p.profile.startswith("llm"):
            assert p.spec.tp == 8 and p.spec.gpus >= 16
            assert {c.group for c in p.spec.comm} >= {"tp", "dp"}
        if p.profile == "moe":
            assert p.spec.ep == 8 and any(c.collective == "alltoall" for c in p.spec.comm)
        if p.profile == "single":
            assert p.spec.comm == ()
    assert all(not p.profile.startswith("llm") for p in a if p.spec.gpus % 8)


# Engine


def _profile(name: str, gpus: int, runtime_s: float, *, priority: int = 0, nbytes: float = 1.34e9) -> Profile:
    spec = load_job(
        {
            "version": 1,
            "name": name,
            "gpus": gpus,
            "priority": priority,
            "parallelism": {"tp": 1, "pp": 1, "dp": gpus},
            "model": {"flops_per_step": 1e15},
            "step": {"compute_ms": 300},
            "comm": [{"group": "dp", "collective": "allreduce", "bytes": nbytes}],
            "estimated_runtime_s": runtime_s,
        }
    )
    return Profile("dp", ("dp", gpus, priority, nbytes), spec)


def _replay(topology, profiles, arrivals, policy="topo", **config):
    return Replay(
        topology, profiles, arrivals, policy, SimConfig(**config), ideal_steps(topology, profiles)
    ).run()


def test_a_job_alone_at_its_ideal_placement_runs_its_trace_duration(pod256):
    run = _replay(pod256, [_profile("a", 8, 1000.0)], [5.0])
    (out,) = run.outcomes
    assert out.start_s == 5.0 and out.end_s == pytest.approx(1005.0)
    assert out.jct_s == pytest.approx(1000.0) and out.queued_s == 0


def test_gangs_wait_for_a_whole_placement_and_never_overbook(pod256):
    profiles = [_profile("big", 192, 1000.0), _profile("big2", 128, 500.0), _profile("small", 64, 100.0)]
    run = _replay(pod256, profiles, [0.0, 1.0, 2.0])
    by_id = {o.job_id: o for o in run.outcomes}
    assert max(run.busy) <= 256
    # The 128-GPU job cannot start beside the 192-GPU one; the small one backfills, ending before it.
    assert by_id[1].start_s == pytest.approx(by_id[0].end_s)
    assert by_id[2].start_s == 2.0


def test_a_spread_job_is_slower_than_its_ideal_and_sharing_uplinks_slows_it_more(pod256):
    # naive spreads an 8-GPU job over the nodes with most free GPUs: it crosses leaves.
    alone = _replay(pod256, [_profile("a", 8, 1000.0)], [0.0], policy="naive").outcomes[0]
    both = _replay(pod256, [_profile("a", 8, 1000.0), _profile("b", 8, 1000.0)], [0.0, 0.0], policy="naive")
    assert alone.end_s - alone.start_s > 1000.0
    assert alone.comm_gpu_s > 0
    assert max(o.end_s for o in both.outcomes) >= alone.end_s


def test_preemption_off_by_default_and_on_it_restarts_the_victim_later(pod256):
    profiles = [_profile("low", 256, 1000.0), _profile("high", 256, 100.0, priority=5)]
    off = {o.job_id: o for o in _replay(pod256, profiles, [0.0, 10.0]).outcomes}
    assert off[1].start_s == pytest.approx(off[0].end_s)
    on_run = _replay(pod256, profiles, [0.0, 10.0], preemption=True, restart_cost_s=50.0)
    on = {o.job_id: o for o in on_run.outcomes}
    assert on_run.preemptions == 1 and on[1].start_s == 10.0
    # 990 s of work were left, plus the restart cost, after the high-priority job's 100 s.
    assert on[0].end_s == pytest.approx(10.0 + 100.0 + 990.0 + 50.0)


def test_results_are_reproducible_for_a_seed(pod256):
    trace = read_trace(str(TRACES / "philly_multigpu_first80.csv"))
    a = simulate(pod256, trace, ["topo", "naive"], seed=7, load=0.9)
    b = simulate(pod256, trace, ["topo", "naive"], seed=7, load=0.9)
    c = simulate(pod256, trace, ["topo", "naive"], seed=8, load=0.9)
    assert a.as_dict(series=True) == b.as_dict(series=True)
    assert a.trace["profiles"] != c.trace["profiles"] or a.summaries != c.summaries
    for summary in a.summaries.values():
        assert summary["jobs"] + summary["rejected"] == 80
        assert 0 < summary["utilisation"] <= 1 and 0 <= summary["fragmentation"] <= 1


def test_load_scales_arrivals_to_the_offered_load(pod256):
    jobs = [TraceJob(f"j{i}", 100.0 * i, 8, 100.0) for i in range(11)]
    trace = TraceRead("philly", jobs)
    # Ten jobs of 8 GPUs x 100 s inside the 1000 s window (the last arrives as it closes): 0.03125.
    assert offered_load(jobs, 256) == pytest.approx(8000 / 256000)
    out = simulate(pod256, trace, ["first_fit"], load=0.1)
    # Arrivals x s: the job arriving k gaps before the last holds min(100, 100 s k) of the window
    # of 1000 s GPUs-seconds x 256; for 0.1 jobs k >= 4 hold all their 100 s: (7 + 6 s) / 320 s = 0.1.
    assert out.trace["arrival_scale"] == pytest.approx(7 / 26)
    assert out.trace["scaled_load"] == pytest.approx(0.1)
    assert offered_load(jobs, 256, 7 / 26) == pytest.approx(0.1)


def test_a_load_beyond_packing_the_arrivals_stops_near_its_ceiling():
    jobs = [TraceJob(f"j{i}", 100.0 * i, 8, 100.0) for i in range(11)]
    # Even arrivals all but at once leave each job holding its GPUs only to the last arrival:
    # (1 + ... + 10) / 320 = 0.171875 at most.
    scale, reached = arrival_scale(jobs, 256, 0.5)
    assert reached == pytest.approx(0.171875 * 0.999, rel=1e-6)
    # The ceiling holds for every factor up to 0.1 (the widest gap, 100 s x 0.1, no longer than a
    # job): the factor stops just above, not at arrivals all at once.
    assert 0.1 < scale < 0.101


def test_a_job_running_long_past_the_arrivals_counts_only_inside_the_window():
    short = [TraceJob(f"s{i}", 10.0 * i, 1, 10.0) for i in range(200)]
    long = [TraceJob("long", 500.0, 8, 1e7)]
    jobs = sorted(short + long, key=lambda j: j.arrival_s)
    first, last = arrival_window([j.arrival_s for j in jobs])
    # The 1st and 99th percentiles of 201 arrivals: the 3rd and the 199th.
    assert (first, last) == (20.0, 1970.0)
    held = sum(
        min(j.arrival_s + 10.0, last) - max(j.arrival_s, first)
        for j in short
        if first < j.arrival_s + 10 and j.arrival_s < last
    )
    assert offered_load(jobs, 16) == pytest.approx((held + 8 * (last - 500.0)) / ((last - first) * 16))


def test_metrics_say_how_busy_the_cluster_was_while_jobs_waited(pod256):
    # Two 256-GPU jobs back to back: the second waits the whole first run on a full cluster.
    run = _replay(pod256, [_profile("a", 256, 100.0), _profile("b", 256, 100.0)], [0.0, 0.0])
    s = summarize(run)
    assert s["busy_while_waiting"] == pytest.approx(1.0)
    assert s["waiting_share"] == pytest.approx(0.5)
    assert s["utilisation_window"] is None  # every arrival at one instant: no window


def test_a_job_larger_than_the_cluster_is_rejected_not_queued_forever(pod256):
    run = _replay(pod256, [_profile("huge", 512, 10.0), _profile("ok", 8, 10.0)], [0.0, 1.0])
    assert 0 in run.rejected and "512" in run.rejected[0]
    assert [o.job_id for o in run.outcomes] == [1]


def test_migration_moves_a_spread_job_and_charges_the_restart(pod256):
    # 32 seven-GPU jobs leave one free GPU per node: the 16-GPU job starts spread over 16 nodes,
    # then they end and two whole nodes are free.
    profiles = [_profile(f"b{i}", 7, 50.0) for i in range(32)] + [_profile("a", 16, 20000.0)]
    arrivals = [0.0] * 32 + [1.0]
    run = _replay(pod256, profiles, arrivals, migration=True, migration_interval_s=100.0, restart_cost_s=60.0)
    plain = _replay(pod256, profiles, arrivals)
    moved = {o.job_id: o for o in run.outcomes}[32]
    stayed = {o.job_id: o for o in plain.outcomes}[32]
    assert run.migrations == 1 and plain.migrations == 0
    assert stayed.first_step_ms > stayed.ideal_step_ms
    assert moved.end_s < stayed.end_s
    assert moved.end_s > 1.0 + 20000.0 + 60.0


def test_a_job_priced_at_zero_ms_runs_its_trace_duration(pod256):
    spec = load_job(
        {
            "version": 1,
            "name": "idle",
            "gpus": 2,
            "parallelism": {"dp": 2},
            "step": {"compute_ms": 0},
            "comm": [],
        }
    )
    prof = Profile("idle", ("idle",), replace(spec, estimated_runtime_s=50.0))
    (out,) = _replay(pod256, [prof], [3.0]).outcomes
    assert out.end_s == pytest.approx(53.0)


def test_time_weighted_mean_weights_each_value_by_how_long_it_held():
    assert time_weighted_mean([0.0, 10.0], [1.0, 0.0], 40.0) == pytest.approx(0.25)
    assert time_weighted_mean([], [], 10.0) == 0.0


# CLI


def test_cli_simulate_prints_json_and_writes_a_report(capsys, tmp_path):
    status = main(
        [
            "simulate",
            "--topology",
            POD256,
            "--trace",
            str(TRACES / "tiresias_60_job.csv"),
            "--policies",
            "topo,naive",
            "--limit",
            "30",
            "--json",
            "--report",
            str(tmp_path / "report"),
        ]
    )
    captured = capsys.readouterr()
    assert status == 0
    out = json.loads(captured.out)
    assert set(out["policies"]) == {"topo", "naive"}
    assert out["trace"]["jobs"] == 30 and "series" not in out
    assert "100.0% 30/30 jobs" in captured.err
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Job completion time" in page and "plotly.min.js" in page
    assert (tmp_path / "report" / "plotly.min.js").stat().st_size > 1_000_000


def test_cli_simulate_reports_malformed_lines_and_bad_flags(capsys, tmp_path):
    path = write(
        tmp_path,
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,1,0,1,m,10,1\n1,x,1,1,m,10,1\n",
    )
    assert main(["simulate", "--topology", POD256, "--trace", path, "--policies", "first_fit"]) == 0
    assert f"{path}:3: skipped: num_gpu" in capsys.readouterr().err
    assert main(["simulate", "--topology", POD256, "--trace", path, "--strict"]) == 2
    assert "line 3" in capsys.readouterr().err
    assert main(["simulate", "--topology", POD256, "--trace", path, "--policies", "topo,best"]) == 2
    assert "--policies" in capsys.readouterr().err
    assert main(["simulate", "--topology", POD256, "--trace", path, "--limit", "0"]) == 2
    assert "--limit" in capsys.readouterr().err
    assert main(["simulate", "--topology", path, "--trace", path]) == 2
    assert "--topology" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED.exists(), reason="the shared traces are not on this machine")
def test_the_trace_benchmark_quick_run_prints_every_policy_and_the_targets():
    done = run_script(
        [sys.executable, str(ROOT / "bench" / "simulate_traces.py"), "--quick", "--traces", str(SHARED)],
        cpu_s=120,
    )
    assert done.returncode == 0, done.stderr
    for text in (
        "philly-multigpu on pod-256",
        "alibaba-multigpu50 on pod-256",
        "topo mean JCT / naive",
        "Targets",
    ):
        assert text in done.stdout
    assert "mean GPUs/job" in done.stdout and "AcmeTrace" in done.stdout
