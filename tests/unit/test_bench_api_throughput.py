"""bench/api_throughput.py's figures when few or no jobs were placed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import api_throughput  # noqa: E402


def test_placed_per_s_runs_from_the_burst_to_the_last_placement():
    assert api_throughput.placed_per_s([101.0, 102.0, 104.0, 103.0], 100.0) == 1.0


def test_nothing_placed_is_said_not_crashed_on():
    with pytest.raises(ValueError, match="nothing was placed"):
        api_throughput.placed_per_s([], 100.0)
    said = api_throughput.nothing_placed(38, 40, [503, 429, 503], 300)
    assert said.startswith("api_throughput: NOTHING WAS PLACED: 38 of 40 submissions accepted")
    assert "[429, 503]" in said and "300 s" in said
