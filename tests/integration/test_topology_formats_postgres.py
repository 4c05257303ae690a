"""Clusters from other tools' formats on the real Postgres: intra-node links stored as jsonb,
and a rejected conversion writes nothing."""

import io
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.placement.topology import load_topology, read_spec_file, topology_to_spec
from apps.topology import services
from apps.topology.models import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.django_db
def test_nvidia_smi_nodes_import_with_intra_links_and_export_identically():
    lab = EXAMPLES / "pcie-lab"
    files = [f"{name}={lab / (name + '.txt')}" for name in ("pcie-box", "mesh-box")]
    call_command(
        "import_topology",
        *files,
        "--format",
        "nvidia-smi",
        "--defaults",
        str(lab / "site.yaml"),
        stdout=io.StringIO(),
    )
    out = io.StringIO()
    call_command("export_topology", "pcie-lab", stdout=out)
    exported = yaml.safe_load(out.getvalue())
    assert exported == topology_to_spec(load_topology(read_spec_file(EXAMPLES / "pcie-lab.yaml")))
    topo = services.cluster_topology(cluster=Cluster.objects.get(name="pcie-lab"), fresh=True)
    assert sorted(topo.node_intra) == [0, 1]


@pytest.mark.django_db
def test_a_bad_slurm_file_writes_nothing(tmp_path):
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=b[1-\n")
    with pytest.raises(CommandError, match="topology.conf:2"):
        call_command("import_topology", str(conf), "--format", "slurm-tree", stdout=io.StringIO())
    assert not Cluster.objects.exists()
