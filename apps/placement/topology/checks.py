"""Field checks shared by the spec loaders: each records (field path, message) and returns a usable value."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .model import SpecError


class _Errors:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, msg: str) -> None:
        self.items.append((path, msg))

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)


def _check_keys(
    errs: _Errors, path: str, obj: Any, required: set[str], optional: set[str] = frozenset()
) -> bool:
    if not isinstance(obj, Mapping):
        errs.add(path, f"must be a mapping, got {type(obj).__name__}")
        return False
    for k in obj:
        if k not in required and k not in optional:
            errs.add(f"{path}.{k}" if path else str(k), "unknown field")
    ok = True
    for k in sorted(required):
        if k not in obj:
            errs.add(f"{path}.{k}" if path else k, "required field is missing")
            ok = False
    return ok


def _positive(errs: _Errors, path: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        errs.add(path, f"must be a number, got {value!r}")
        return 1.0
    if value < 0 or (value == 0 and not allow_zero):
        errs.add(path, f"must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
        return 1.0
    return float(value)


def _count(errs: _Errors, path: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        errs.add(path, f"must be a whole number, got {value!r}")
        return minimum
    if value < minimum:
        errs.add(path, f"must be at least {minimum}, got {value}")
        return minimum
    return value


def _name(errs: _Errors, path: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        errs.add(path, f"must be a non-empty string, got {value!r}")
        return f"<invalid {path}>"
    return value
