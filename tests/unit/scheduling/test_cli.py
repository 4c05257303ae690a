"""The user CLI against the app in-process (httpx's WSGI transport): commands, output, exit codes."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from rest_framework.authtoken.models import Token

from apps.cli import client, commands
from apps.cli.__main__ import main
from apps.scheduling import services
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.models import Job, NodeHealth

from .conftest import EXAMPLES, small_spec


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


def test_status_of_one_job_prints_its_whole_wait_reason(cli, tmp_path, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        _, out, _ = cli("--json", "submit", spec_file(tmp_path))
    job_id = json.loads(out)["id"]
    reason = (
        "waits for 8 free GPUs under one leaf: " + "leaf-1 has 3, leaf-2 has 2, leaf-3 has 0, leaf-4 has 1"
    )
    Job.objects.filter(pk=job_id).update(status=JobStatus.QUEUED, pending_reason=reason)
    code, out, _ = cli("status", str(job_id))
    assert code == 0 and len(reason) > commands.CELL_MAX
    assert f"reason: {reason}" in out.splitlines()
    code, out, _ = cli("status")  # the list keeps its cells short
    assert reason not in out and reason[: commands.CELL_MAX - 3] + "..." in out


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
    assert NodeHealth.objects.get(node__name="node-a").reason == "firmware"
    code, out, _ = cli("nodes", "--state", "drained")
    assert code == 0 and "node-a" in out and "firmware" in out and "node-b" not in out
    code, out, _ = cli("--json", "resume", "node-a")
    # Back in service, but no agent ever reported from it.
    assert code == 0 and json.loads(out)["state"] == "no_agent"
    NodeHealth.objects.filter(node__name="node-a").update(last_seen=timezone.now())
    code, out, _ = cli("--json", "nodes", "--state", "up")
    assert code == 0 and [n["name"] for n in json.loads(out)] == ["node-a"]
    with pytest.raises(SystemExit) as usage:
        cli("nodes", "--state", "sleepy")
    assert usage.value.code == 2 and "--state" in capsys.readouterr().err
    code, _, err = cli("drain", "no-such-node", "--reason", "x")
    assert code == 2 and "no node" in err


def test_submit_reads_yaml_as_the_server_does(cli, tmp_path, django_capture_on_commit_callbacks):
    # `2.6e14` is a string to YAML 1.1 loaders; the server's loader (and so the CLI) reads a number.
    example = (EXAMPLES / "case-4-4-job.yaml").read_text()
    assert "2.6e14" in example
    path = tmp_path / "case-4-4-job.yaml"
    path.write_text(example)
    with django_capture_on_commit_callbacks(execute=True):
        code, out, err = cli("--json", "submit", str(path))
    assert code == 0, err
    job = Job.objects.get(pk=json.loads(out)["id"])
    assert job.spec["model"]["flops_per_step"] == 2.6e14
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    code, _, err = cli("submit", str(bad))
    assert code == 2 and "refused (400)" in err


def test_submit_gpu_models_constrains_the_job_and_an_unknown_model_is_refused_by_name(
    cli, tmp_path, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        code, out, err = cli("--json", "submit", spec_file(tmp_path), "--gpu-models", "A100-SXM4-80GB")
    assert code == 0, err
    assert Job.objects.get(pk=json.loads(out)["id"]).spec["gpu_models"] == ["A100-SXM4-80GB"]
    code, _, err = cli("submit", spec_file(tmp_path), "--gpu-models", "A100-SXM4-80GB,H100-SXM5-80GB")
    assert code == 2 and "gpu_models[1]" in err and "H100-SXM5-80GB" in err
    code, _, err = cli("submit", spec_file(tmp_path), "--gpu-models", "A100-SXM4-80GB,")
    assert code == 2 and "--gpu-models" in err


def test_a_wait_timeout_has_its_own_exit_code(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(commands.time, "sleep", lambda _s: None)
    code, _, err = cli("submit", spec_file(tmp_path), "--wait", "--poll-s", "0", "--timeout-s", "0")
    assert code == commands.EXIT_TIMEOUT == 4
    assert "still queued" in err and "keeps running" in err
    assert Job.objects.get(name="cli-job").status == JobStatus.QUEUED


@pytest.mark.parametrize(
    ("tty", "answer", "status"), [(False, "", "queued"), (True, "n", "queued"), (True, "y", "cancelled")]
)
def test_ctrl_c_while_waiting_exits_130_and_cancels_only_when_asked_to(
    cli, tmp_path, monkeypatch, tty, answer, status
):
    def interrupt(_seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands.time, "sleep", interrupt)
    monkeypatch.setattr(commands.sys.stdin, "isatty", lambda: tty, raising=False)
    monkeypatch.setattr("builtins.input", lambda _prompt: answer)
    code, _, err = cli("submit", spec_file(tmp_path), "--wait", "--poll-s", "0")
    assert code == commands.EXIT_INTERRUPTED == 130
    assert "Traceback" not in err
    assert Job.objects.get(name="cli-job").status == status
    if status == "queued":
        assert "keeps running" in err and "topoweb cancel" in err


def test_logs_of_one_rank_reads_its_whole_output_page_by_page(cli, tmp_path, alice, monkeypatch, committed):
    from apps.scheduling.models import RankLogChunk, RankRun
    from apps.topology.models import Node

    job = committed(services.job_submit, user=alice, spec=small_spec("cli-job", 8, command=["true"]))
    job.refresh_from_db()
    run = RankRun.objects.create(
        job=job, generation=job.generation, rank=3, node=Node.objects.get(name="node-a")
    )
    lines = [f"step {i}\n" for i in range(300)]
    offset = 0
    for start in range(0, 300, 100):
        text = "".join(lines[start : start + 100])
        RankLogChunk.objects.create(run=run, offset=offset, size=len(text), text=text)
        offset += len(text)
    pages = []
    real = commands.Api.json

    def counting(self, method, path, **kwargs):
        pages.append(path)
        return real(self, method, path, **kwargs)

    monkeypatch.setattr(commands, "LOG_PAGE_BYTES", 1000)
    monkeypatch.setattr(commands.Api, "json", counting)
    code, out, err = cli("logs", str(job.pk), "--rank", "3")
    assert code == 0 and out == "".join(lines), err
    assert len(pages) == 3
    RankRun.objects.filter(pk=run.pk).update(log_tail="the tail\n")
    code, out, _ = cli("logs", str(job.pk), "--rank", "3", "--tail")
    assert code == 0 and "the tail" in out and "step 0\n" not in out


class Busy(httpx.BaseTransport):
    """The app behind a server that answers the first `times` requests 503 with `retry_after`;
    `lost=True` passes those requests on to the app and loses its answer (a proxy's timeout)."""

    def __init__(self, times: int, retry_after: str = "2", lost: bool = False):
        self.app = httpx.WSGITransport(app=get_wsgi_application())
        self.times, self.retry_after, self.lost = times, retry_after, lost
        self.seen: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if len(self.seen) > self.times:
            return self.app.handle_request(request)
        if self.lost:
            self.app.handle_request(request).read()
        return httpx.Response(503, headers={"Retry-After": self.retry_after}, json={"detail": "busy"})


@pytest.fixture
def busy_cli(case44, alice, monkeypatch, capsys):
    monkeypatch.setenv("TOPOWEB_TOKEN", Token.objects.create(user=alice).key)
    monkeypatch.setenv("TOPOWEB_SERVER", "http://testserver")
    slept: list[float] = []
    monkeypatch.setattr(client.time, "sleep", slept.append)

    def run(transport: Busy, *argv: str) -> tuple[int, str, str, list[float]]:
        code = main(list(argv), transport=transport)
        out, err = capsys.readouterr()
        return code, out, err, slept

    return run


def test_a_submission_answered_503_is_retried_with_its_key_and_queued_once(busy_cli, tmp_path):
    server = Busy(2, lost=True)
    code, out, _, slept = busy_cli(server, "--json", "submit", spec_file(tmp_path))
    assert code == 0 and slept == [2.0, 2.0]
    keys = {r.headers["Idempotency-Key"] for r in server.seen}
    assert len(server.seen) == 3 and len(keys) == 1
    assert Job.objects.filter(name="cli-job").count() == 1
    assert json.loads(out)["id"] == Job.objects.get(name="cli-job").pk


def test_a_write_without_a_key_is_not_retried(busy_cli, alice):
    job = services.job_submit(user=alice, spec=small_spec("q", 16))
    server = Busy(1)
    code, _, err, slept = busy_cli(server, "cancel", str(job.pk))
    assert code == 2 and "refused (503)" in err and slept == [] and len(server.seen) == 1


def test_a_server_busy_for_too_long_is_reported_after_the_capped_waits(busy_cli):
    server = Busy(100, retry_after="3600")
    code, _, err, slept = busy_cli(server, "status")
    assert code == 2 and "refused (503): busy" in err
    assert slept == [client.RETRY_AFTER_MAX_S] * int(client.RETRY_WAIT_MAX_S // client.RETRY_AFTER_MAX_S)
    # Without a usable Retry-After the answer is reported at once.
    server = Busy(1, retry_after="soon")
    code, _, err, slept = busy_cli(server, "status")
    assert code == 2 and len(server.seen) == 1
