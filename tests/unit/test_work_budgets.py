"""Work budgets: queries and cache calls per API request and per scheduling cycle, cost-model calls
per placement (bench/work_counts.py) stay within bench/budgets.json. Counts, not times, so a loaded
machine cannot make this flaky; a budget changes only in a commit that says why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import work_counts  # noqa: E402

BUDGETS = work_counts.load_budgets()


def test_every_budget_says_why_and_is_a_positive_number():
    for name, entry in BUDGETS.items():
        assert isinstance(entry["budget"], (int, float)) and entry["budget"] > 0, name
        assert len(entry["why"].split()) >= 3, name


def test_placement_cost_model_calls_within_budget():
    counts = work_counts.placement_counts()
    assert work_counts.over_budget(counts, BUDGETS) == []


@pytest.mark.django_db(transaction=True)
def test_api_and_cycle_queries_and_cache_calls_within_budget():
    # Outside a test transaction, so transactions and on-commit hooks run as in production.
    counts = work_counts.api_counts()
    assert work_counts.over_budget(counts, BUDGETS) == []


def test_every_budget_belongs_to_a_counted_figure():
    names = set(work_counts.placement_counts(runs=1))
    names |= {f"{kind}.{what}" for kind in ("queries", "cache_calls") for what in work_counts.API_REQUESTS}
    names |= {"queries.cycle", "evaluate_per_placement.cycle"}
    assert set(BUDGETS) == names


def test_a_count_over_its_budget_or_without_one_is_reported():
    budgets = {"queries.submit": {"budget": 5, "why": "x y z"}}
    assert work_counts.over_budget({"queries.submit": 5}, budgets) == []
    assert work_counts.over_budget({"queries.submit": 6}, budgets) == [
        "queries.submit = 6 is over its budget of 5"
    ]
    assert work_counts.over_budget({"queries.other": 1}, budgets) == [
        "queries.other = 1 has no budget in bench/budgets.json"
    ]
