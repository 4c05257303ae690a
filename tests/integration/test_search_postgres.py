"""The search box's job-name matches on Postgres can use the indexes of migration 0008."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.scheduling.models import Job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres"), pytest.mark.django_db]


@pytest.mark.parametrize(
    "lookup, index",
    [
        ("iexact", "job_name_upper_pattern"),
        ("istartswith", "job_name_upper_pattern"),
        ("icontains", "job_name_upper_trgm"),
    ],
)
def test_every_job_name_match_the_search_makes_can_use_an_index(lookup, index):
    with connection.cursor() as cursor:
        # An empty table is cheapest to scan: take the scan away to see whether the index fits.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off" if lookup != "icontains" else "SELECT 1")
    plan = Job.objects.filter(**{f"name__{lookup}": "LLaMa_%"}).explain()
    assert index in plan, plan
