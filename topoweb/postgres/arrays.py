"""Postgres array literals written in one pass, for statements that send a column of values as
one array parameter (`INSERT ... SELECT FROM unnest(%s::bigint[], ...)`).

Handing psycopg a Python list makes it dump, quote and join every element in Python (client-side
binding: each element through its dumper), which was a tenth of a scheduling cycle's CPU for the
arrays of its placed jobs and their allocations. `array_literal` writes the same text with
str.join: each element as Postgres reads it for the array's element type (the caller's cast),
strings and JSON double-quoted with their backslashes and double quotes escaped (the array input
syntax's only escapes inside quotes), None as NULL. The literal then travels as one string
parameter, quoted once by the driver, so a value can never leave its element."""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import Field
from psycopg.types.json import Jsonb


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, Decimal):
        return _quoted(str(value))
    if isinstance(value, numbers.Real):
        # The shortest text that reads back as the same double; "inf" and "nan" read as well.
        return _quoted(float.__repr__(float(value)))
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, (datetime, date)):
        return _quoted(value.isoformat())
    if isinstance(value, Jsonb):
        return _quoted((value.dumps or json.dumps)(value.obj))
    raise TypeError(f"no array literal for a {type(value).__name__}")


def array_literal(values: Iterable[Any]) -> str:
    """The Postgres array literal of `values` (integers, bools, reals, Decimal, str, date,
    datetime, psycopg's Jsonb, None), to be cast to the element type's array in the SQL;
    TypeError for any other type."""
    return "{" + ",".join(map(_element, values)) + "}"


_LENGTH = re.compile(r"\(\d+\)$")


def unnest_sql(fields: Sequence[Field]) -> str:
    """`unnest(%s::type[], ...)`, one array a field, for parameters that are each the
    `array_literal` of a column of values (as the field's column takes them). A field's array is
    of its column's type without a length (`varchar(16)` -> `varchar`): the cast would cut a
    longer value short, where the column refuses it."""
    arrays = ", ".join(f"%s::{_LENGTH.sub('', f.db_type(connection))}[]" for f in fields)
    return f"unnest({arrays})"
