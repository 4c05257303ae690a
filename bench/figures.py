"""The benchmarks' machine-readable figures: one `FIGURE name=value unit` line each on stdout,
beside the human output, read by bench/ab.py (and by anyone grepping a log)."""

from __future__ import annotations

import math
import re

NAME = re.compile(r"[A-Za-z0-9_.:/-]+")


def figure(name: str, value: float, unit: str = "") -> str:
    """Print and return the FIGURE line of `value` (`unit` is one word: ms, 1/s, s, ...)."""
    if not NAME.fullmatch(name):
        raise ValueError(f"figure name {name!r}: letters, digits and _.:/- only")
    if " " in unit:
        raise ValueError(f"figure unit {unit!r}: one word")
    text = "nan" if math.isnan(value) else f"{value:.6g}"
    line = f"FIGURE {name}={text}" + (f" {unit}" if unit else "")
    print(line, flush=True)
    return line


def slug(label: str) -> str:
    """A human label as a figure name part: lower case, runs of other characters as one `_`
    ("queue history, last 7 days (500 rows)" -> "queue_history_last_7_days_500_rows")."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
