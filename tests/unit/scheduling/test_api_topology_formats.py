"""Topology API in other tools' formats: import with ?from=, export with ?format=."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from apps.placement.convert.hostlist import expand
from apps.placement.topology import read_spec_file
from apps.topology.models import Cluster, Node

from .conftest import EXAMPLES

pytestmark = pytest.mark.django_db

CONF = (
    b"# lab\nSwitchName=s0 Nodes=gpu[01-02]\nSwitchName=s1 Nodes=gpu[03-04]\nSwitchName=top Switches=s[0-1]\n"
)
MATRIX = b"\tGPU0\tGPU1\tNIC0\nGPU0\t X \tNV4\tPIX\nGPU1\tNV4\t X \tPIX\nNIC0\tPIX\tPIX\t X \n"


def _upload(name: str, body: bytes) -> io.BytesIO:
    f = io.BytesIO(body)
    f.name = name
    return f


def test_import_from_slurm_tree_with_defaults_reports_them(staff_api):
    response = staff_api.post(
        "/api/v1/clusters/import/?from=slurm-tree",
        {"file": _upload("topology.conf", CONF), "defaults": "name: lab\ngpus_per_node: 4\n"},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "lab"
    assert any("gpus_per_node=4," in n and "(default)" in n for n in body["notes"])
    assert Node.objects.filter(cluster__name="lab").count() == 4


def test_import_of_several_node_files_makes_one_cluster(staff_api):
    files = [_upload("node-a.txt", MATRIX), _upload("node-b.txt", MATRIX)]
    response = staff_api.post(
        "/api/v1/clusters/import/",
        {"from": "nvidia-smi", "file": files, "defaults": '{"name": "smi"}'},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    assert sorted(Node.objects.filter(cluster__name="smi").values_list("name", flat=True)) == [
        "node-a",
        "node-b",
    ]


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"file": b"SwitchName=s0 Nodes=a1\nSwitchName=s1 Switches=zz\n"}, "topology.conf:2"),
        ({"file": CONF, "defaults": "gpus_per_node: many"}, "defaults.gpus_per_node"),
        ({"file": CONF, "defaults": "- 1\n"}, "defaults"),
        ({}, "file"),
    ],
)
def test_bad_foreign_imports_are_400_naming_the_line_or_field_and_write_nothing(staff_api, fields, key):
    data = {k: (_upload("topology.conf", v) if k == "file" else v) for k, v in fields.items()}
    response = staff_api.post("/api/v1/clusters/import/?from=slurm-tree", data, format="multipart")
    assert response.status_code == 400
    assert key in response.json()
    assert not Cluster.objects.exists()


def test_unknown_input_format_is_400(staff_api):
    response = staff_api.post(
        "/api/v1/clusters/import/?from=visio", {"file": _upload("x", CONF)}, format="multipart"
    )
    assert response.status_code == 400 and "from" in response.json()


@pytest.mark.parametrize(
    ("fmt", "media"),
    [
        ("slurm-tree", "text/plain"),
        ("slurm-block", "text/plain"),
        ("slurm-yaml", "application/yaml"),
        ("topograph", "application/json"),
        ("kueue", "application/yaml"),
    ],
)
def test_export_in_each_format(pod256, alice_api, fmt, media):
    response = alice_api.get(f"/api/v1/clusters/{pod256.pk}/export/", {"format": fmt})
    assert response.status_code == 200
    assert response["Content-Type"].startswith(media)
    assert f'filename="pod-256.{fmt}.' in response["Content-Disposition"]
    text = response.content.decode()
    if fmt == "slurm-tree":
        leaves = [ln for ln in text.splitlines() if "Nodes=" in ln]
        assert len(leaves) == 4 and sum(len(expand(ln.split("Nodes=")[1])) for ln in leaves) == 32
    elif fmt == "topograph":
        assert "leaf-1" in json.dumps(json.loads(text)["tiers"])
    elif fmt == "kueue":
        assert list(yaml.safe_load_all(text))[0]["kind"] == "Topology"


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        # A matrix of GPUs only: nothing says which NIC each GPU uses.
        ("gpus-only.txt", b"\tGPU0\tGPU1\nGPU0\t X \tNV12\nGPU1\tNV12\t X \n", "gpus-only.txt:1"),
    ],
)
def test_bad_nvidia_smi_imports_are_400_naming_the_line(staff_api, name, text, key):
    response = staff_api.post(
        "/api/v1/clusters/import/?from=nvidia-smi", {"file": _upload(name, text)}, format="multipart"
    )
    assert response.status_code == 400, response.content
    assert any(key in k for k in response.json()), response.json()
    assert not Cluster.objects.exists()


def test_a_lone_surrogate_in_an_imported_name_is_a_400_naming_the_field(staff_api):
    spec = read_spec_file(EXAMPLES / "case-4-4.yaml")
    body = json.dumps({**spec, "name": "x"}).replace('"name": "x"', '"name": "x\\ud800"', 1)
    response = staff_api.post("/api/v1/clusters/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "lone surrogate" in response.json()["name"][0]
    # A lone surrogate in a key is named with the key escaped.
    body = json.dumps(spec).replace('"gpu_models"', '"gpu\\udc80models"', 1)
    response = staff_api.post("/api/v1/clusters/", body, content_type="application/json")
    assert response.status_code == 400 and "lone surrogate" in response.content.decode()
    assert not Cluster.objects.exists()
