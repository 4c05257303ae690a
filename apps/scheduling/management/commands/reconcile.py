"""`manage.py reconcile [--check] [--cluster NAME]`: let each cluster's executor converge now, or
(--check) list what does not converge and exit 1 when anything does."""

from django.core.management.base import BaseCommand, CommandError

from apps.scheduling.executor import reconcile
from apps.scheduling.reconcile import findings
from apps.topology.models import Cluster


class Command(BaseCommand):
    help = (
        "Converge every cluster's executor on the lifecycle's state now; with --check, only list GPUs "
        "booked without a live rank, ranks that do not stop, orphan Slurm jobs and jobs in two "
        "generations, and exit 1 when there is any."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--check", action="store_true", help="list what does not converge; change nothing"
        )
        parser.add_argument("--cluster", help="only this cluster (its name)")

    def handle(self, *args, check: bool = False, cluster: str | None = None, **options):
        clusters = Cluster.objects.order_by("pk")
        if cluster:
            clusters = clusters.filter(name=cluster)
            if not clusters.exists():
                raise CommandError(f"cluster: no cluster named {cluster!r}")
        found = 0
        for c in clusters:
            if not check:
                done = reconcile(cluster=c)
                changed = {k: v for k, v in (done or {}).items() if v}
                self.stdout.write(f"{c.name}: {changed or 'nothing to do'}")
                continue
            for f in findings(cluster=c):
                found += 1
                self.stdout.write(f"{c.name}: {f.kind}: {f.text}")
        if check:
            self.stdout.write(f"{found} finding{'s' if found != 1 else ''}")
            if found:
                raise SystemExit(1)
