"""Formatting helpers of the dashboard templates."""

import pytest

from apps.dashboard.templatetags.dashboard import duration_s, gbps, ms, pct, ranks


def test_ranks_collapse_runs():
    assert ranks((0, 1, 2, 3, 8, 10, 11)) == "0-3, 8, 10-11"
    assert ranks(()) == ""


@pytest.mark.parametrize(
    ("value", "text"), [(2.6667, "2.67 ms"), (209.09, "209 ms"), (12_500, "12.5 s"), (None, "–")]
)
def test_ms_formats_milliseconds(value, text):
    assert ms(value) == text


def test_pct_and_gbps():
    assert pct(0.5073) == "50.7%"
    assert pct(None) == "–"
    assert gbps(11.0) == "11 GB/s"
    assert gbps(0) == "no path"
    assert gbps(float("inf")) == "no path"


def test_duration_s_picks_a_coarse_unit():
    assert duration_s(42) == "42 s"
    assert duration_s(720) == "12 min"
    assert duration_s(3 * 3600) == "3.0 h"
    assert duration_s(3 * 86400) == "3.0 d"
