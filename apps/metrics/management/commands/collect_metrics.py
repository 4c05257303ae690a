"""`manage.py collect_metrics [--cluster NAME]`: one collection pass, the same service beat runs."""

from django.core.management.base import BaseCommand, CommandError

from apps.metrics.services import metrics_collect
from apps.topology.models import Cluster


class Command(BaseCommand):
    help = "Collect GPU metrics once from every node of one cluster (or of all clusters)."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", help="cluster name (default: every cluster)")

    def handle(self, *args, cluster=None, **options):
        clusters = Cluster.objects.order_by("pk")
        if cluster:
            clusters = clusters.filter(name=cluster)
            if not clusters.exists():
                raise CommandError(f"--cluster: unknown cluster {cluster!r}")
        for c in clusters:
            r = metrics_collect(cluster=c)
            stages = ", ".join(f"{k} {v:.0f} ms" for k, v in r.stage_ms.items())
            self.stdout.write(
                f"{c.name}: {r.nodes_ok} nodes read, {r.nodes_failed} failed, {r.readings} GPU readings,"
                f" {r.jobs_measured} jobs measured, {r.hotspots} hotspots ({stages})"
            )
