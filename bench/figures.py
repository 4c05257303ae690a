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
