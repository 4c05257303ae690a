"""Point a cluster at a Slurm cluster: its executor settings and, on request, its topology read
from the live Slurm (`scontrol show topology` or a topology.conf, and slurmrestd's nodes)."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from django.db import transaction

from apps.placement.convert import Source
from apps.placement.topology import SpecError
from apps.topology.conversion import spec_from_format
from apps.topology.models import Cluster
from apps.topology.services import cluster_import

from ..models import ClusterExecutor, ExecutorKind
from .rest import SlurmRest, node_conf, topology_conf

LOCAL_SOCKET = "unix:/tmp/topoweb-slurm/rest/slurmrestd.sock"
LOCAL_CONF = "/tmp/topoweb-slurm/etc/slurm.conf"  # scripts/slurm-local.sh
LOCAL_JWT_KEY = "/tmp/topoweb-slurm/etc/jwt_hs256.key"


def slurm_env() -> dict[str, str]:
    """The environment for Slurm's commands: the local Slurm's config when none is set."""
    env = dict(os.environ)
    if "SLURM_CONF" not in env and os.path.exists(LOCAL_CONF):
        env["SLURM_CONF"] = LOCAL_CONF
    return env


def live_topology(
    client: SlurmRest,
    *,
    name: str,
    topology_text: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> tuple[dict, list[str]]:
    """The spec v1 of the live Slurm cluster named `name`: switches from `topology_text`
    (topology.conf or `scontrol show topology` output; None runs scontrol), GPUs from the nodes'
    Gres as slurmrestd reports them. SpecError when the converter rejects it."""
    if topology_text is None:
        try:
            done = subprocess.run(
                ["scontrol", "show", "topology"], capture_output=True, text=True, timeout=30, env=slurm_env()
            )
        except OSError as exc:
            raise SpecError([("topology", f"cannot run scontrol: {exc}")]) from exc
        if done.returncode != 0:
            raise SpecError([("topology", f"scontrol show topology failed: {done.stderr.strip()}")])
        topology_text = done.stdout
    sources = [
        Source("scontrol show topology", topology_conf(topology_text)),
        Source("slurmrestd nodes", node_conf(client.nodes())),
    ]
    return spec_from_format(fmt="slurm-tree", sources=sources, defaults={**(defaults or {}), "name": name})


def slurm_connect(
    *,
    name: str,
    url: str = LOCAL_SOCKET,
    import_topology: bool = False,
    topology_text: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    client: SlurmRest | None = None,
    **settings: Any,
) -> tuple[Cluster, list[str]]:
    """Make cluster `name` run on the Slurm at `url` (created from the live topology when it does
    not exist or `import_topology`); `settings` are other ClusterExecutor fields. Returns the
    cluster and the converter's notes."""
    if client is None:
        key = base64.b64decode(settings.get("jwt_key") or "")
        client = SlurmRest(
            url, user=settings.get("slurm_user", ""), token=settings.get("slurm_token", ""), jwt_key=key
        )
    client.ping()
    notes: list[str] = []
    with transaction.atomic():
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None or import_topology:
            spec, notes = live_topology(client, name=name, topology_text=topology_text, defaults=defaults)
            cluster = cluster_import(data=spec, replace=cluster is not None)
        ClusterExecutor.objects.update_or_create(
            cluster=cluster, defaults={"kind": ExecutorKind.SLURM, "slurmrestd_url": url, **settings}
        )
    return cluster, notes
