"""`manage.py create_node_token CLUSTER NODE`: print a new node agent token for NODE;
`manage.py create_node_token CLUSTER --all --out DIR`: write one to DIR/<node>.token for every
node of the cluster (mode 0600)."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.executors.agents.services import node_token_create
from apps.topology.models import Cluster, Node


class Command(BaseCommand):
    help = (
        "Create a node agent token (`Authorization: Node <key>`) for NODE of CLUSTER and print its key, "
        "or with --all --out DIR write one file per node of the cluster."
    )

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="cluster name or id")
        parser.add_argument("node", nargs="?", help="node name (leave out with --all)")
        parser.add_argument("--all", action="store_true", help="a token for every node of the cluster")
        parser.add_argument("--out", help="with --all: the directory to write <node>.token files to")

    def handle(self, *args, cluster: str, node: str | None, all: bool, out: str | None, **options):
        found = Cluster.objects.filter(name=cluster).first()
        if found is None and cluster.isdigit():
            found = Cluster.objects.filter(pk=int(cluster)).first()
        if found is None:
            names = ", ".join(Cluster.objects.values_list("name", flat=True)[:20]) or "none"
            raise CommandError(f"unknown cluster {cluster!r} (clusters: {names})")
        if all:
            if node:
                raise CommandError("give either NODE or --all, not both")
            if not out:
                raise CommandError("--all needs --out DIR (one token file per node)")
            self._write_all(found, Path(out))
            return
        if out:
            raise CommandError("--out goes with --all")
        if not node:
            raise CommandError("give NODE (or --all --out DIR)")
        target = Node.objects.filter(cluster=found, name=node).first()
        if target is None:
            raise CommandError(f"unknown node {node!r} in cluster {found.name!r}")
        _, key = node_token_create(node=target)
        self.stdout.write(key)

    def _write_all(self, cluster: Cluster, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        nodes = list(Node.objects.filter(cluster=cluster).order_by("position", "pk"))
        for target in nodes:
            _, key = node_token_create(node=target)
            path = out / f"{target.name}.token"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, (key + "\n").encode())
            finally:
                os.close(fd)
        self.stdout.write(f"wrote {len(nodes)} node tokens to {out}")
