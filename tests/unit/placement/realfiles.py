"""What every real-file converter test checks: node count, GPUs per node, NVLink domains and
their sizes, GPU-NIC affinity, and that a placed TP8 job stays inside one NVLink domain."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from apps.placement.convert import Defaults, Source, import_sources
from apps.placement.jobs import load_job
from apps.placement.solvers import place
from apps.placement.solvers.base import Placement

DATA = Path(__file__).resolve().parents[2] / "data" / "converters"
SAMPLES = Path(__file__).parent / "convert_samples"


def convert(fmt: str, *names: str, data: Path = DATA, **values):
    """(Imported, Topology) of files under `data` in format `fmt`, with `values` as --set."""
    sources = [Source(n, (data / n).read_text(encoding="utf-8")) for n in names]
    imported = import_sources(fmt, sources, Defaults.from_mapping(values))
    return imported, imported.topology()


def domain_sizes(topo) -> list[int]:
    """GPUs per NVLink domain, largest first."""
    return sorted(Counter(int(d) for d in topo.gpu_domain).values(), reverse=True)


def tp8_domains(topo) -> int:
    """How many NVLink domains a placed tp8 job's GPUs span."""
    job = load_job(
        {
            "version": 1,
            "name": "tp8",
            "gpus": 8,
            "parallelism": {"tp": 8, "pp": 1, "dp": 1, "ep": 1},
            "step": {"compute_ms": 100},
            "comm": [{"group": "tp", "collective": "allreduce", "bytes": 1e8}],
        }
    )
    placed = place(topo, np.ones(topo.n_gpus, dtype=bool), None, job)
    assert isinstance(placed, Placement), placed
    return len({int(topo.gpu_domain[g]) for g in placed.gids})


def nic_gpus(node) -> dict[str, tuple[int, ...]]:
    return {n.name: tuple(n.gpus) for n in node.nics}
