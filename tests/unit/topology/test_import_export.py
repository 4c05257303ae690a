"""Import and export of spec v1 through the services and the management commands."""

import io
import json

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import IntegrityError

from apps.placement.topology import SpecError, load_topology, read_spec_file, topology_to_spec
from apps.topology import services
from apps.topology.models import Cluster, Gpu, Nic, Node
from tests.unit.placement.specs import generated

pytestmark = pytest.mark.django_db

EXAMPLE_NAMES = ["case-4-4", "pod-256", "su-h100"]


def export(name: str, fmt: str = "yaml") -> dict:
    out = io.StringIO()
    call_command("export_topology", name, "--format", fmt, stdout=out)
    text = out.getvalue()
    return json.loads(text) if fmt == "json" else yaml.safe_load(text)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_export_of_an_imported_example_is_its_full_spec_form(name, example_files, import_example):
    import_example(name)
    expected = topology_to_spec(load_topology(read_spec_file(example_files[name])))
    assert export(name, "yaml") == expected
    assert export(name, "json") == expected


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_import_export_import_yields_the_same_cluster(name, example_files, tmp_path, row_counts):
    call_command("import_topology", str(example_files[name]), stdout=io.StringIO())
    first = export(name)
    counts = row_counts()
    exported = tmp_path / f"{name}.json"
    exported.write_text(json.dumps(first))
    Cluster.objects.filter(name=name).delete()
    call_command("import_topology", str(exported), stdout=io.StringIO())
    assert export(name) == first
    assert row_counts() == counts


def test_import_reports_what_it_imported(example_files):
    out = io.StringIO()
    call_command("import_topology", str(example_files["pod-256"]), stdout=out)
    assert "Imported cluster pod-256: 32 nodes, 256 GPUs, 6 switches, 8 links" in out.getvalue()


def test_generated_pod_has_one_nic_per_gpu_on_its_leaf(pod256):
    node = Node.objects.get(cluster=pod256, name="node-009")
    assert node.leaf.name == "leaf-2"
    assert list(node.nics.values_list("name", flat=True)) == [f"mlx5_{k}" for k in range(8)]
    assert all(g.nic.leaf_id == node.leaf_id for g in node.gpus.select_related("nic"))
    assert list(node.gpus.values_list("nic__name", flat=True)) == [f"mlx5_{k}" for k in range(8)]


def test_rail_optimized_unit_puts_nic_i_on_leaf_i(import_example):
    su = import_example("su-h100")
    leaves = Nic.objects.filter(node__cluster=su, node__name="node-017").values_list("leaf__name", flat=True)
    assert list(leaves) == [f"leaf-{k + 1}" for k in range(8)]


def test_importing_an_existing_name_without_replace_is_refused(case44, example_files):
    with pytest.raises(services.ClusterExistsError) as err:
        services.cluster_import(data=read_spec_file(example_files["case-4-4"]))
    assert err.value.errors[0][0] == "name"
    assert "already exists" in err.value.errors[0][1]


def test_replace_keeps_the_cluster_row_and_its_settings(case44, example_files):
    case44.policy = "tree_best_fit"
    case44.description = "lab"
    case44.save()
    spec = read_spec_file(example_files["case-4-4"])
    spec["nodes"][1]["nics"][0]["bw_GBps"] = 25
    replaced = services.cluster_import(data=spec, replace=True)
    assert replaced.pk == case44.pk
    replaced.refresh_from_db()
    assert (replaced.policy, replaced.description) == ("tree_best_fit", "lab")
    assert list(Nic.objects.filter(node__cluster=replaced).values_list("bw_GBps", flat=True)) == [11.0, 25.0]
    assert Gpu.objects.filter(node__cluster=replaced).count() == 16


def test_replace_through_the_command_overwrites_the_topology(case44, example_files, tmp_path):
    spec = read_spec_file(example_files["case-4-4"])
    spec["nodes"] = spec["nodes"][:1]
    path = tmp_path / "smaller.yaml"
    path.write_text(yaml.safe_dump(spec))
    call_command("import_topology", str(path), "--replace", stdout=io.StringIO())
    assert list(Node.objects.filter(cluster=case44).values_list("name", flat=True)) == ["node-a"]


def test_a_failure_while_writing_rows_leaves_nothing_behind(example_files, monkeypatch, row_counts):
    before = row_counts()

    def fail(*args, **kwargs):
        raise IntegrityError("disk full")

    monkeypatch.setattr(Gpu.objects, "bulk_create", fail)
    with pytest.raises(IntegrityError):
        services.cluster_import(data=read_spec_file(example_files["pod-256"]))
    assert row_counts() == before


