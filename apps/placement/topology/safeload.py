"""The one safe way spec text enters TopoWeb: bounded YAML/JSON loading.

`parse_spec_text(text, limits=...)` parses YAML or JSON (YAML 1.2 floats: `1.2e9` is a number) and
refuses, with a SpecError naming the limit, before building anything large:
- input over `max_bytes` (checked on the raw text, before parsing), or not UTF-8;
- nesting deeper than `max_depth` (JSON and YAML alike; never a RecursionError);
- more than `max_aliases` YAML aliases, an alias to the node that contains it (a cycle), or more
  than `max_nodes` values once every alias is expanded (the billion-laughs bomb is a few aliases
  that expand exponentially; what readers of the parsed data walk is the expanded tree);
- a non-integer number literal longer than `max_number_chars`, and integers past Python's own
  4,300 digits (shorter integers, such as a 400-digit count, reach the field checks, which name
  the field and cut the echoed value);
- NaN and Infinity (`.nan`, `.inf`, `NaN`, `Infinity`).
`read_spec_file(path, limits=...)` checks the file's size before reading it.
`cut(value)` and `shorten(text)` shorten what an error message echoes.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .model import SpecError

ECHO_CHARS = 80


@dataclass(frozen=True, slots=True)
class SpecLimits:
    """Bounds on one spec text: bytes, nesting depth, YAML aliases, values after alias expansion,
    characters of one non-integer number literal."""

    max_bytes: int = 32 * 1024 * 1024
    max_depth: int = 32
    max_aliases: int = 64
    max_nodes: int = 2_000_000
    max_number_chars: int = 40


# Topology files and imports: a full-form 16,384-GPU cluster is 1.8 MB of JSON, so the largest
# supported (131,072 GPUs) is about 14 MB; YAML with indentation is larger.
TOPOLOGY_LIMITS = SpecLimits()
# Job specs (REST bodies, preview, CLI files): a few kB; 64 comm entries at most.
JOB_LIMITS = SpecLimits(max_bytes=64 * 1024, max_nodes=10_000)


def cut(value: Any, limit: int = ECHO_CHARS) -> str:
    """`repr(value)` cut to `limit` characters (with its full length), for error messages."""
    if isinstance(value, (dict, list, tuple, set)) and len(value) > limit:
        return f"a {type(value).__name__} of {len(value)} entries"
    return shorten(repr(value), limit)


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def _limit_error(message: str) -> SpecError:
    return SpecError([("", message)])


def parse_spec_text(
    text: str | bytes, limits: SpecLimits = TOPOLOGY_LIMITS, *, json_only: bool = False
) -> Any:
    """Parse YAML or JSON text (JSON only with `json_only`) within `limits`; any problem is a
    SpecError (never another error)."""
    if isinstance(text, bytes) or len(text) > limits.max_bytes:
        size = len(text)  # a str longer than the limit in characters is longer in bytes too
    else:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise _limit_error(f"the spec is {size} bytes; the limit is {limits.max_bytes} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _limit_error(f"not UTF-8 text: byte {exc.start} cannot be decoded") from None
    if "\x00" in text:
        raise _limit_error("the spec contains a NUL character")
    if json_only:
        try:
            return _load_json(text, limits)
        except json.JSONDecodeError as exc:
            raise SpecError([("", f"not valid JSON: {exc}")]) from None
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        # JSON is also YAML; the JSON parser is much faster on large topology files.
        try:
            data = _load_json(text, limits)
        except json.JSONDecodeError:
            data = _load_yaml(text, limits)  # YAML flow style such as `{a: 1}`
    else:
        data = _load_yaml(text, limits)
    return data


def _reject_constant(name: str) -> Any:
    raise SpecError([("", f"{name} is not a number a spec may hold")])


def _json_float(limits: SpecLimits):
    def parse(literal: str) -> float:
        if len(literal) > limits.max_number_chars:
            raise _number_error(len(literal), limits)
        value = float(literal)
        if not math.isfinite(value):
            raise SpecError([("", f"{literal} is not a number a spec may hold")])
        return value

    return parse


def _load_json(text: str, limits: SpecLimits) -> Any:
    # Containers cost far more memory than their bytes (`[[],[],...]`): count them before parsing
    # (brackets inside strings count too, which only errs on the safe side).
    containers = text.count("{") + text.count("[")
    if containers > limits.max_nodes // 4:
        raise _limit_error(
            f"the spec holds {containers} lists and mappings; the limit is {limits.max_nodes // 4}"
        )
    try:
        data = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_json_float(limits),
        )
    except RecursionError:
        # The C decoder counts its depth against the interpreter's recursion limit and stops
        # cleanly there; anything that deep is far past max_depth.
        raise _limit_error(f"nesting is deeper than {limits.max_depth} levels") from None
    except ValueError as exc:
        if isinstance(exc, (SpecError, json.JSONDecodeError)):
            raise
        # int() past Python's digit limit (4,300 digits).
        raise _limit_error(f"not valid JSON: {shorten(str(exc), 200)}") from None
    _check_shape(data, limits)
    return data


def _check_shape(data: Any, limits: SpecLimits) -> None:
    """Depth and value count of parsed JSON, walked iteratively over its containers only."""
    count, level, depth = 1, [data], 0
    while level:
        depth += 1
        if depth > limits.max_depth:
            raise _limit_error(f"nesting is deeper than {limits.max_depth} levels")
        below = []
        for item in level:
            if item.__class__ is dict:
                item = item.values()
            elif item.__class__ is not list:
                continue
            count += len(item)
            below += [c for c in item if c.__class__ is dict or c.__class__ is list]
        if count > limits.max_nodes:
            raise _limit_error(f"the spec holds more than {limits.max_nodes} values")
        level = below


_FLOAT_RE = (
    r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)"
    r"|\.(?:nan|NaN|NAN))$"
)


@lru_cache(maxsize=1)
def _spec_yaml_loader():
    """A SafeLoader that reads `1.2e9` as a float (YAML 1.2 / JSON) and counts what it composes."""
    import yaml
    from yaml.events import AliasEvent

    class SpecLoader(yaml.SafeLoader):
        limits = TOPOLOGY_LIMITS

        def compose_document(self):
            self._depth = 0
            self._aliases = 0
            self._values = 0
            self._sizes: dict[str, int] = {}
            self._open: set[str] = set()
            return super().compose_document()

        def compose_node(self, parent, index):
            lim = self.limits
            if self.check_event(AliasEvent):
                anchor = self.peek_event().anchor
                self._aliases += 1
                if self._aliases > lim.max_aliases:
                    raise _limit_error(f"more than {lim.max_aliases} YAML aliases")
                if anchor in self._open:
                    raise _limit_error(f"YAML alias *{cut(anchor, 40)} refers to a node that contains it")
                self._count(self._sizes.get(anchor, 1))
                return super().compose_node(parent, index)
            self._depth += 1
            if self._depth > lim.max_depth:
                raise _limit_error(f"nesting is deeper than {lim.max_depth} levels")
            anchor = getattr(self.peek_event(), "anchor", None)
            before = self._values
            self._count(1)
            if anchor is not None:
                self._open.add(anchor)
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
                if anchor is not None:
                    self._open.discard(anchor)
                    self._sizes[anchor] = self._values - before

        def _count(self, n: int) -> None:
            self._values += n
            if self._values > self.limits.max_nodes:
                raise _limit_error(
                    f"the spec holds more than {self.limits.max_nodes} values once its YAML aliases are expanded"
                )

        def construct_yaml_float(self, node):
            if len(node.value) > self.limits.max_number_chars:
                raise _number_error(len(node.value), self.limits)
            value = super().construct_yaml_float(node)
            if value != value or value in (float("inf"), float("-inf")):
                raise SpecError([("", f"{node.value} is not a number a spec may hold")])
            return value

    SpecLoader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT_RE), list("-+0123456789."))
    SpecLoader.add_constructor("tag:yaml.org,2002:float", SpecLoader.construct_yaml_float)
    return SpecLoader


def _number_error(chars: int, limits: SpecLimits) -> SpecError:
    return SpecError(
        [("", f"a non-integer number of {chars} characters; at most {limits.max_number_chars} are read")]
    )


def _load_yaml(text: str, limits: SpecLimits) -> Any:
    import yaml

    loader = None
    try:
        # The reader checks the characters as soon as the loader is made.
        loader = _spec_yaml_loader()(text)
        loader.limits = limits
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise SpecError([("", f"not valid YAML or JSON: {shorten(str(exc), 300)}")]) from None
    except (ValueError, TypeError, OverflowError) as exc:
        if isinstance(exc, SpecError):
            raise
        # Values the YAML constructors cannot build (a date such as 2024-02-30, an odd tag).
        raise SpecError([("", f"not valid YAML or JSON: {shorten(str(exc), 200)}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_spec_file(path: str, limits: SpecLimits = TOPOLOGY_LIMITS) -> Any:
    """Read and parse a YAML or JSON spec file within `limits` (its size is checked first).

    OSError when the file cannot be read; SpecError on a bad or oversized file.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limits.max_bytes:
            raise _limit_error(f"the file is {size} bytes; the limit is {limits.max_bytes} bytes")
        # A file that grew since fstat is cut at the limit and refused by the size check below.
        raw = fh.read(limits.max_bytes + 1)
    return parse_spec_text(raw, limits)
