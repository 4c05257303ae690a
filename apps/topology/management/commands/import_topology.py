"""`manage.py import_topology FILE [--replace]`: load a spec v1 file (YAML or JSON) as a cluster."""

import time

from django.core.management.base import BaseCommand, CommandError

from apps.placement.topology import SpecError, read_spec_file
from apps.topology import selectors, services


def spec_error_text(exc: SpecError) -> str:
    """One line per (field, message) of a SpecError."""
    return "\n".join(f"  {field or '(file)'}: {message}" for field, message in exc.errors)


class Command(BaseCommand):
    help = "Import a topology spec v1 file (YAML or JSON, full or generate: form) as a cluster."

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the spec file")
        parser.add_argument(
            "--replace", action="store_true", help="replace the topology of a cluster with the same name"
        )

    def handle(self, *args, file: str, replace: bool, **options):
        started = time.perf_counter()
        try:
            data = read_spec_file(file)
            cluster = services.cluster_import(data=data, replace=replace)
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from exc
        except SpecError as exc:
            raise CommandError(f"{file} was rejected, nothing was imported:\n{spec_error_text(exc)}") from exc
        elapsed_s = time.perf_counter() - started
        s = selectors.cluster_summary(cluster=cluster)
        switches = sum(s["switches"].values())
        self.stdout.write(
            f"Imported cluster {cluster.name}: {s['nodes']} nodes, {s['gpus']} GPUs, "
            f"{switches} switches, {s['links']} links in {elapsed_s:.2f} s"
        )
