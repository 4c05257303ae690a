"""Request body parsers shared by the TopoWeb APIs: JSON and YAML job and topology specs.

Every body goes through the core's bounded loader (`parse_spec_text`) with the view's `spec_limits`
(size, nesting, YAML aliases, number length; TOPOLOGY_LIMITS when a view sets none), then through
the validation layer (no NUL bytes, no integers wider than a column, no NaN or infinity).
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from apps.placement.topology import TOPOLOGY_LIMITS, SpecError, parse_spec_text

from .validation import check_body


def parse_spec_body(stream, parser_context, *, json_only: bool = False, clean=None):
    """The body parsed within the view's `spec_limits`; ParseError (400) naming the problem.
    `clean(data)`, when given, may rewrite the parsed body before the validation layer sees it."""
    limits = getattr((parser_context or {}).get("view"), "spec_limits", TOPOLOGY_LIMITS)
    # One byte past the limit is enough to know the body is too large.
    raw = stream.read(limits.max_bytes + 1) if stream is not None else b""
    try:
        data = parse_spec_text(raw, limits, json_only=json_only)
    except SpecError as exc:
        raise ParseError(str(exc)) from None
    if clean is not None:
        data = clean(data)
    return check_body(data)


class JSONParser(BaseParser):
    """A JSON body, read by the bounded spec loader (NaN, Infinity, deep nesting refused)."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_spec_body(stream, parser_context, json_only=True)


class YAMLParser(BaseParser):
    """A YAML (or JSON) body, read by the bounded spec loader (so `1.2e9` is a number)."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_spec_body(stream, parser_context)


class TextYAMLParser(YAMLParser):
    """The same parser for `text/yaml` bodies."""

    media_type = "text/yaml"


SPEC_PARSERS = [JSONParser, YAMLParser, TextYAMLParser]
