"""`manage.py serve_embedded --addr HOST:PORT`: the embedded default's web server.

Django's development server without the autoreloader (one process, so in-process background work
stays single), static files served by WhiteNoise so it works with DEBUG off.
"""

from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve TopoWeb on HOST:PORT with Django's server, without autoreload."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="HOST:PORT to listen on")
        parser.add_argument(
            "--dcgm-port",
            type=int,
            default=9400,
            help="port of the in-process simulated dcgm-exporter (0: any)",
        )

    def handle(self, *args, addr: str, dcgm_port: int, **options):
        self.stdout.write(f"TopoWeb on http://{addr}/ (admin at http://{addr}/admin/)")
        # No celery beat in the embedded default: a thread runs the scheduling cycles instead.
        from apps.scheduling.embedded import start_periodic_scheduler

        start_periodic_scheduler(interval_s=10)
        # The demo is measured too: a simulated exporter for every node and a collector thread.
        from apps.metrics.embedded import start_embedded_metrics

        start_embedded_metrics(host=addr.rsplit(":", 1)[0] or "127.0.0.1", port=dcgm_port)
        call_command("runserver", addr, use_reloader=False, skip_checks=False)
