"""`manage.py load_demo`: the demo clusters, the demo admin login and the demo jobs (idempotent)."""

import importlib
import importlib.util

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.placement.topology import SpecError, read_spec_file
from apps.topology import services
from apps.topology.models import Cluster

from .import_topology import spec_error_text

DEMO_FILES = (
    "examples/pod-256.yaml",
    "examples/case-4-4.yaml",
    "examples/su-h100-rail.yaml",
    # Converted from `nvidia-smi topo -m` (examples/pcie-lab/): a PCIe-only and a partial-NVLink node.
    "examples/pcie-lab.yaml",
)
DEMO_USER = "admin"
DEMO_PASSWORD = "admin"
DEMO_JOBS_MODULE = "apps.scheduling.demo"
DEMO_SIMULATION_MODULE = "apps.simulations.demo"


class Command(BaseCommand):
    help = "Import the demo clusters if absent, create the demo admin login, load the demo jobs."

    def handle(self, *args, **options):
        for relative in DEMO_FILES:
            path = settings.BASE_DIR / relative
            try:
                data = read_spec_file(path)
                name = data["name"]
                if Cluster.objects.filter(name=name).exists():
                    self.stdout.write(f"Cluster {name} is already loaded")
                    continue
                services.cluster_import(data=data)
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc}") from exc
            except SpecError as exc:
                raise CommandError(f"{path} is not a valid topology:\n{spec_error_text(exc)}") from exc
            self.stdout.write(f"Imported cluster {name} from {relative}")
        self._demo_admin()
        if importlib.util.find_spec(DEMO_JOBS_MODULE) is not None:
            importlib.import_module(DEMO_JOBS_MODULE).load_demo_jobs()
            self.stdout.write("Loaded the demo jobs")
        if importlib.util.find_spec(DEMO_SIMULATION_MODULE) is not None:
            run = importlib.import_module(DEMO_SIMULATION_MODULE).load_demo_simulation()
            if run is not None:
                self.stdout.write(f"Demo simulation {run.pk}: {run.status}")

    def _demo_admin(self) -> None:
        if not settings.EMBEDDED:
            # A known password has no place on a shared database.
            self.stdout.write("Not creating the demo login outside the embedded default; use createsuperuser")
            return
        users = get_user_model()
        if not users.objects.filter(username=DEMO_USER).exists():
            users.objects.create_superuser(DEMO_USER, email="", password=DEMO_PASSWORD)
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo admin login: user {DEMO_USER!r}, password {DEMO_PASSWORD!r} (demo only)"
            )
        )
