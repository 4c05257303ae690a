"""Indexes on the upper-cased job name (Postgres only) for the search box on a long job history:
a b-tree (text_pattern_ops) for its case-insensitive exact and prefix matches, whose statistics
also let the planner estimate them, and a pg_trgm GIN index for substring matches. SQLite, the
embedded demo database, scans instead. Where the role may not create the pg_trgm extension (a
trusted extension since Postgres 13: database owners may), the migration warns and goes on
without the trigram index: substring search still works, only slower on a long history."""

import logging

from django.db import DatabaseError, migrations, transaction

PATTERN_INDEX = "job_name_upper_pattern"
TRIGRAM_INDEX = "job_name_upper_trgm"
log = logging.getLogger(__name__)


def create_indexes(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("scheduling", "Job")._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {PATTERN_INDEX} ON {table} (UPPER(name::text) text_pattern_ops)"
        )
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {TRIGRAM_INDEX} ON {table} USING gin (UPPER(name::text) gin_trgm_ops)"
            )
    except DatabaseError as exc:
        log.warning("job name trigram index not created (%s); substring search scans the job table", exc)


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")
            cursor.execute(f"DROP INDEX IF EXISTS {PATTERN_INDEX}")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0007_job_requeue_reason")]

    operations = [migrations.RunPython(create_indexes, drop_indexes)]
