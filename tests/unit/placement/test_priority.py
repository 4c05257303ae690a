"""Fair-share arithmetic and the effective priority's terms (no Django)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.placement.priority import (
    PriorityWeights,
    Usage,
    decayed_gpu_seconds,
    fair_share_factors,
    gpu_seconds_since,
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


def test_running_use_counts_up_to_now_and_period_use_is_clipped_to_the_window():
    running = Usage(1, 8, NOW - timedelta(hours=10), None)
    assert gpu_seconds_since([running], since=NOW - timedelta(hours=4), now=NOW) == {1: 8 * 4 * 3600.0}


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
