"""Fair-share arithmetic and the effective priority's terms (no Django)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.placement.priority import (
    PriorityWeights,
    Usage,
    decayed_gpu_seconds,
    fair_share_factors,
    priority_terms,
)

NOW = datetime(2026, 1, 2, tzinfo=UTC)
DAY = 86400.0


def test_a_gpu_day_one_half_life_ago_weighs_half_of_one_ending_now():
    recent = Usage(1, 1, NOW - timedelta(hours=1), NOW)
    older = Usage(2, 1, NOW - timedelta(days=1, hours=1), NOW - timedelta(days=1))
    used = decayed_gpu_seconds([recent, older], now=NOW, half_life_s=DAY)
    assert used[2] / used[1] == pytest.approx(0.5, rel=1e-9)
    assert used[1] == pytest.approx(3600.0, rel=0.02)


def test_running_use_counts_up_to_now():
    running = Usage(1, 8, NOW - timedelta(hours=10), None)
    ended = Usage(1, 8, NOW - timedelta(hours=10), NOW)
    assert decayed_gpu_seconds([running], now=NOW, half_life_s=DAY) == decayed_gpu_seconds(
        [ended], now=NOW, half_life_s=DAY
    )


def test_fair_share_is_one_unused_half_at_share_and_lower_beyond():
    f = fair_share_factors({1: 0.0, 2: 75.0, 3: 25.0}, {1: 1, 2: 1, 3: 2})
    assert f[1] == 1.0
    # Account 2: 75% of the use on a 25% share; account 3: 25% on 50%.
    assert f[2] == pytest.approx(2**-3)
    assert f[3] == pytest.approx(2**-0.5)
    assert fair_share_factors({1: 10.0}, {1: 1})[1] == 0.5


def test_effective_priority_is_the_weighted_sum_of_its_terms():
    t = priority_terms(
        requested=20,
        submitted_at=NOW - timedelta(days=3.5),
        now=NOW,
        fair_share_factor=0.25,
        weights=PriorityWeights(requested=2, age=10, fair_share=100),
    )
    assert (t.requested, t.age, t.fair_share) == (40, pytest.approx(5.0), 25.0)
    assert t.effective == pytest.approx(70.0)
    assert priority_terms(requested=0, submitted_at=NOW, now=NOW, fair_share_factor=None).fair_share == 50.0


def _stream(gpus: int = 4):
    from apps.placement.jobs import load_job

    return load_job(
        {
            "version": 1,
            "name": "stream",
            "gpus": gpus,
            "parallelism": {"tp": gpus, "pp": 1, "dp": 1},
            "step": {"compute_ms": 100},
            "comm": [{"group": "tp", "collective": "allreduce", "bytes": 1e8}],
            "estimated_runtime_s": 1800,
        }
    )


@pytest.mark.parametrize("fair_share_weight, expected", [(100.0, 3.0), (0.0, 1.0)])
def test_shares_one_to_three_get_gpu_hours_one_to_three_over_a_day(fair_share_weight, expected):
    from pathlib import Path

    from apps.placement.sim.fairshare import replay_fair_share
    from apps.placement.topology.io import load_topology_file

    topo = load_topology_file(str(Path(__file__).resolve().parents[3] / "examples" / "case-4-4.yaml"))
    run = replay_fair_share(
        topo,
        _stream(),
        shares={"a": 1, "b": 3},
        duration_s=24 * 3600.0,
        # Each account asks for three quarters of the 16 GPUs.
        interval_s=4 * 1800 / 12,
        weights=PriorityWeights(fair_share=fair_share_weight),
    )
    # Without the fair-share term both get the same: the same stream, first come first served.
    assert run.ratio("a", "b") == pytest.approx(expected, rel=0.10)
    assert sum(run.gpu_hours.values()) == pytest.approx(16 * 24, rel=0.05)
