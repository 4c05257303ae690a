"""OpenAPI pieces every endpoint shares: the error body shapes, a postprocessing hook that
documents the error responses DRF and the exception handler give on every operation and one that
attaches the example bodies of `apps.api.examples` (the one explaining each status of the
scheduling API's enums: apps.scheduling.api.schemas.status_descriptions)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse

from .examples import EXAMPLES

MESSAGES = {"type": "array", "items": {"type": "string"}}
# `{"detail": "..."}`: authentication, permission, not found, throttling, unparseable bodies.
ERROR_DETAIL = {
    "type": "object",
    "properties": {"detail": {"oneOf": [{"type": "string"}, MESSAGES]}},
    "required": ["detail"],
}
# `{"<field path>": ["message", ...], ...}`: each bad field (`comm[1].collective`) and its
# messages; `detail` or `non_field_errors` for errors of the body as a whole.
FIELD_ERRORS = {
    "type": "object",
    "additionalProperties": {"oneOf": [MESSAGES, {"type": "string"}]},
    "example": {"parallelism": ["tp*pp*dp=12 but gpus=16"], "comm[0].collective": ["unknown 'x'"]},
}
# `{"detail": "...", "status": "<current status>"}`: a state that forbids the action.
STATE_ERROR = {
    "type": "object",
    "properties": {"detail": {"type": "string"}, "status": {"type": "string"}},
    "required": ["detail", "status"],
}

COMPONENTS = {"ErrorDetail": ERROR_DETAIL, "FieldErrors": FIELD_ERRORS, "StateError": STATE_ERROR}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


FIELD_ERRORS_RESPONSE = OpenApiResponse(
    response=FIELD_ERRORS, description="Each bad field (by its path in the body) and its messages."
)
STATE_ERROR_RESPONSE = OpenApiResponse(
    response=STATE_ERROR, description="The object's status does not allow this action."
)

# Responses any operation may give, with the body each has.
COMMON = {
    "400": ("FieldErrors", "A bad parameter or body: each bad field and its messages."),
    "401": ("ErrorDetail", "Not signed in, or an unknown token."),
    "403": ("ErrorDetail", "Signed in, but the role or token does not allow this."),
    "429": ("ErrorDetail", "Throttled: too many requests or failed authentications; see Retry-After."),
    "503": (
        "ErrorDetail",
        "Unavailable for now: the database cannot be reached, or (a write) every write slot of the web"
        " process stayed busy while it waited; see Retry-After.",
    ),
}


def error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: the shared error components, and 400/401/403/404/429/503
    (and 415 where the operation reads a body) on every operation that does not document them
    itself."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in COMPONENTS.items():
        schemas.setdefault(name, schema)
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            responses = operation.setdefault("responses", {})
            common = dict(COMMON)
            common["404"] = ("ErrorDetail", "No such object, or not one you may see; or no such page.")
            if "requestBody" in operation:
                common["415"] = (
                    "ErrorDetail",
                    "Unsupported media type: the body's Content-Type (or a multipart body without its"
                    " boundary) is none this operation reads.",
                )
            # An error comes in the format the request asked for (?format=yaml gives a YAML body,
            # a text format the same object as JSON text).
            media = {"application/json"} | {m for r in responses.values() for m in r.get("content", {})}
            for code, (name, description) in common.items():
                content = {m: {"schema": ref(name)} for m in sorted(media)}
                responses.setdefault(code, {"description": description, "content": content})
    return result


WRITE_METHODS = ("post", "put", "patch", "delete")


def _examples(named: dict) -> dict:
    return {key: {"summary": summary, "value": value} for key, (summary, value) in named.items()}


def examples_attach(result, generator, request, public):
    """drf-spectacular postprocessing hook: each write operation's example bodies, by operation
    id, on its request body's media types (or on its success response when it takes no body)."""
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            found = EXAMPLES.get(operation.get("operationId", "")) if method in WRITE_METHODS else None
            if not found:
                continue
            content = operation.get("requestBody", {}).get("content", {})
            for media, named in found.get("request", {}).items():
                if media in content:
                    content[media]["examples"] = _examples(named)
            if "response" in found:
                code, named = found["response"]
                for body in operation.get("responses", {}).get(code, {}).get("content", {}).values():
                    body["examples"] = _examples(named)
    return result
