"""`manage.py fake_dcgm --cluster NAME --port P`: serve simulated dcgm-exporter text for every
node of a cluster, driven by the jobs placed on it and the cost model, until interrupted."""

import threading

from django.core.management.base import BaseCommand, CommandError

from apps.metrics.fake import SimulatedExporter, exporter_url
from apps.metrics.simulate import DEFAULT_NIC_EFFICIENCY
from apps.topology.models import Cluster


class Command(BaseCommand):
    help = "Serve simulated dcgm-exporter and InfiniBand counters for every node of a cluster."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", action="append", required=True, help="cluster name (repeatable)")
        parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
        parser.add_argument("--refresh-s", type=float, default=5.0, help="seconds between recomputations")
        parser.add_argument(
            "--nic-efficiency",
            type=float,
            default=DEFAULT_NIC_EFFICIENCY,
            help="share of nominal NIC and uplink bandwidth the simulated network delivers",
        )
        parser.add_argument(
            "--point-nodes", action="store_true", help="set every node's dcgm_url to this exporter"
        )

    def handle(self, *args, cluster, port, host, refresh_s, nic_efficiency, point_nodes, **options):
        missing = sorted(
            set(cluster) - set(Cluster.objects.filter(name__in=cluster).values_list("name", flat=True))
        )
        if missing:
            raise CommandError(f"--cluster: unknown cluster {missing[0]!r}")
        if not 0 < port < 65536:
            raise CommandError(f"--port: must lie in 1..65535, got {port}")
        if not 0 < nic_efficiency <= 1:
            raise CommandError(f"--nic-efficiency: must lie in (0, 1], got {nic_efficiency}")
        if not 0.1 <= refresh_s <= 3600:
            raise CommandError(f"--refresh-s: must lie in 0.1..3600, got {refresh_s}")
        exporter = SimulatedExporter(cluster, nic_efficiency=nic_efficiency)
        server = exporter.serve(host, port, refresh_s=refresh_s)
        base = f"http://{host}:{server.server_address[1]}"
        if point_nodes:
            self.stdout.write(
                f"Pointed {exporter.point_nodes(base, only_unset=False)} nodes at this exporter"
            )
        self.stdout.write(
            f"Simulated dcgm-exporter for {len(exporter.pages)} nodes, e.g. "
            f"{exporter_url(base, cluster[0], next(iter(exporter.pages))[1] if exporter.pages else 'NODE')}",
        )
        self.stdout.flush()
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            exporter.stop()
