"""`manage.py retention`: delete or trim what is past its retention now (the daily task's work)."""

from django.core.management.base import BaseCommand

from apps.metrics.retention import retention_apply


class Command(BaseCommand):
    help = "Delete old metrics reports, rank records, output tails and audit rows; trim old finished jobs' specs."

    def handle(self, *args, **options):
        for kind, count in retention_apply().items():
            self.stdout.write(f"{kind}: {count}")
