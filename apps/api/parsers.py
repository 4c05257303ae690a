"""Request body parsers shared by the TopoWeb APIs: JSON and YAML job and topology specs.

Every body goes through the core's bounded loader (`parse_spec_text`) with the view's `spec_limits`
(size, nesting, YAML aliases, number length; TOPOLOGY_LIMITS when a view sets none), then through
the validation layer (no NUL bytes, no integers wider than a column, no NaN or infinity).
"""

from __future__ import annotations

from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser

from apps.placement.topology import JOB_LIMITS, TOPOLOGY_LIMITS, SpecError, SpecLimits, parse_spec_text

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


class BodyTooLarge(APIException):
    """413: the body is over the limit of what it carries (one job spec, or a bulk of them)."""

    status_code = 413
    default_code = "too_large"

    def __init__(self, limit: int):
        super().__init__()
        # Set after the base class, which would turn the number into a string.
        self.detail = {"detail": f"the request body is over the limit of {limit} bytes", "limit_bytes": limit}


# A bulk submission: a list of job specs, each within JOB_LIMITS once parsed.
BULK_JOB_LIMITS = SpecLimits(max_bytes=4 * 1024 * 1024, max_nodes=500 * JOB_LIMITS.max_nodes)


def parse_job_body(stream, parser_context, *, json_only: bool = False):
    """One job spec within JOB_LIMITS, or a list of them (a bulk submission: a body starting with
    `[` or `-`) within BULK_JOB_LIMITS; ParseError (400) naming the problem."""
    raw = stream.read(BULK_JOB_LIMITS.max_bytes + 1) if stream is not None else b""
    head = raw.lstrip()[:1]
    limits = BULK_JOB_LIMITS if head in (b"[", b"-") else JOB_LIMITS
    if len(raw) > limits.max_bytes:
        raise BodyTooLarge(limits.max_bytes)
    try:
        data = parse_spec_text(raw, limits, json_only=json_only)
    except SpecError as exc:
        raise ParseError(str(exc)) from None
    return check_body(data)


class JobJSONParser(JSONParser):
    """A JSON job spec, or a JSON list of them."""

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_job_body(stream, parser_context, json_only=True)


class JobYAMLParser(YAMLParser):
    """A YAML job spec, or a YAML list of them."""

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_job_body(stream, parser_context)


class JobTextYAMLParser(JobYAMLParser):
    media_type = "text/yaml"


JOB_PARSERS = [JobJSONParser, JobYAMLParser, JobTextYAMLParser]
