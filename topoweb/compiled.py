"""SELECTs whose SQL is compiled once per shape and process.

Django compiles a queryset's SQL each time it is evaluated. For a wide row with joined names that
is most of a read's CPU: a job's detail (every column of the job, the names of its cluster, owner,
account and QOS) spends about 1.5 ms compiling against 0.2 ms sending the query and reading the
row. `compiled_once(queryset)` gives the same queryset whose SELECTs reuse the SQL (and the
compiler's column map, which builds the model instances and the related rows) that an earlier
evaluation of the same shape compiled in this process; only the WHERE clause is compiled each
time, for its parameters.

The shape is the query's structure that the SQL text depends on besides the WHERE: the model,
the joins, the columns (`only`, `values_list`, `select_related`), the ordering and the slice. The
WHERE's own SQL text is part of the key, so a filter of another form (another field, a list of
another length, a join) is another shape. A query with anything else that writes SQL (annotations
but a page's COUNT(*), `extra`, a GROUP BY, DISTINCT ON, a combinator, FOR UPDATE, filtered
relations, EXPLAIN) or whose parameters are not all the WHERE's is compiled as Django does, every
time. Under tests every reused statement is compared with a fresh compilation, so a shape the key
missed fails there.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db.models import Count, QuerySet
from django.db.models.expressions import Star
from django.db.models.sql import Query

STATEMENTS_KEPT = 512

_statements: dict[tuple, tuple[str, tuple]] = {}
_lock = threading.Lock()
_compilers: dict[type, type] = {}


def compiled_once(queryset: QuerySet) -> QuerySet:
    """`queryset`, its SELECTs compiled once per shape and process (see the module)."""
    clone = queryset.all()
    clone.query = clone.query.chain(klass=CompiledOnceQuery)
    return clone


def forget() -> None:
    """Drop every statement kept (for tests that count them)."""
    with _lock:
        _statements.clear()


def _freeze(value: Any) -> Any:
    """A hashable copy of `select_related` (True, False or a nested dict)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _shape(query: Query) -> tuple | None:
    """What the SQL of `query` depends on besides its WHERE clause; None when it has parts this
    module does not key on (compiled every time then)."""
    counts = _counts(query)
    if (
        counts is None
        or query.extra
        or query.extra_tables
        or query.combinator
        or query.group_by is not None
        or query.distinct_fields
        or query.select_for_update
        or query.subquery
        or query._filtered_relations
        or query.explain_info
    ):
        return None
    deferred, defer = query.deferred_loading
    return (
        query.model,
        counts,
        tuple((alias, join.identity) for alias, join in query.alias_map.items()),
        tuple(query.alias_refcount.items()),
        tuple(str(col) for col in query.select),
        query.values_select,
        tuple((name, str(expr)) for name, expr in (query.selected or {}).items()),
        frozenset(deferred),
        defer,
        _freeze(query.select_related),
        query.default_cols,
        tuple(str(o) for o in query.order_by),
        query.extra_order_by,
        query.default_ordering,
        query.standard_ordering,
        query.low_mark,
        query.high_mark,
        query.distinct,
    )


def _counts(query: Query) -> tuple | None:
    """The query's annotations when each is a COUNT(*) (a page count's), else None (() for none)."""
    kept = []
    for name, expr in query.annotations.items():
        if type(expr) is not Count or expr.distinct or expr.filter is not None:
            return None
        if [type(src) for src in expr.get_source_expressions() if src is not None] != [Star]:
            return None
        kept.append(name)
    mask = query.annotation_select_mask
    return (tuple(kept), None if mask is None else tuple(sorted(mask)))


class CompiledOnceQuery(Query):
    """A Query whose SELECT compiler reuses the statements `_CompiledOnce` keeps."""

    def get_compiler(self, using=None, connection=None, elide_empty=True):
        compiler = super().get_compiler(using, connection, elide_empty)
        base = type(compiler)
        cls = _compilers.get(base)
        if cls is None:
            cls = _compilers[base] = type(f"CompiledOnce{base.__name__}", (_CompiledOnce, base), {})
        compiler.__class__ = cls
        return compiler


class _CompiledOnce:
    """Mixed into the backend's SQLCompiler (see `CompiledOnceQuery`)."""

    def as_sql(self, with_limits=True, with_col_aliases=False):
        query = self.query
        shape = _shape(query) if with_limits and not with_col_aliases else None
        if shape is None or query.where.contains_aggregate or query.where.contains_over_clause:
            return super().as_sql(with_limits, with_col_aliases)
        try:
            where, params = self.compile(query.where)
        except FullResultSet:
            where, params = "", []
        except EmptyResultSet:
            return super().as_sql(with_limits, with_col_aliases)
        key = (self.connection.alias, shape, where, self.elide_empty)
        kept = _statements.get(key)
        if kept is not None:
            sql, state = kept
            self.select, self.klass_info, self.annotation_col_map, self.col_count, self.has_extra_select = (
                state
            )
            if settings.TESTING:
                self._check_reused(sql, params)
            return sql, params
        sql, all_params = super().as_sql(with_limits, with_col_aliases)
        if list(all_params) == list(params):
            state = (
                self.select,
                self.klass_info,
                self.annotation_col_map,
                self.col_count,
                self.has_extra_select,
            )
            with _lock:
                if len(_statements) >= STATEMENTS_KEPT:
                    _statements.clear()
                _statements[key] = (sql, state)
        return sql, all_params

    def _check_reused(self, sql: str, params) -> None:
        """Under tests: the reused statement is what Django compiles now for this query."""
        fresh = self.query.clone().get_compiler(self.using, self.connection, self.elide_empty)
        expected = super(_CompiledOnce, fresh).as_sql()
        if (sql, list(params)) != (expected[0], list(expected[1])):
            raise AssertionError(
                f"compiled_once reused {sql!r} {params!r} where Django compiles {expected!r}"
            )
