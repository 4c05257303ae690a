"""The end-to-end REST flow of case 4.4 on the embedded default (SQLite, eager Celery)."""

from __future__ import annotations

import io
import json
import shlex

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from .conftest import EXAMPLES

pytestmark = pytest.mark.django_db


def client_with(header: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


def command_output(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_case44_flow_through_the_api(staff_api, make_user, job_spec, committed):
    # Import case 4.4 as an operator, as a file upload.
    with open(EXAMPLES / "case-4-4.yaml", "rb") as fh:
        imported = staff_api.post("/api/v1/clusters/import/", {"file": fh}, format="multipart")
    assert imported.status_code == 201, imported.content
    assert imported.json()["gpu_count"] == 16

    # A user token from the management command.
    make_user("carol")
    carol = client_with(f"Token {command_output('drf_create_token', 'carol').split()[2]}")
    launcher = client_with(f"Launcher {command_output('create_launcher_token', 'case-4-4')}")

    # The seed's job, as JSON: placed with ranks 0-7 on one node and 8-15 on the other.
    first = committed(carol.post, "/api/v1/jobs/", job_spec(), format="json")
    assert first.status_code == 201, first.content
    job = carol.get(f"/api/v1/jobs/{first.json()['id']}/").json()
    assert job["status"] == "placing"
    ranks = carol.get(f"/api/v1/jobs/{job['id']}/placement/").json()["ranks"]
    assert [r["rank"] for r in ranks] == list(range(16))
    node_of = [r["node"] for r in ranks]
    assert len(set(node_of[:8])) == 1 and len(set(node_of[8:])) == 1 and node_of[0] != node_of[8]
    assert [r["gpu"] for r in ranks] == list(range(8)) * 2

    # Its rank map in the three launcher formats.
    url = f"/api/v1/jobs/{job['id']}/rankmap/"
    a, b = node_of[0], node_of[8]
    openmpi = carol.get(url, {"format": "openmpi"})
    assert openmpi["Content-Type"].startswith("text/plain")
    lines = [line for line in openmpi.content.decode().splitlines() if not line.startswith("#")]
    # Every rank gets the rendezvous the node agents would give it: rank 0's node and the port
    # stored with rank 0.
    port = carol.get(url).json()["master_port"]
    assert 20000 <= port <= 29999
    assert lines == [
        f"-np 1 --host {a if r < 8 else b} -x CUDA_VISIBLE_DEVICES={r % 8}"
        f" -x MASTER_ADDR={a} -x MASTER_PORT={port} -x NCCL_IB_HCA==mlx5_0 python train.py"
        for r in range(16)
    ]
    slurm = carol.get(url, {"format": "slurm"})
    assert slurm["Content-Type"].startswith("text/x-shellscript")
    assert "srun --ntasks=16 --distribution=arbitrary" in slurm.content.decode()
    hostfile = carol.get(url, {"format": "slurm-hostfile"}).content.decode()
    assert hostfile.splitlines() == [a] * 8 + [b] * 8
    torchrun = carol.get(url, {"format": "torchrun"}).content.decode()
    commands = [
        shlex.split(line)[1:] for line in torchrun.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES")
    ]
    assert [c[1:6] for c in commands] == [
        [
            "--nnodes=2",
            f"--node-rank={i}",
            "--nproc-per-node=8",
            f"--master-addr={a}",
            f"--master-port={port}",
        ]
        for i in range(2)
    ]
    assert "R=(8 9 10 11 12 13 14 15)" in commands[1][commands[1].index("-c") + 1]
    assert "#   local rank 3 -> rank 11: GPU 3 (cuda:3) NCCL_IB_HCA==mlx5_0" in torchrun

    # A second 16-GPU job waits, with a reason.
    created = committed(carol.post, "/api/v1/jobs/", job_spec(name="bert-second"), format="json")
    assert created.status_code == 201
    second = carol.get(f"/api/v1/jobs/{created.json()['id']}/").json()
    assert second["status"] == "queued"
    assert second["pending_reason"].startswith("needs 16 GPUs, 0 free")
    assert f"when job {job['id']} is expected to end" in second["pending_reason"]

    # The launcher reports the first job's life; the second starts when it completes.
    assert committed(launcher.post, f"/api/v1/jobs/{job['id']}/start/").json()["status"] == "running"
    done = committed(launcher.post, f"/api/v1/jobs/{job['id']}/complete/")
    assert done.status_code == 200 and done.json()["status"] == "completed"
    after = carol.get(f"/api/v1/jobs/{second['id']}/").json()
    assert after["status"] == "placing" and after["pending_reason"] == ""

    # Another user sees neither job.
    dave = client_with(f"Token {command_output('drf_create_token', make_user('dave').username).split()[2]}")
    assert dave.get("/api/v1/jobs/").json()["count"] == 0
    for jid in (job["id"], second["id"]):
        assert dave.get(f"/api/v1/jobs/{jid}/").status_code == 404
        assert dave.get(f"/api/v1/jobs/{jid}/rankmap/", {"format": "openmpi"}).status_code == 404
        assert dave.post(f"/api/v1/jobs/{jid}/cancel/").status_code == 404


def test_placement_endpoint_returns_the_placement_output_format(case44, alice_api, job_spec, committed):
    created = committed(alice_api.post, "/api/v1/jobs/", job_spec(), format="json").json()
    out = alice_api.get(f"/api/v1/jobs/{created['id']}/placement/").json()
    assert set(out) == {"job", "policy", "ranks", "predicted"}
    assert out["job"] == "bert-large-16" and out["policy"] == "topo"
    assert [r["rank"] for r in out["ranks"]] == list(range(16))
    assert out["predicted"]["step_ms"] == pytest.approx(102.67, abs=0.01)
    dp = [g for g in out["predicted"]["groups"] if g["group"] == "dp"]
    assert [g["ranks"] for g in dp] == [list(range(8)), list(range(8, 16))]
    assert {g["level"] for g in dp} == {"nvlink"}


def test_json_rankmap_is_the_default(case44, alice_api, job_spec, committed):
    created = committed(alice_api.post, "/api/v1/jobs/", job_spec(), format="json").json()
    body = alice_api.get(f"/api/v1/jobs/{created['id']}/rankmap/")
    assert body["Content-Type"] == "application/json"
    data = json.loads(body.content)
    assert data["world_size"] == 16 and len(data["nodes"]) == 2
    assert data["ranks"][9]["env"] == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "LOCAL_RANK": "1",
        "NCCL_IB_HCA": "=mlx5_0",
    }
