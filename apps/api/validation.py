"""The API's one validation layer for what DRF serializers and filter forms do not see: parsed
bodies (NUL bytes, integers wider than any column, non-finite numbers), the body's shape, and
hand-read query parameters. Each check raises DRF's ValidationError naming the field, which the
exception handler renders as a 400."""

from __future__ import annotations

import math
from typing import Any

from django.http import QueryDict
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

# The widest integer column of any supported backend (SQLite and Postgres bigint).
MAX_INT = 2**63 - 1
# Echoed values are cut to this many characters, so an error never repeats a large input.
SHOWN_CHARS = 40
# Parameters that name a row by id accept at most this many digits (ids are bigints).
MAX_ID_DIGITS = 18


def shown(value: Any) -> str:
    """`repr(value)`, cut to SHOWN_CHARS characters."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        # repr() of a huge integer costs quadratic time and is unreadable anyway.
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def field_error(field: str, message: str) -> ValidationError:
    """A 400 whose body is `{field: [message]}`."""
    return ValidationError({field or "detail": [message]})


def _surrogate_at(text: str) -> int:
    """Index of the first lone surrogate in `text` (JSON's "\\ud800" escapes make them), or -1."""
    if text.isascii():
        return -1
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return -1


def _printable_path(path: str) -> str:
    # A field name is echoed in the answer: a surrogate in it is shown escaped.
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def check_body(data: Any) -> Any:
    """`data` (a parsed body) unchanged, or a ValidationError naming the first value no field
    can hold: a string or key with a NUL byte or a lone surrogate, an integer beyond
    +-(2**63-1), NaN or infinity."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise field_error(_printable_path(path), "must not contain NUL bytes")
            at = _surrogate_at(value)
            if at >= 0:
                raise field_error(
                    _printable_path(path), f"must be valid Unicode text: a lone surrogate at character {at}"
                )
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -MAX_INT <= value <= MAX_INT:
                raise field_error(path, f"{shown(value)} is out of range (at most {MAX_INT} in magnitude)")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise field_error(path, f"must be a finite number, got {value}")
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and "\x00" in key:
                    raise field_error(path, f"key {shown(key)} must not contain NUL bytes")
                if isinstance(key, str) and _surrogate_at(key) >= 0:
                    raise field_error(
                        path, f"key {_printable_path(key)!r} must be valid Unicode text: a lone surrogate"
                    )
                stack.append((f"{path}.{key}" if path else str(key), item))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return data


def object_body(request: Request) -> dict:
    """The request body as a JSON or YAML object; a 400 for form bodies and non-objects."""
    data = request.data
    if isinstance(data, QueryDict):
        raise field_error("", "send a JSON or YAML body (application/json or application/yaml)")
    if not isinstance(data, dict):
        raise field_error("", f"the body must be an object (a mapping), got {type(data).__name__}")
    return data


def int_param(text: str | None, *, field: str, low: int, high: int, default: int | None = None) -> int | None:
    """A query parameter as an integer in [low, high] (ASCII digits only); `default` when absent."""
    if text is None or text == "":
        return default
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_ID_DIGITS:
        raise field_error(field, f"must be an integer from {low} to {high}, got {shown(text)}")
    value = int(text)
    if not low <= value <= high:
        raise field_error(field, f"must be an integer from {low} to {high}, got {value}")
    return value


def id_or_name(text: str, *, field: str) -> tuple[int | None, str]:
    """A "name or id" parameter: `(id, "")` for ASCII digits, `(None, name)` otherwise."""
    if text.isascii() and text.isdigit():
        return int_param(text, field=field, low=0, high=MAX_INT), ""
    if text.isdigit():
        # Digits of other scripts ("²") name neither a row id nor a plausible name.
        raise field_error(field, f"an id is written in ASCII digits, got {shown(text)}")
    return None, text
