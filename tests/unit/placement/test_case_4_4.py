"""The seed's case 4.4: 2 nodes x 8 A100, 11 GB/s NICs, BERT-Large with two DP groups of 8."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from apps.placement.costmodel import evaluate
from apps.placement.solvers import place
from tests.scripts import run_script

ROOT = Path(__file__).resolve().parents[3]
# Ranks 0-3 on node A GPUs 0-3, 4-7 on node B 0-3, 8-11 on A 4-7, 12-15 on B 4-7.
SEED_FIRST_MAPPING = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def dp_ms(prediction) -> float:
    return max(gc.time_ms for gc in prediction.groups if gc.group == "dp")


def test_seed_first_mapping_spends_109_ms_on_dp_communication(case44, case44_job):
    prediction = evaluate(case44, case44_job, SEED_FIRST_MAPPING)
    assert dp_ms(prediction) == pytest.approx(109.0, rel=0.02)
    assert prediction.comm_ms == pytest.approx(109.0, rel=0.02)


def test_topo_puts_each_dp_group_on_one_node_for_2_7_ms(case44, case44_job):
    result = place(case44, case44.free_mask(), None, case44_job, policy="topo")
    nodes = [case44.gpu_key(g)[0] for g in result.gids]
    assert len(set(nodes[:8])) == 1 and len(set(nodes[8:])) == 1
    assert nodes[0] != nodes[8]
    assert dp_ms(result.prediction) == pytest.approx(2.7, rel=0.02)
    assert {gc.level for gc in result.prediction.groups} == {"nvlink"}


def test_naive_reproduces_the_seed_first_mapping(case44, case44_job):
    result = place(case44, case44.free_mask(), None, case44_job, policy="naive")
    assert list(result.gids) == SEED_FIRST_MAPPING
    assert dp_ms(result.prediction) == pytest.approx(109.0, rel=0.02)


def run_cli(*args: str) -> dict:
    done = run_script([sys.executable, "-m", "apps.placement", *args], cpu_s=60, check=True)
    return json.loads(done.stdout)


def test_cli_naive_reproduces_the_seed_first_mapping_and_topo_is_40_times_faster():
    files = ["--topology", "examples/case-4-4.yaml", "--job", "examples/case-4-4-job.yaml"]
    out = run_cli("place", *files, "--policy", "naive")
    a_then_b = [(r["node"], r["gpu"]) for r in out["ranks"]]
    assert a_then_b == (
        [("node-a", g) for g in range(4)]
        + [("node-b", g) for g in range(4)]
        + [("node-a", g) for g in range(4, 8)]
        + [("node-b", g) for g in range(4, 8)]
    )
    assert out["predicted"]["comm_ms"] == pytest.approx(109.0, rel=0.02)
    topo = run_cli("place", *files, "--policy", "topo")
    assert topo["predicted"]["comm_ms"] == pytest.approx(2.7, rel=0.02)
    assert topo["vs_naive"]["comm_ratio"] == pytest.approx(109.09 / 2.667, rel=0.02)
    assert topo["vs_naive"]["step_ratio"] == pytest.approx(209.09 / 102.67, rel=0.02)
