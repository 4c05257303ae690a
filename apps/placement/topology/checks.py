"""Field checks shared by the spec loaders: each records (field path, message) and returns a usable value."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .model import SpecError
from .ranges import MAX_LATENCY_US, NAME_HELP, NAME_RE, MAX_BW_GBps, MIN_BW_GBps
from .safeload import cut

MAX_ERRORS = 100  # problems listed per spec; a hostile spec can have millions


class _Errors:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.dropped = 0

    def add(self, path: str, msg: str) -> None:
        if len(self.items) < MAX_ERRORS:
            self.items.append((path, msg))
        else:
            self.dropped += 1

    def raise_if_any(self) -> None:
        if self.items:
            more = [("", f"and {self.dropped} more problems")] if self.dropped else []
            raise SpecError(self.items + more)


def _key(key: Any) -> str:
    """A mapping key as shown in a field path, cut to 40 characters."""
    text = str(key)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _check_keys(
    errs: _Errors, path: str, obj: Any, required: set[str], optional: set[str] = frozenset()
) -> bool:
    if not isinstance(obj, Mapping):
        errs.add(path, f"must be a mapping, got {type(obj).__name__}")
        return False
    for k in obj:
        if k not in required and k not in optional:
            errs.add(f"{path}.{_key(k)}" if path else _key(k), "unknown field")
    ok = True
    for k in sorted(required):
        if k not in obj:
            errs.add(f"{path}.{k}" if path else k, "required field is missing")
            ok = False
    return ok


def _positive(
    errs: _Errors, path: str, value: Any, *, maximum: float, minimum: float = 0.0, allow_zero: bool = False
) -> float:
    """A finite number in (minimum, maximum] (or [0, maximum] with allow_zero); 1.0 after an error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errs.add(path, f"must be a number, got {cut(value)}")
        return 1.0
    # Compared before any float(): an int of 400 digits compares exactly but overflows a float.
    if isinstance(value, float) and not math.isfinite(value):
        errs.add(path, f"must be a finite number, got {value!r}")
        return 1.0
    if value < 0 or (value == 0 and not allow_zero):
        errs.add(path, f"must be {'non-negative' if allow_zero else 'positive'}, got {cut(value)}")
        return 1.0
    if value > maximum:
        bound = f"between 0 and {maximum:g}" if allow_zero else f"at most {maximum:g}"
        errs.add(path, f"must be {bound}, got {cut(value)}")
        return 1.0
    if 0 < value < minimum:
        bound = f"0 or at least {minimum:g}" if allow_zero else f"at least {minimum:g}"
        errs.add(path, f"must be {bound}, got {cut(value)}")
        return 1.0
    return float(value)


def _count(errs: _Errors, path: str, value: Any, *, maximum: int, minimum: int = 1) -> int:
    """A whole number in [minimum, maximum]; `minimum` after an error."""
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(path, f"must be a whole number, got {cut(value)}")
        return minimum
    if value < minimum:
        errs.add(path, f"must be at least {minimum}, got {cut(value)}")
        return minimum
    if value > maximum:
        errs.add(path, f"must be at most {maximum}, got {cut(value)}")
        return minimum
    return value


def _name(
    errs: _Errors, path: str, value: Any, *, pattern: re.Pattern = NAME_RE, help: str = NAME_HELP
) -> str:
    """A name matching `pattern` (host-name-like by default, see ranges.NAME_RE)."""
    if not isinstance(value, str) or not pattern.match(value):
        errs.add(path, f"must be {help}, got {cut(value)}")
        return f"<invalid {path}>"
    return value


def _bw(errs: _Errors, path: str, value: Any) -> float:
    """A bandwidth in GB/s within the hardware range."""
    return _positive(errs, path, value, minimum=MIN_BW_GBps, maximum=MAX_BW_GBps)


def _latency(errs: _Errors, path: str, value: Any) -> float:
    """A latency in microseconds within the hardware range."""
    return _positive(errs, path, value, maximum=MAX_LATENCY_US)
