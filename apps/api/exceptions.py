"""The API's one exception handler: every error a request can cause is a 4xx whose body names
the field, never a 500."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from rest_framework import exceptions
from rest_framework.views import exception_handler as drf_exception_handler

from apps.placement.topology import SpecError


def as_api_exception(exc: Exception) -> Exception:
    """The DRF exception a service or model error stands for; other exceptions unchanged."""
    if isinstance(exc, SpecError):
        return exceptions.ValidationError(exc.as_dict())
    if isinstance(exc, DjangoValidationError):
        # A model's full_clean() inside a service: its fields are the request's fields.
        if hasattr(exc, "error_dict"):
            return exceptions.ValidationError(exc.message_dict)
        return exceptions.ValidationError({"detail": exc.messages})
    if isinstance(exc, DataError):
        # A value the database column cannot hold that no earlier check caught.
        return exceptions.ValidationError({"detail": ["a value is out of range for its field"]})
    return exc


def exception_handler(exc: Exception, context: dict):
    """DRF's handler after mapping spec, model and database value errors to a 400."""
    return drf_exception_handler(as_api_exception(exc), context)
