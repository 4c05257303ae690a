"""`manage.py export_topology NAME [--format yaml|json|slurm-tree|...]`: print a cluster as spec v1
or in another tool's format."""

import json

import yaml
from django.core.management.base import BaseCommand, CommandError

from apps.placement.convert import EXPORTERS
from apps.placement.topology import SpecError
from apps.topology import services
from apps.topology.conversion import cluster_export_format
from apps.topology.models import Cluster

from .import_topology import spec_error_text

# The C emitter when PyYAML was built with libyaml: much faster on large clusters.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
FORMATS = ["yaml", "json", *(f for f in EXPORTERS if f != "topology-v1")]


class Command(BaseCommand):
    help = "Print a cluster's topology as spec v1 (full form, yaml or json) or in another format on stdout."

    def add_arguments(self, parser):
        parser.add_argument("name", help="cluster name")
        parser.add_argument("--format", choices=FORMATS, default="yaml", help="output format")

    def handle(self, *args, name: str, format: str, **options):
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"no cluster named {name!r} (clusters: {known})")
        try:
            if format not in ("yaml", "json"):
                self.stdout.write(cluster_export_format(cluster=cluster, fmt=format), ending="")
                return
            spec = services.cluster_to_spec(cluster=cluster)
        except SpecError as exc:
            raise CommandError(
                f"cluster {name!r} is not valid against spec v1:\n{spec_error_text(exc)}"
            ) from exc
        if format == "json":
            self.stdout.write(json.dumps(spec, indent=2))
        else:
            text = yaml.dump(spec, Dumper=_DUMPER, sort_keys=False, default_flow_style=None, width=120)
            self.stdout.write(text, ending="")
