"""manage.py slurm_sync: sync the clusters run by Slurm now (what celery beat does every few seconds)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from ...models import ClusterExecutor, ExecutorKind
from ...slurm.sync import slurm_sync


class Command(BaseCommand):
    help = (
        "Sync node states, foreign jobs and job states of the clusters run by Slurm, and submit placed jobs."
    )

    def add_arguments(self, parser):
        parser.add_argument("--cluster", help="Only this cluster (default: every Slurm cluster).")

    def handle(self, *args, **opts):
        executors = ClusterExecutor.objects.select_related("cluster").filter(kind=ExecutorKind.SLURM)
        if opts["cluster"]:
            executors = executors.filter(cluster__name=opts["cluster"])
            if not executors.exists():
                raise CommandError(f"cluster {opts['cluster']!r} is not run by Slurm")
        failed = False
        for ex in executors.order_by("pk"):
            result = slurm_sync(executor=ex)
            failed = failed or bool(result.error)
            self.stdout.write(json.dumps(result.as_dict()))
        if failed:
            raise CommandError("a sync failed (see its error)")
