"""Fixtures for the topology app's tests: the example clusters, imported through the service."""

from pathlib import Path

import pytest

from apps.placement.topology import read_spec_file
from apps.topology import services
from apps.topology.models import Cluster, Gpu, GpuModel, Link, Nic, Node, NvlinkDomain, Switch

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXAMPLE_FILES = {
    "case-4-4": EXAMPLES / "case-4-4.yaml",
    "pod-256": EXAMPLES / "pod-256.yaml",
    "su-h100": EXAMPLES / "su-h100-rail.yaml",
}
TOPOLOGY_MODELS = (Cluster, GpuModel, Switch, Link, NvlinkDomain, Node, Nic, Gpu)


@pytest.fixture
def example_files() -> dict[str, Path]:
    """Example spec files by cluster name."""
    return dict(EXAMPLE_FILES)


@pytest.fixture
def row_counts(db):
    """A function giving the rows per topology model (to show a failed write changed nothing)."""

    def _counts() -> dict[str, int]:
        return {model.__name__: model.objects.count() for model in TOPOLOGY_MODELS}

    return _counts


@pytest.fixture
def import_example(db):
    """Import one of the example clusters by name and return its Cluster row."""

    def _import(name: str) -> Cluster:
        return services.cluster_import(data=read_spec_file(EXAMPLE_FILES[name]))

    return _import


@pytest.fixture
def case44(import_example) -> Cluster:
    return import_example("case-4-4")


@pytest.fixture
def pod256(import_example) -> Cluster:
    return import_example("pod-256")
