"""`manage.py create_launcher_token CLUSTER`: print a new launcher token for the cluster."""

from django.core.management.base import BaseCommand, CommandError

from apps.scheduling.services import launcher_token_create
from apps.topology.models import Cluster


class Command(BaseCommand):
    help = "Create a launcher token for CLUSTER (name or id) and print its key."

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="cluster name or id")

    def handle(self, *args, cluster: str, **options):
        found = Cluster.objects.filter(name=cluster).first()
        if found is None and cluster.isdigit():
            found = Cluster.objects.filter(pk=int(cluster)).first()
        if found is None:
            names = ", ".join(Cluster.objects.values_list("name", flat=True)[:20]) or "none"
            raise CommandError(f"unknown cluster {cluster!r} (clusters: {names})")
        _, key = launcher_token_create(cluster=found)
        # Shown this once: only its hash is stored.
        self.stdout.write(key)
