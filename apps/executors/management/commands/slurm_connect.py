"""manage.py slurm_connect: run a cluster's jobs on a Slurm cluster through slurmrestd."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.placement.topology import SpecError

from ...models import ClusterExecutor, ExecutorKind
from ...slurm.connect import LOCAL_JWT_KEY, LOCAL_SOCKET, slurm_connect
from ...slurm.rest import SlurmError
from ...slurm.sync import slurm_sync


class Command(BaseCommand):
    help = (
        "Point a cluster at a Slurm cluster (slurmrestd); with --import (or for a new cluster) its "
        "topology is read from the live Slurm. --agents switches it back to TopoWeb's node agents."
    )

    def add_arguments(self, parser):
        parser.add_argument("--cluster", default="slurm-local", help="Cluster name (default: slurm-local).")
        parser.add_argument(
            "--url",
            default=LOCAL_SOCKET,
            help=f"slurmrestd: unix:/socket or http(s)://host:port (default {LOCAL_SOCKET}).",
        )
        parser.add_argument(
            "--import",
            dest="import_topology",
            action="store_true",
            help="Replace the topology with the live one.",
        )
        parser.add_argument(
            "--topology-conf", help="topology.conf to read instead of `scontrol show topology`."
        )
        parser.add_argument(
            "--defaults",
            default="",
            help="Converter defaults, a YAML/JSON mapping (e.g. '{nics_per_node: 8}').",
        )
        parser.add_argument("--partition", default="")
        parser.add_argument(
            "--user",
            default="",
            help="Slurm user TopoWeb acts as (rest_auth/jwt; on the local Slurm's socket: slurm with its key).",
        )
        parser.add_argument("--token-file", help="That user's JWT (rest_auth/jwt).")
        parser.add_argument("--jwt-key-file", help="Slurm's jwt_hs256.key, to mint per-user tokens.")
        parser.add_argument(
            "--submit-as-owner", action="store_true", help="Submit each job as its owner's Slurm user."
        )
        parser.add_argument(
            "--output-dir", default="", help="Where job output goes (default: the job's workdir or /tmp)."
        )
        parser.add_argument(
            "--foreign-gbps",
            type=float,
            default=0.0,
            help="GB/s per GPU assumed for sbatch jobs spanning leaf switches, priced as uplink load (default 0).",
        )
        parser.add_argument(
            "--scontrol-nodes",
            action="store_true",
            help="Drain and resume made in TopoWeb run scontrol update on this host (else: refused, 409).",
        )
        parser.add_argument(
            "--agents", action="store_true", help="Run the cluster's jobs with node agents again."
        )

    def handle(self, *args, **opts):
        if opts["agents"]:
            n = ClusterExecutor.objects.filter(cluster__name=opts["cluster"]).update(kind=ExecutorKind.AGENTS)
            if not n:
                raise CommandError(f"cluster {opts['cluster']!r} has no executor settings")
            self.stdout.write(f"cluster {opts['cluster']}: node agents")
            return
        settings = {
            "partition": opts["partition"],
            "slurm_user": opts["user"],
            "submit_as_owner": opts["submit_as_owner"],
            "output_dir": opts["output_dir"],
            "foreign_gbps_per_gpu": opts["foreign_gbps"],
            "scontrol_nodes": opts["scontrol_nodes"],
        }
        if not opts["foreign_gbps"] >= 0:
            raise CommandError("--foreign-gbps must be 0 or more")
        if opts["token_file"]:
            settings["slurm_token"] = Path(opts["token_file"]).read_text().strip()
        local = opts["url"] == LOCAL_SOCKET and os.path.exists(LOCAL_JWT_KEY)
        if local and not (opts["user"] or opts["token_file"] or opts["jwt_key_file"]):
            # scripts/slurm-local.sh's slurmrestd takes rest_auth/jwt: read as `slurm` with its key.
            settings["slurm_user"], opts["jwt_key_file"] = "slurm", LOCAL_JWT_KEY
        if opts["jwt_key_file"]:
            settings["jwt_key"] = base64.b64encode(Path(opts["jwt_key_file"]).read_bytes()).decode()
        if settings["submit_as_owner"] and not settings.get("jwt_key"):
            raise CommandError("--submit-as-owner needs --jwt-key-file (rest_auth/jwt)")
        topology_text = Path(opts["topology_conf"]).read_text() if opts["topology_conf"] else None
        try:
            defaults = _defaults(opts["defaults"])
            cluster, notes = slurm_connect(
                name=opts["cluster"],
                url=opts["url"],
                import_topology=opts["import_topology"],
                topology_text=topology_text,
                defaults=defaults,
                **settings,
            )
        except (SlurmError, SpecError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        for note in notes:
            self.stdout.write(f"note: {note}")
        result = slurm_sync(executor=cluster.executor)
        if result.error:
            raise CommandError(f"first sync failed: {result.error}")
        self.stdout.write(
            f"cluster {cluster.name}: Slurm at {opts['url']}, {result.nodes} nodes, {result.foreign_jobs} foreign jobs"
        )


def _defaults(text: str) -> dict:
    import yaml

    if not text.strip():
        return {}
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("--defaults must be a YAML/JSON mapping")
    return data
