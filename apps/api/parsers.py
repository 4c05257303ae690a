"""Request body parsers shared by the TopoWeb APIs: JSON and YAML bodies, each checked by the
validation layer (no NUL bytes, no integers wider than a column, no NaN or infinity)."""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from apps.placement.topology import parse_spec_text

from .validation import check_body


class JSONParser(parsers.JSONParser):
    """A JSON body, checked by `check_body`."""

    def parse(self, stream, media_type=None, parser_context=None):
        return check_body(super().parse(stream, media_type, parser_context))


class YAMLParser(parsers.BaseParser):
    """A YAML (or JSON) body, read with the spec loader (so `1.2e9` is a number)."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"YAML body is not valid {encoding}: {exc}") from exc
        try:
            data = parse_spec_text(text)
        except ValueError as exc:
            # SpecError, and integers past Python's digit limit.
            raise ParseError(str(exc)[:500]) from exc
        return check_body(data)


class TextYAMLParser(YAMLParser):
    """The same parser for `text/yaml` bodies."""

    media_type = "text/yaml"


SPEC_PARSERS = [JSONParser, YAMLParser, TextYAMLParser]
