"""Shared topologies for the placement core's unit tests (no Django)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.placement.jobs import load_job_file
from apps.placement.topology import load_topology, load_topology_file
from tests.unit.placement.specs import generated, hetero_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="session")
def case44():
    return load_topology_file(str(EXAMPLES / "case-4-4.yaml"))


@pytest.fixture(scope="session")
def case44_job():
    return load_job_file(str(EXAMPLES / "case-4-4-job.yaml"))


@pytest.fixture(scope="session")
def pod256():
    return load_topology_file(str(EXAMPLES / "pod-256.yaml"))


@pytest.fixture(scope="session")
def hetero():
    return load_topology(hetero_spec())


@pytest.fixture(scope="session")
def rail():
    """Two rail-optimised units of 2 nodes x 4 GPUs, 4 rails: leaves 1-4 serve unit 1, 5-8 unit 2."""
    return load_topology(generated("rail-optimized", leaves=8, nics_per_node=4, spines=2))


@pytest.fixture(scope="session")
def pods():
    """Two pods of 2 leaves x 2 nodes x 4 GPUs, joined at 2 core switches."""
    return load_topology(
        generated(
            pods=2, cores=2, core_uplink_bw_GBps=100, uplink_bw_GBps=80, nic_bw_GBps=50, nics_per_node=2
        )
    )
