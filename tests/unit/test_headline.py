"""README's headline block is what bench/headline.py prints: its fixture run (the trace's first 80
jobs, a file in the repository) is rerun here and must give the README's row exactly; with the
full trace at hand one of its runs is rerun too; the spread row follows from the run rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import headline  # noqa: E402

README = (ROOT / "README.md").read_text()
RUNS = {run.name: run for run in headline.RUNS}


def readme_line(name: str) -> str:
    inside = README.split(headline.START, 1)[1].split(headline.END, 1)[0]
    return next(line.strip() for line in inside.splitlines() if line.startswith(f"| {name} |"))


def test_the_readme_fixture_row_is_what_the_command_prints_for_it():
    run = RUNS["fixture"]
    assert readme_line("fixture") == headline.row(run, headline.replay(run, headline.DEFAULT_TRACES))


def test_a_full_trace_row_is_what_the_command_prints_for_it():
    if not (headline.DEFAULT_TRACES / headline.TRACE).exists():
        pytest.skip(f"the full trace is not in {headline.DEFAULT_TRACES}")
    run = RUNS["prefix-500"]
    assert readme_line("prefix-500") == headline.row(run, headline.replay(run, headline.DEFAULT_TRACES))


def test_the_readme_has_every_run_and_the_spread_of_its_rows():
    rows = headline.readme_rows(README)
    assert set(rows) == set(RUNS)
    assert headline.readme_spread(README) == headline.spread(rows)


def test_writing_replaces_only_the_block():
    text = f"intro\n{headline.START}\nold table\n{headline.END}\noutro\n"
    assert headline.write(text, "new") == f"intro\n{headline.START}\nnew\n{headline.END}\noutro\n"
    with pytest.raises(SystemExit, match="headline"):
        headline.write("no markers", "new")
