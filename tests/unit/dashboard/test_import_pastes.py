"""The import page's paste box with real-world pastes: nvidia-smi as copied from a terminal or an
issue, files the converter refuses (a 400 naming what is missing), and the notes of every
default that shapes a placement on the preview."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse

from apps.topology.models import Cluster

DATA = Path(__file__).resolve().parents[2] / "data" / "converters"
pytestmark = pytest.mark.django_db


def _post(client, text: str, fmt: str, defaults: str = "", action: str = "preview"):
    fields = {"text": text, "format": fmt, "defaults": defaults, "action": action}
    return client.post(reverse("dashboard:import"), fields)


def test_a_pasted_space_aligned_matrix_previews_with_its_notes(client, people):
    client.force_login(people["ops"])
    text = (DATA / "nvsmi-h20-quoted-roce-frontend.txt").read_text().replace("\n", "\r\n")
    response = _post(client, text, "nvidia-smi", "name: h20-box\n")
    assert response.status_code == 200
    body = response.content.decode()
    assert "1 nodes · 8 GPUs · 1 NVLink domains" in body
    assert "rocep152s0f0 left out: Ethernet/RoCE front end" in body
    assert "50 GB/s per NIC assumed (nic_bw_GBps, not in the input): 4 NICs" in body


def test_a_pasted_matrix_without_nic_columns_is_a_400_naming_them(client, people):
    client.force_login(people["ops"])
    response = _post(client, (DATA / "nvsmi-gpus-only.txt").read_text(), "nvidia-smi")
    assert response.status_code == 400
    body = response.content.decode()
    assert "<code>pasted:1</code>" in body and "no NIC columns" in body
    assert not Cluster.objects.exists()


def test_the_preview_shows_the_nics_per_node_default_with_its_node_count(client, people):
    client.force_login(people["ops"])
    conf = "".join(f"SwitchName=leaf{k} Nodes=gpu[{k}01-{k}16]\n" for k in (1, 2))
    conf += "SwitchName=spine Switches=leaf[1-2]\n"
    response = _post(client, conf, "slurm-tree")
    assert response.status_code == 200
    body = response.content.decode()
    assert "1 NIC per node assumed (nics_per_node, not in the input): 32 nodes" in body
    assert "8 GPUs per node assumed (gpus_per_node, not in the input): 32 nodes" in body


def test_the_preview_shows_gpus_per_node_domain_sizes_and_the_default_warning(client, people):
    client.force_login(people["ops"])
    text = (DATA / "slurm-multi-topology.yaml").read_text()
    response = _post(client, text, "slurm-yaml")
    assert response.status_code == 200
    body = response.content.decode()
    assert "4 GPUs × 36 nodes; NVLink domains: 2 × 72 GPUs" in body
    assert '<li class="reason-box">warning: the cluster default topology' in body
