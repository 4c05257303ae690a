"""`manage.py import_topology FILE... [--format F] [--replace]`: load a spec v1 file (YAML or
JSON), or another tool's files (`--format slurm-tree`, `nvidia-smi`, ...), as a cluster."""

import argparse
import time

from django.core.management.base import BaseCommand, CommandError

from apps.placement.convert import IMPORTERS
from apps.placement.convert.cli import defaults_from, read_inputs
from apps.placement.topology import SpecError, read_spec_file
from apps.topology import selectors, services
from apps.topology.conversion import cluster_import_format


def spec_error_text(exc: SpecError) -> str:
    """One line per (field, message) of a SpecError."""
    return "\n".join(f"  {field or '(file)'}: {message}" for field, message in exc.errors)


class Command(BaseCommand):
    help = (
        "Import a topology spec v1 file (YAML or JSON, full or generate: form) as a cluster, or "
        "another tool's files with --format (values they lack from --defaults/--set)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "files",
            nargs="+",
            metavar="file",
            help="spec file; with --format, its files (NODE=file, directories)",
        )
        parser.add_argument("--format", choices=list(IMPORTERS), default="topology-v1", help="input format")
        parser.add_argument(
            "--replace", action="store_true", help="replace the topology of a cluster with the same name"
        )
        parser.add_argument("--defaults", help="YAML file of values the input lacks (gpus_per_node, ...)")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one such value")
        parser.add_argument("--name", help="cluster name for formats that carry none")
        parser.add_argument(
            "--nics", help="node formats: the NICs that are fabric rails, as shell patterns (mlx5_[0-7])"
        )

    def handle(self, *args, files, format, replace, **options):
        started = time.perf_counter()
        notes: list[str] = []
        label = " ".join(files)
        try:
            if format == "topology-v1" and not (
                options["defaults"] or options["set"] or options["name"] or options["nics"]
            ):
                if len(files) != 1:
                    raise CommandError("a topology spec v1 import takes one file")
                cluster = services.cluster_import(data=read_spec_file(files[0]), replace=replace)
            else:
                ns = argparse.Namespace(
                    defaults=options["defaults"],
                    set=options["set"],
                    name=options["name"],
                    nics=options["nics"],
                )
                cluster, notes = cluster_import_format(
                    fmt=format, sources=read_inputs(files), defaults=defaults_from(ns), replace=replace
                )
        except OSError as exc:
            raise CommandError(f"cannot read {exc.filename or label}: {exc.strerror or exc}") from exc
        except SpecError as exc:
            raise CommandError(
                f"{label} was rejected, nothing was imported:\n{spec_error_text(exc)}"
            ) from exc
        elapsed_s = time.perf_counter() - started
        for note in notes:
            self.stdout.write(f"note: {note}")
        s = selectors.cluster_summary(cluster=cluster)
        switches = sum(s["switches"].values())
        self.stdout.write(
            f"Imported cluster {cluster.name}: {s['nodes']} nodes, {s['gpus']} GPUs, "
            f"{switches} switches, {s['links']} links in {elapsed_s:.2f} s"
        )
