"""Slurm hostlist expressions: `tux[0-3,12]`, zero padding (`n[001-016]`), several bracket groups
(`rack[1-2]-n[01-04]`) and comma-separated lists of such expressions.

`expand("tux[0-2],db1") == ["tux0", "tux1", "tux2", "db1"]`; `compress(names)` gives back the
shortest form this module writes (one bracket group per expression, on the last number of each
name), which `expand` turns into the same names in the same order when they are unique.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A hostlist may name at most this many hosts: a hostile `n[0-999999999]` must not exhaust memory.
MAX_HOSTS = 100_000

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TAIL_NUMBER = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """A malformed hostlist expression; the message names the offending part."""


def _split_top(expr: str) -> list[str]:
    """Split at commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {expr!r}")
    parts.append(expr[start:])
    return parts


def _ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise HostlistError(f"bad range {item!r} in {expr!r}")
        lo_s, hi_s = m.group(1), m.group(2)
        if hi_s is None:
            out.append(lo_s)
            continue
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"range {item!r} runs backwards in {expr!r}")
        if hi - lo + 1 > MAX_HOSTS:
            raise HostlistError(f"range {item!r} names more than {MAX_HOSTS} hosts")
        # Zero padding follows the width of the lower bound, as Slurm does.
        width = len(lo_s) if lo_s.startswith("0") or len(lo_s) == len(hi_s) else 0
        out.extend(f"{v:0{width}d}" for v in range(lo, hi + 1))
    return out


def _expand_one(expr: str, total: int) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", expr)
    names = [""]
    for piece in pieces:
        if piece.startswith("["):
            choices = _ranges(piece[1:-1], expr)
            if len(names) * len(choices) + total > MAX_HOSTS:
                raise HostlistError(f"{expr!r} names more than {MAX_HOSTS} hosts")
            names = [n + c for n in names for c in choices]
        elif piece:
            names = [n + piece for n in names]
    return names


def expand(expr: str) -> list[str]:
    """The host names of a hostlist expression, in order; HostlistError if it is malformed."""
    if not isinstance(expr, str):
        raise HostlistError(f"a hostlist must be text, got {type(expr).__name__}")
    names: list[str] = []
    for part in _split_top(expr.strip()):
        part = part.strip()
        if not part:
            if expr.strip():
                raise HostlistError(f"empty name in {expr!r}")
            continue
        if any(c.isspace() for c in part):
            raise HostlistError(f"whitespace inside {part!r}")
        names.extend(_expand_one(part, len(names)))
    return names


def _fmt_range(lo: int, hi: int, width: int) -> str:
    a = f"{lo:0{width}d}"
    return a if lo == hi else f"{a}-{hi:0{width}d}"


def compress(names: Iterable[str]) -> str:
    """A hostlist expression for `names` (order kept): runs of consecutive numbers that share a
    prefix and a digit width become one bracket group."""
    groups: list[tuple[str, int, list[int]] | str] = []
    for name in names:
        m = _TAIL_NUMBER.match(name)
        if not m or "[" in name or "]" in name or "," in name:
            groups.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        # Unpadded numbers have no fixed width; padded ones keep theirs.
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        value = int(digits)
        last = groups[-1] if groups else None
        if isinstance(last, tuple) and last[0] == prefix and _same_width(last[1], width, digits):
            if last[2][-1] < value:
                last[2].append(value)
                continue
        groups.append((prefix, width if width else 0, [value]))
    out: list[str] = []
    for g in groups:
        if isinstance(g, str):
            out.append(g)
            continue
        prefix, width, values = g
        if len(values) == 1:
            out.append(f"{prefix}{values[0]:0{width}d}")
            continue
        runs: list[str] = []
        lo = prev = values[0]
        for v in values[1:] + [None]:
            if v is not None and v == prev + 1:
                prev = v
                continue
            runs.append(_fmt_range(lo, prev, width))
            if v is not None:
                lo = prev = v
        out.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(out)


def _same_width(group_width: int, width: int, digits: str) -> bool:
    # Padded groups take only names of the same width; unpadded ones only unpadded names.
    if group_width:
        return width == group_width or (len(digits) == group_width and not digits.startswith("0"))
    return width == 0
