"""The placement CLI (`python -m apps.placement`) and the benchmarks' smoke runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from apps.placement.__main__ import main
from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[3]
TOPOLOGY = str(ROOT / "examples" / "case-4-4.yaml")
JOB = str(ROOT / "examples" / "case-4-4-job.yaml")


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, json.loads(captured.out) if captured.out.strip() else None, captured.err


def write(tmp_path: Path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def small_job(tmp_path: Path, **changes) -> str:
    spec = yaml.safe_load(Path(JOB).read_text())
    spec["comm"][0]["bytes"] = float(spec["comm"][0]["bytes"])
    spec.update(changes)
    # The same FLOPs per GPU as the 16-GPU job: fewer GPUs in the same compute_ms do less work.
    spec["model"]["flops_per_step"] = float(spec["model"]["flops_per_step"]) * spec["gpus"] / 16
    return write(tmp_path, "job.json", spec)


def test_place_prints_the_placement_with_its_bound_and_the_naive_comparison(capsys):
    status, out, _ = run(capsys, "place", "--topology", TOPOLOGY, "--job", JOB)
    assert status == 0
    assert out["job"] == "bert-large-16" and out["policy"] == "topo"
    assert [r["rank"] for r in out["ranks"]] == list(range(16))
    assert out["predicted"]["comm_ms"] == pytest.approx(2.667, rel=0.01)
    assert out["predicted"]["step_ms"] == pytest.approx(102.667, rel=0.01)
    assert out["lower_bound"]["comm_ms"] == pytest.approx(2.667, rel=0.01)
    assert out["gap"] == pytest.approx(1.0)
    naive = out["vs_naive"]
    assert naive["policy"] == "naive"
    assert naive["comm_ms"] == pytest.approx(109.09, rel=0.01)
    assert naive["step_ratio"] == pytest.approx(naive["step_ms"] / out["predicted"]["step_ms"])


def test_place_leaves_busy_gpus_alone(capsys, tmp_path):
    job = small_job(tmp_path, gpus=8, parallelism={"tp": 1, "pp": 1, "dp": 8})
    busy = write(tmp_path, "busy.json", [{"node": "node-a", "gpu": 0}])
    status, out, _ = run(capsys, "place", "--topology", TOPOLOGY, "--job", job, "--busy", busy)
    assert status == 0
    assert {r["node"] for r in out["ranks"]} == {"node-b"}


def test_place_reports_a_job_that_does_not_fit_with_exit_1(capsys, tmp_path):
    busy = write(tmp_path, "busy.json", [{"node": "node-a", "gpu": g} for g in range(4)])
    status, out, _ = run(capsys, "place", "--topology", TOPOLOGY, "--job", JOB, "--busy", busy)
    assert status == 1
    assert out == {"job": "bert-large-16", "policy": "topo", "no_fit": "needs 16 GPUs, 12 free"}


def test_place_uses_the_policy_the_job_asks_for(capsys, tmp_path):
    job = small_job(tmp_path, policy="naive")
    status, out, _ = run(capsys, "place", "--topology", TOPOLOGY, "--job", job)
    assert status == 0 and out["policy"] == "naive"
    assert out["predicted"]["comm_ms"] == pytest.approx(109.09, rel=0.01)


def test_evaluate_accepts_a_whole_placement_output_or_its_ranks_list(capsys, tmp_path):
    _, placed, _ = run(capsys, "place", "--topology", TOPOLOGY, "--job", JOB, "--policy", "naive")
    whole = write(tmp_path, "whole.json", placed)
    ranks = write(tmp_path, "ranks.json", placed["ranks"])
    status, out, _ = run(capsys, "evaluate", "--topology", TOPOLOGY, "--job", JOB, "--ranks", whole)
    assert status == 0 and out["policy"] == "naive"
    assert out["predicted"]["comm_ms"] == pytest.approx(109.09, rel=0.01)
    assert out["gap"] == pytest.approx(109.09 / 2.667, rel=0.01)
    status, out, _ = run(capsys, "evaluate", "--topology", TOPOLOGY, "--job", JOB, "--ranks", ranks)
    assert status == 0 and out["policy"] == "given"
    assert out["ranks"] == placed["ranks"]


def test_bound_prints_each_group_priced_alone(capsys):
    status, out, _ = run(capsys, "bound", "--topology", TOPOLOGY, "--job", JOB)
    assert status == 0
    assert out["lower_bound"]["comm_ms"] == pytest.approx(2.667, rel=0.01)
    assert {g["level"] for g in out["lower_bound"]["groups"]} == {"nvlink"}


def bad_input(capsys, *argv: str) -> str:
    status, out, err = run(capsys, *argv)
    assert status == 2
    assert out is None
    assert err.count("\n") == 1 and err.startswith("error: ")
    return err


def test_a_missing_file_is_bad_input_naming_its_flag(capsys):
    err = bad_input(capsys, "place", "--topology", "no/such.yaml", "--job", JOB)
    assert "--topology: cannot read no/such.yaml" in err


def test_an_invalid_job_is_bad_input_naming_the_field(capsys, tmp_path):
    job = small_job(tmp_path, gpus=12)
    err = bad_input(capsys, "place", "--topology", TOPOLOGY, "--job", job)
    assert "--job: parallelism: tp*pp*dp=16 but gpus=12" in err


def test_busy_gpus_that_are_not_json_are_bad_input(capsys, tmp_path):
    path = tmp_path / "busy.json"
    path.write_text("[{node: a}")
    err = bad_input(capsys, "place", "--topology", TOPOLOGY, "--job", JOB, "--busy", str(path))
    assert "--busy:" in err and "not valid JSON" in err


def test_a_busy_gpu_on_an_unknown_node_is_bad_input(capsys, tmp_path):
    busy = write(tmp_path, "busy.json", [{"node": "node-a", "gpu": 1}, {"node": "node-z", "gpu": 0}])
    err = bad_input(capsys, "place", "--topology", TOPOLOGY, "--job", JOB, "--busy", busy)
    assert "busy[1].node: unknown node 'node-z'" in err


def test_a_busy_gpu_index_past_the_node_is_bad_input(capsys, tmp_path):
    busy = write(tmp_path, "busy.json", [{"node": "node-a", "gpu": 8}])
    err = bad_input(capsys, "place", "--topology", TOPOLOGY, "--job", JOB, "--busy", busy)
    assert "busy[0].gpu: node 'node-a' has GPUs 0..7, got 8" in err


def test_ranks_that_share_a_gpu_are_bad_input(capsys, tmp_path):
    entries = [{"rank": r, "node": "node-a" if r < 8 else "node-b", "gpu": r % 8} for r in range(16)]
    entries[5]["gpu"] = 4
    ranks = write(tmp_path, "ranks.json", entries)
    err = bad_input(capsys, "evaluate", "--topology", TOPOLOGY, "--job", JOB, "--ranks", ranks)
    assert "--ranks: ranks[5]: node-a GPU 4 is already rank 4's" in err


def test_ranks_of_the_wrong_count_are_bad_input(capsys, tmp_path):
    ranks = write(tmp_path, "ranks.json", [{"rank": 0, "node": "node-a", "gpu": 0}])
    err = bad_input(capsys, "evaluate", "--topology", TOPOLOGY, "--job", JOB, "--ranks", ranks)
    assert "job 'bert-large-16' has 16 ranks, got 1 entries" in err


def test_the_module_exits_2_with_one_line_on_bad_input():
    done = run_script(
        [sys.executable, "-m", "apps.placement", "bound", "--topology", TOPOLOGY, "--job", "missing.yaml"],
        cpu_s=30,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: --job: cannot read missing.yaml: No such file or directory"
    ]


# Smoke runs of the benchmarks; --quick keeps each to a few seconds of CPU, the budget to 20 s.
@pytest.mark.parametrize(
    "script,expect",
    [
        ("placement_quality.py", ["mean predicted comm per step", "topo gap", "targets"]),
        (
            "placement_speed.py",
            ["topo p50", "placements/s", "growth exponent", "targets", "FIGURE placements_per_s_8gpu="],
        ),
    ],
)
def test_benchmark_quick_run_prints_its_tables(script, expect):
    done = run_script([sys.executable, str(ROOT / "bench" / script), "--quick"], cpu_s=20)
    assert done.returncode == 0, done.stderr
    for text in expect:
        assert text in done.stdout


def test_adversarial_benchmark_quick_run_prints_oracle_gaps_and_speed():
    # One scenario per class and a short search: longer than the others, so its own budget.
    done = run_script(
        [sys.executable, str(ROOT / "bench" / "placement_adversarial.py"), "--quick"], cpu_s=120
    )
    assert done.returncode == 0, done.stderr
    for text in ("topo against the search oracle", "nic-1-vs-8", "1,024-GPU job on 16,384 GPUs", "targets"):
        assert text in done.stdout
