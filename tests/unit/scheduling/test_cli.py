"""The user CLI against the app in-process (httpx's WSGI transport): commands, output, exit codes."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from rest_framework.authtoken.models import Token

from apps.cli import commands
from apps.cli.__main__ import main
from apps.scheduling import services
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.models import Job, NodeAgent

from .conftest import small_spec


@pytest.fixture
def cli(case44, alice, monkeypatch, capsys):
    monkeypatch.setenv("TOPOWEB_TOKEN", Token.objects.create(user=alice).key)
    monkeypatch.setenv("TOPOWEB_SERVER", "http://testserver")
    transport = httpx.WSGITransport(app=get_wsgi_application())

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv), transport=transport)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def spec_file(tmp_path, **extra) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(small_spec("cli-job", 8, command=["python", "-c", "pass"], **extra)))
    return str(path)


def test_submit_prints_the_job_and_status_reads_it_back(cli, tmp_path, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        code, out, _ = cli("--json", "submit", spec_file(tmp_path))
    assert code == 0
    job = json.loads(out)
    assert job["name"] == "cli-job" and job["status"] in ("queued", "placing")
    code, out, _ = cli("status", str(job["id"]))
    assert code == 0 and "cli-job" in out and out.splitlines()[0].startswith("ID")


def test_submit_wait_exits_1_when_the_job_does_not_complete(cli, tmp_path, monkeypatch, alice):
    def cancel_it(_seconds):
        # Someone cancels the job while the CLI waits (the cycle has not placed it here).
        services.job_cancel(job=Job.objects.get(name="cli-job"), user=alice)

    monkeypatch.setattr(commands.time, "sleep", cancel_it)
    code, out, err = cli("submit", spec_file(tmp_path), "--wait", "--poll-s", "0")
    assert code == 1
    assert "cancelled" in out and "cancelled by alice" in err


def test_bad_spec_is_exit_2_naming_the_field(cli, tmp_path):
    code, _, err = cli("submit", spec_file(tmp_path, workdir="relative"))
    assert code == 2 and "workdir" in err


def test_missing_token_is_exit_2_and_a_bad_one_exit_3(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("TOPOWEB_TOKEN", "not-a-token")
    code, _, err = cli("queue")
    assert code == 3 and "refused" in err
    monkeypatch.delenv("TOPOWEB_TOKEN")
    code, _, err = cli("--config", str(tmp_path / "none"), "queue")
    assert code == 2 and "TOPOWEB_TOKEN" in err


def test_token_from_the_config_file(cli, monkeypatch, tmp_path, alice):
    monkeypatch.delenv("TOPOWEB_TOKEN")
    config = tmp_path / "config"
    config.write_text(f"[topoweb]\nserver = http://testserver\ntoken = {Token.objects.get(user=alice).key}\n")
    code, out, _ = cli("--config", str(config), "--json", "queue")
    assert code == 0 and json.loads(out) == []


def test_queue_cancel_rankmap_and_logs(cli, tmp_path, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        _, out, _ = cli("--json", "submit", spec_file(tmp_path))
    job_id = json.loads(out)["id"]
    code, out, _ = cli("--json", "queue")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [job_id]
    code, out, _ = cli("rankmap", str(job_id), "--format", "slurm")
    assert code == 0 and "srun --ntasks=8 --distribution=arbitrary" in out
    code, out, _ = cli("logs", str(job_id))
    assert code == 0 and out == ""
    with django_capture_on_commit_callbacks(execute=True):
        code, out, _ = cli("--json", "cancel", str(job_id))
    assert code == 0 and json.loads(out)["status"] == JobStatus.CANCELLED
    code, _, err = cli("cancel", str(job_id))
    assert code == 2 and "cancelled" in err
    code, _, err = cli("status", "999999")
    assert code == 2 and "not found" in err


def test_nodes_and_drain_need_staff(cli, monkeypatch, staff, capsys):
    code, out, _ = cli("nodes")
    assert code == 0 and "node-a" in out and "no_agent" in out
    code, _, err = cli("drain", "node-a", "--reason", "firmware")
    assert code == 3
    monkeypatch.setenv("TOPOWEB_TOKEN", Token.objects.create(user=staff).key)
    code, out, _ = cli("--json", "drain", "node-a", "--reason", "firmware")
    assert code == 0 and json.loads(out)["state"] == NodeState.DRAINED
    assert NodeAgent.objects.get(node__name="node-a").reason == "firmware"
    code, out, _ = cli("nodes", "--state", "drained")
    assert code == 0 and "node-a" in out and "firmware" in out and "node-b" not in out
    code, out, _ = cli("--json", "resume", "node-a")
    # Back in service, but no agent ever reported from it.
    assert code == 0 and json.loads(out)["state"] == "no_agent"
    NodeAgent.objects.filter(node__name="node-a").update(last_seen=timezone.now())
    code, out, _ = cli("--json", "nodes", "--state", "up")
    assert code == 0 and [n["name"] for n in json.loads(out)] == ["node-a"]
    with pytest.raises(SystemExit) as usage:
        cli("nodes", "--state", "sleepy")
    assert usage.value.code == 2 and "--state" in capsys.readouterr().err
    code, _, err = cli("drain", "no-such-node", "--reason", "x")
    assert code == 2 and "no node" in err
