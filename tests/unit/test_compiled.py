"""Querysets whose SELECTs are compiled once per shape and process (`topoweb.compiled`): the same
rows as the ORM's own compilation, the statement kept for the next query of the same shape, and
every other shape compiled afresh."""

from __future__ import annotations

import pytest
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Value
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext

from apps.topology.models import Node
from apps.topology.services import cluster_import
from topoweb import compiled
from topoweb.compiled import compiled_once

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes():
    compiled.forget()
    for name, leaves in (("alpha", 2), ("beta", 1)):
        spec = {
            "version": 1,
            "name": name,
            "generate": {
                "shape": "leaf-spine",
                "spines": 1,
                "leaves": leaves,
                "nodes_per_leaf": 2,
                "gpus_per_node": 2,
                "gpu_model": "H100",
                "peak_tflops": 989,
                "nvlink_bw_GBps": 450,
                "nic_bw_GBps": 50,
                "nics_per_node": 2,
                "uplink_bw_GBps": 800,
            },
        }
        cluster_import(data=spec)
    yield
    compiled.forget()


@pytest.fixture
def setups(monkeypatch):
    """How many times the compiler worked out a query's columns (the costly part it skips)."""
    calls = []
    real = SQLCompiler.setup_query

    def counted(self, *args, **kwargs):
        calls.append(self.query.model)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "setup_query", counted)
    return calls


def detail(pk: int):
    return compiled_once(Node.objects.select_related("cluster", "leaf", "gpu_model")).get(pk=pk)


def test_a_second_query_of_the_same_shape_reuses_the_sql_and_builds_the_same_instances(nodes, setups):
    first = detail(1)
    assert len(setups) == 1
    with CaptureQueriesContext(connection) as queries:
        second = detail(6)
    # Under tests the reused statement is checked against a fresh compilation: one setup for it.
    assert len(setups) == 2 and len(compiled._statements) == 1
    assert len(queries) == 1
    plain = Node.objects.select_related("cluster", "leaf", "gpu_model").get(pk=6)
    for got, want in ((first, Node.objects.get(pk=1)), (second, plain)):
        assert (got.pk, got.name, got.intra, got.cluster.name, got.leaf.name, got.gpu_model.name) == (
            want.pk,
            want.name,
            want.intra,
            want.cluster.name,
            want.leaf.name,
            want.gpu_model.name,
        )
    assert second.cluster.name == "beta"


def test_reused_statements_are_not_checked_outside_tests(nodes, setups, settings):
    settings.TESTING = False
    detail(1)
    detail(6)
    assert len(setups) == 1


def test_values_rows_pages_and_counts_are_kept_per_page(nodes):
    def page(cluster: str, number: int):
        rows = compiled_once(Node.objects.filter(cluster__name=cluster).order_by("name")).values_list(
            "name", "cluster__name", "intra"
        )
        got = Paginator(rows, 1).page(number)
        return got.paginator.count, list(got)

    count, rows = page("alpha", 2)
    assert count == 4 and rows[0][:2] == ("node-002", "alpha")
    assert rows[0][2] == Node.objects.get(pk=2).intra  # JSON read back as the ORM does
    kept = len(compiled._statements)
    assert kept == 2  # the page and its COUNT(*)
    count, rows = page("beta", 2)
    assert (count, [r[:2] for r in rows]) == (2, [("node-002", "beta")])
    assert len(compiled._statements) == kept
    page("beta", 1)  # another slice: another statement
    assert len(compiled._statements) == kept + 1


@pytest.mark.parametrize(
    "other",
    [
        lambda qs: qs.filter(pk__in=[1, 2, 3]),  # a list of another length
        lambda qs: qs.filter(cluster__name="beta"),  # a join
        lambda qs: qs.order_by("-name"),
        lambda qs: qs.only("name"),
        lambda qs: qs.select_related("cluster"),
        lambda qs: qs[1:2],
    ],
)
def test_another_shape_is_compiled_afresh_and_answers_its_own_rows(nodes, other):
    base = Node.objects.order_by("name")
    list(compiled_once(base.filter(pk__in=[1, 2])))
    kept = len(compiled._statements)
    got = [n.pk for n in other(compiled_once(base.filter(pk__in=[1, 2])))]
    want = [n.pk for n in other(base.filter(pk__in=[1, 2]))]
    assert got == want
    assert len(compiled._statements) == kept + 1


def test_queries_with_parameters_outside_the_where_or_nothing_to_match_are_compiled_each_time(nodes):
    with_param = compiled_once(Node.objects.annotate(tag=Value("x")).filter(pk=1))
    assert [n.tag for n in with_param] == ["x"]
    assert list(compiled_once(Node.objects.filter(pk__in=[]))) == []
    assert compiled._statements == {}


def test_a_statement_kept_for_another_query_fails_the_tests_check(nodes):
    detail(1)
    ((key, (sql, state)),) = compiled._statements.items()
    compiled._statements[key] = (sql.replace('"id" =', '"id" <>'), state)
    with pytest.raises(AssertionError, match="compiled_once reused"):
        detail(6)


def test_explain_of_a_kept_shape_is_still_an_explain(nodes):
    shape = Node.objects.filter(pk=1)
    list(compiled_once(shape))
    plan = compiled_once(shape).explain()
    assert plan == shape.explain() and "topology_node" in plan
