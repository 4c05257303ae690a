"""Request body parsers shared by the TopoWeb APIs: YAML job and topology specs."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from apps.placement.topology import SpecError, parse_spec_text


class YAMLParser(BaseParser):
    """A YAML (or JSON) body, read with the spec loader (so `1.2e9` is a number)."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"YAML body is not valid {encoding}: {exc}") from exc
        try:
            return parse_spec_text(text)
        except SpecError as exc:
            raise ParseError(str(exc)) from exc


class TextYAMLParser(YAMLParser):
    """The same parser for `text/yaml` bodies."""

    media_type = "text/yaml"
