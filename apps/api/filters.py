"""Filter plumbing of every list endpoint: a FilterSet whose integer filters are bounded to what
a column holds, and the "name or id" filter the apps share."""

from __future__ import annotations

import django_filters
from django import forms
from django.db import models

from .validation import MAX_INT, id_or_name


class IntegerFilter(django_filters.NumberFilter):
    """An integer filter bounded to +-(2**63-1): a wider value is a 400 naming the parameter, not
    an OverflowError on SQLite (a NumberFilter would accept `1e30` as a decimal)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", -MAX_INT)
        kwargs.setdefault("max_value", MAX_INT)
        super().__init__(*args, **kwargs)


class IdOrNameFilter(django_filters.CharFilter):
    """`?<param>=<name or id>` on a foreign key (`path` is the FK's lookup path): ASCII digits
    match the id, anything else `name_field`; non-ASCII digits ("²") are a 400."""

    def __init__(self, *args, path: str, name_field: str = "name", **kwargs):
        self.path = path
        self.name_field = name_field
        kwargs.setdefault("label", f"{path.rsplit('__', 1)[-1]} (name or id)")
        kwargs.setdefault("max_length", 200)
        super().__init__(*args, **kwargs)

    def filter(self, qs, value):
        if value in (None, ""):
            return qs
        pk, name = id_or_name(value, field=self.field_name)
        return qs.filter(
            **({f"{self.path}_id": pk} if pk is not None else {f"{self.path}__{self.name_field}": name})
        )


class FilterSet(django_filters.FilterSet):
    """A FilterSet whose generated integer filters are IntegerFilters."""

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        **{
            field: {"filter_class": IntegerFilter}
            for field in (
                models.AutoField,
                models.BigAutoField,
                models.IntegerField,
                models.BigIntegerField,
                models.SmallIntegerField,
                models.PositiveIntegerField,
                models.PositiveSmallIntegerField,
                models.PositiveBigIntegerField,
            )
        },
    }