def test_a_failed_replace_keeps_the_old_topology(case44, example_files, monkeypatch):
    before = export("case-4-4")

    def fail(*args, **kwargs):
        raise IntegrityError("disk full")

    monkeypatch.setattr(Gpu.objects, "bulk_create", fail)
    with pytest.raises(IntegrityError):
        services.cluster_import(data=read_spec_file(example_files["case-4-4"]), replace=True)
    assert export("case-4-4") == before


def test_names_longer_than_the_columns_are_rejected_with_their_field(example_files, row_counts):
    spec = read_spec_file(example_files["case-4-4"])
    spec["nodes"][1]["nics"][0]["name"] = "n" * 101
    before = row_counts()
    with pytest.raises(SpecError) as err:
        services.cluster_import(data=spec)
    # The core's name pattern (at most 100 characters) refuses it before the columns would.
    [(field, message)] = err.value.errors
    assert field == "nodes[1].nics[0].name"
    assert "at most 100" in message and "(103 characters)" in message
    assert row_counts() == before


def test_nic_gpu_lists_are_exported_in_index_order(db, example_files):
    spec = read_spec_file(example_files["case-4-4"])
    spec["nodes"][0]["nics"] = [
        {"name": "mlx5_0", "gpus": [6, 4, 2, 0], "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5},
        {"name": "mlx5_1", "gpus": [7, 5, 3, 1], "leaf": "leaf-1", "bw_GBps": 11, "latency_us": 1.5},
    ]
    services.cluster_import(data=spec)
    nics = export("case-4-4")["nodes"][0]["nics"]
    assert [n["gpus"] for n in nics] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_standalone_nodes_and_dcgm_urls_survive_the_round_trip(db):
    spec = {
        "version": 1,
        "name": "lab",
        "gpu_models": {"L4": {"peak_tflops": 121}},
        "switches": [],
        "nodes": [
            {
                "name": "ws-1",
                "gpu_model": "L4",
                "gpus": 2,
                "standalone": True,
                "dcgm_url": "http://ws-1:9400/metrics",
                "nvlink": {"domain": "ws-1", "bw_GBps": 32, "latency_us": 5},
            }
        ],
    }
    cluster = services.cluster_import(data=spec)
    assert Node.objects.get(cluster=cluster).leaf is None
    assert export("lab") == topology_to_spec(load_topology(spec))


def test_an_nvlink_domain_spanning_nodes_is_stored_once(db):
    spec = {
        "version": 1,
        "name": "nvl",
        "generate": {
            "shape": "leaf-spine",
            "spines": 1,
            "leaves": 1,
            "nodes_per_leaf": 4,
            "gpus_per_node": 4,
            "gpu_model": "GB200",
            "peak_tflops": 2500,
            "nvlink_bw_GBps": 900,
            "nic_bw_GBps": 50,
            "nics_per_node": 4,
            "uplink_bw_GBps": 400,
            "nvlink_domain_nodes": 2,
        },
    }
    cluster = services.cluster_import(data=spec)
    assert list(cluster.nvlink_domains.values_list("name", flat=True)) == ["node-001", "node-003"]
    assert cluster.nvlink_domains.get(name="node-001").gpus.count() == 8
    assert export("nvl") == topology_to_spec(load_topology(spec))


def test_an_nvlink_domains_nvls_setting_survives_the_round_trip(db):
    # Set on one domain, silent (the GPU model's default) on the other.
    gen = generated(spines=1, leaves=1, gpus_per_node=8, nics_per_node=8, gpu_model="H100-SXM5-80GB")
    spec = topology_to_spec(load_topology(gen | {"name": "nvls"}))
    spec["nodes"][0]["nvlink"]["nvls"] = False
    cluster = services.cluster_import(data=spec)
    assert dict(cluster.nvlink_domains.values_list("name", "nvls")) == {"node-001": False, "node-002": None}
    assert export("nvls") == spec
    assert load_topology(export("nvls")).domain_nvls.tolist() == [0.0, 0.85]


def test_exporting_an_unknown_cluster_names_the_known_ones(case44):
    with pytest.raises(CommandError, match=r"no cluster named 'nope' \(clusters: case-4-4\)"):
        call_command("export_topology", "nope")
