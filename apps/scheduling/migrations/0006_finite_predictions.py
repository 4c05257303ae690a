"""Clear predicted times that are not finite numbers.

Before the physical ranges, a job spec such as `bytes: 1.7e308` stored an infinite predicted time,
and every job list then failed to render. Such values are set to null (no prediction), as the
placement output does for an unreachable pair.
"""

import math

from django.db import migrations

PREDICTED = ("predicted_comm_ms", "predicted_step_ms", "predicted_mfu")


def clear_non_finite(apps, schema_editor):
    job = apps.get_model("scheduling", "Job")
    for name in PREDICTED:
        for value in (math.inf, -math.inf):
            job.objects.filter(**{name: value}).update(**{name: None})
        if schema_editor.connection.vendor == "postgresql":
            # Postgres keeps NaN (and NaN = NaN there); SQLite stores NaN as null already.
            job.objects.filter(**{name: math.nan}).update(**{name: None})


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0005_agents_health_generations")]

    operations = [migrations.RunPython(clear_non_finite, migrations.RunPython.noop)]
