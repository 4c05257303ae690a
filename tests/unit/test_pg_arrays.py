"""Array literals written by `topoweb.postgres.arrays.array_literal` (no database: the text;
tests/integration/test_pg_arrays_postgres.py reads them back through Postgres)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal

import numpy as np
import pytest
from psycopg.types.json import Jsonb

from topoweb.postgres.arrays import array_literal


def test_numbers_bools_and_nulls_are_written_bare_or_quoted_as_postgres_reads_them():
    assert array_literal([1, -2, np.int64(3), None]) == "{1,-2,3,NULL}"
    assert array_literal([True, False, None]) == "{t,f,NULL}"
    assert array_literal([0.1, float("inf"), np.float64(2.5)]) == '{"0.1","inf","2.5"}'
    assert array_literal([Decimal("1.50")]) == '{"1.50"}'
    assert array_literal([]) == "{}"


def test_strings_keep_quotes_backslashes_commas_and_braces_inside_their_element():
    values = ['a"b', "c\\d", "e,f", "{g}", "NULL", "", " h "]
    literal = array_literal(values)
    assert literal == '{"a\\"b","c\\\\d","e,f","{g}","NULL",""," h "}'


def test_dates_and_json_are_quoted_text():
    at = datetime(2026, 12, 6, 21, 0, 1, 250, tzinfo=UTC)
    assert array_literal([at, date(2026, 1, 2)]) == '{"2026-12-06T21:00:01.000250+00:00","2026-01-02"}'
    assert array_literal([Jsonb({"k": 'it\'s "x"'})]) == '{"{\\"k\\": \\"it\'s \\\\\\"x\\\\\\"\\"}"}'
    compact = Jsonb([1, 2], dumps=lambda obj: json.dumps(obj, separators=(",", ":")))
    assert array_literal([compact]) == '{"[1,2]"}'


def test_other_types_are_refused_by_name():
    with pytest.raises(TypeError, match="bytes"):
        array_literal([b"raw"])
