"""`array_literal`'s text read back by Postgres as the array psycopg itself would send for the
same values, element type by element type (hostile strings included)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from topoweb.postgres.arrays import array_literal

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres"), pytest.mark.django_db]

AT = datetime(2026, 12, 6, 21, 0, 1, 250, tzinfo=UTC)
CASES = [
    ("bigint", [1, -(2**63), 2**63 - 1, None]),
    ("integer", [0, 7, None]),
    ("smallint", [3, None]),
    ("boolean", [True, False, None]),
    ("double precision", [0.1, 1e300, -2.5e-300, float("inf"), None]),
    ("varchar", ["plain", 'a"b', "c\\d", "e,f", "{g}", "NULL", "", " h ", "ü ✓", None]),
    ("text", ["x" * 5000, "line\nbreak\ttab", None]),
    ("timestamp with time zone", [AT, AT + timedelta(days=400), None]),
    ("jsonb", [Jsonb({"k": 'it\'s "x" \\ {}'}), Jsonb({}), Jsonb([1, 2.5, None]), None]),
]


def same_as_psycopg(sql_type: str, values: list) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT %s::{sql_type}[] IS NOT DISTINCT FROM %s::{sql_type}[]", [array_literal(values), values]
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize(("sql_type", "values"), CASES, ids=[c[0] for c in CASES])
def test_each_element_type_reads_back_as_psycopgs_own_array(sql_type, values):
    assert same_as_psycopg(sql_type, values)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.none() | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
        max_size=8,
    )
)
def test_any_strings_read_back_unchanged(values):
    assert same_as_psycopg("text", values)
