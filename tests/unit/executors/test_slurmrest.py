"""The slurmrestd client's parsing, token minting and the Slurm submission it builds (no Slurm)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from apps.agent.env import plan_env
from apps.executors.slurm.rest import (
    SlurmError,
    SlurmRest,
    gres_gpu_count,
    gres_indexes,
    mint_token,
    parse_job,
    parse_node,
    topology_conf,
)
from apps.executors.slurm.script import (
    RankSlot,
    bind_granted,
    comment,
    parse_comment,
    rank_log_name,
    submission,
)

KEY = bytes(range(32))  # a cluster's jwt_hs256.key: 32 random bytes


@pytest.mark.parametrize(
    ("state", "flags", "health"),
    [
        ("idle", [], "up"),
        ("mixed", [], "up"),
        ("allocated", [], "up"),
        ("idle", ["DRAIN"], "drained"),
        ("mixed", ["DRAIN"], "draining"),
        ("allocated", ["DRAIN"], "draining"),
        ("down", [], "down"),
        ("idle", ["NOT_RESPONDING"], "down"),
        ("down", ["DRAIN"], "down"),
    ],
)
def test_node_state_becomes_health(state, flags, health):
    node = parse_node(
        {"name": "gpu01", "state": state, "state_flags": flags, "reason": "fan", "gres": "gpu:8"}
    )
    assert node.health == health
    assert node.gpus == 8
    assert node.describe.endswith(": fan")


@pytest.mark.parametrize(
    ("gres", "count"),
    [("gpu:8", 8), ("gpu:h100:4(S:0-1)", 4), ("gpu:a:2,gpu:b:3", 5), ("", 0), ("gpu", 1), ("nic:2", 0)],
)
def test_gres_gpu_count(gres, count):
    assert gres_gpu_count(gres) == count


def test_job_record_gives_granted_indexes_per_node_and_exit_code():
    job = parse_job(
        {
            "job_id": 41,
            "het_job_id": 0,
            "name": "train",
            "user_name": "bob",
            "job_state": "FAILED",
            "state_reason": "NonZeroExitCode",
            "exit_code": 3 << 8,
            "nodes": "gpu[02-03]",
            "gres_detail": ["gpu:2(IDX:3-4)", "gpu:h100:3(IDX:0,2,5)"],
            "comment": "",
        }
    )
    assert job.nodes == ("gpu02", "gpu03")
    assert job.gpus == {"gpu02": (3, 4), "gpu03": (0, 2, 5)}
    assert job.exit_code == 3 and job.signal is None
    assert job.group_id == 41
    assert not job.active
    assert gres_indexes("gpu:0(IDX:N/A)") == []


def test_jwt_token_is_hs256_over_the_user_claim():
    token = mint_token(KEY, "alice", ttl_s=60, now=1000)
    head, claims, sig = token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    assert json.loads(base64.urlsafe_b64decode(pad(head)))["alg"] == "HS256"
    assert json.loads(base64.urlsafe_b64decode(pad(claims))) == {"exp": 1060, "iat": 1000, "sun": "alice"}
    # What slurmctld's auth/jwt checks: an HS256 signature with the cluster's key over header.claims.
    want = hmac.new(KEY, f"{head}.{claims}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(pad(sig)) == want
    assert (
        base64.urlsafe_b64decode(pad(mint_token(b"x" * 32, "alice", ttl_s=60, now=1000).split(".")[2]))
        != want
    )
    # Short-lived: five minutes by default, never more than an hour.
    fresh = json.loads(base64.urlsafe_b64decode(pad(mint_token(KEY, "bob").split(".")[1])))
    assert fresh["exp"] - fresh["iat"] == 300 and abs(fresh["iat"] - time.time()) < 60
    for bad in (
        {"key": b"", "user": "alice"},
        {"key": KEY, "user": ""},
        {"key": KEY, "user": "alice", "ttl_s": 0},
        {"key": KEY, "user": "alice", "ttl_s": 3601},
    ):
        with pytest.raises(ValueError):
            mint_token(**bad)


class _Handler(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append((self.path, dict(self.headers), body))
        if body.get("job", {}).get("name") == "refused":
            out = {"errors": [{"error_code": 2014, "error": "Requested node configuration is not available"}]}
        else:
            out = {"job_id": 77, "errors": [{"error_code": 2042, "error": "Job is held"}]}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_client_sends_a_minted_token_per_user_and_reports_refusals():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = SlurmRest(f"http://127.0.0.1:{server.server_port}", user="topoweb", jwt_key=KEY)
        assert client.submit({"job": {"name": "ok"}, "script": "#!/bin/sh\n"}, user="alice") == 77
        path, headers, _ = _Handler.seen[-1]
        assert path == "/slurm/v0.0.38/job/submit"
        assert headers["X-SLURM-USER-NAME"] == "alice"
        assert headers["X-SLURM-USER-TOKEN"].count(".") == 2
        with pytest.raises(SlurmError, match="node configuration is not available"):
            client.submit({"job": {"name": "refused"}, "script": "#!/bin/sh\n"})
        token_only = SlurmRest(f"http://127.0.0.1:{server.server_port}", user="topoweb", token="t")
        with pytest.raises(SlurmError, match="no JWT key"):
            token_only.submit({"job": {"name": "ok"}, "script": ""}, user="alice")
    finally:
        server.shutdown()
    with pytest.raises(SlurmError, match="unreachable"):
        SlurmRest("unix:/nonexistent/slurmrestd.sock").ping()
    with pytest.raises(ValueError):
        SlurmRest("ftp://x")


def test_bind_granted_keeps_plan_or_maps_in_planned_order():
    assert bind_granted([3, 1], [1, 3, 5]) == [3, 1]
    assert bind_granted([3, 1], [0, 1]) == [1, 0]
    assert bind_granted([7, 2, 5], [0, 1, 2]) == [2, 0, 1]
    with pytest.raises(ValueError):
        bind_granted([0, 1], [4])


def test_comment_round_trip():
    assert parse_comment(comment("pod", 12, 3, "9f3a")) == ("pod", 12, 3, "9f3a")
    assert comment("pod", 12, 3, "9f3a") == "topoweb:pod:12:3:9f3a"
    # A comment written before servers were named.
    assert parse_comment("topoweb:pod:12:3") == ("pod", 12, 3, "")
    assert parse_comment("something else") is None
    assert parse_comment("topoweb:pod:x:1") is None
    assert parse_comment("topoweb:pod:1:1:") is None
    assert parse_comment("topoweb:pod:1:1:a:b") is None


def test_job_record_gives_restarts_and_liveness():
    base = {"job_id": 7, "het_job_id": 6, "job_state": "PENDING", "nodes": "", "comment": ""}
    pending = parse_job({**base, "restart_cnt": 1})
    assert pending.restarts == 1 and pending.requeued and pending.live
    assert not parse_job(base).requeued
    assert parse_job({**base, "job_state": "REQUEUE_HOLD"}).requeued
    assert parse_job({**base, "job_state": "COMPLETING"}).live
    assert not parse_job({**base, "job_state": "NODE_FAIL"}).live


def test_topology_conf_from_scontrol_output():
    text = (
        "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[01-04]\n"
        "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu[01-04] Switches=leaf1\n"
    )
    assert (
        topology_conf(text)
        == "SwitchName=leaf1 LinkSpeed=1 Nodes=gpu[01-04]\nSwitchName=spine LinkSpeed=1 Switches=leaf1\n"
    )


NODES = [f"gpu{i:02d}" for i in range(1, 9)]


# Where the wrappers run by these tests write each rank's output (`_run_wrapper` reads it back).
RANK_LOGS = Path(tempfile.mkdtemp(prefix="topoweb-wrapper-test-"))


def _body(slots, command=("python", "train.py", "--name", "it's $HOME; `x`"), env=None, log_dir=RANK_LOGS):
    return submission(
        log_dir=str(log_dir),
        cluster="pod",
        job_id=5,
        generation=2,
        name="j",
        slots=slots,
        command=list(command),
        env=env or {"A": "x y"},
        workdir="/tmp",
        master_addr="10.0.0.1",
        master_port=20001,
        all_nodes=NODES,
        server="a1b2",
    )


def test_submission_pins_one_component_per_node_with_its_gpu_count():
    slots = [
        RankSlot(0, "gpu03", 4, "mlx5_0"),
        RankSlot(1, "gpu07", 0),
        RankSlot(2, "gpu03", 5),
        RankSlot(3, "gpu03", 6),
    ]
    body = _body(slots)
    first, second = body["jobs"]
    assert (first["tasks"], first["gres"], first["nodes"]) == (3, "gpu:3", "1")
    assert first["exclude_nodes"] == "gpu[01-02,04-08]"
    assert first["comment"] == second["comment"] == "topoweb:pod:5:2:a1b2"
    # v0.0.38 reads "requeue": false as --requeue; only no_requeue turns it off.
    assert first["no_requeue"] is second["no_requeue"] is True
    assert "requeue" not in first and "requeue" not in second
    assert (second["tasks"], second["gres"], second["exclude_nodes"]) == (1, "gpu:1", "gpu[01-06,08]")
    assert "--het-group=0" in body["script"] and "--het-group=1" in body["script"]
    single = _body([RankSlot(0, "gpu02", 1), RankSlot(1, "gpu02", 0)])
    assert single["job"]["tasks"] == 2 and "het-group" not in single["script"]


def _run_wrapper(body, node, localid, granted, visible=None, check=True):
    """Run the script's task wrapper for one task as srun would start it (Slurm's SLURM_STEP_GPUS =
    `granted` and CUDA_VISIBLE_DEVICES = `visible`, by default the same), with a command that
    prints its environment."""
    script = body["script"]
    env = {
        **(body.get("job") or body["jobs"][0])["environment"],
        "PATH": os.environ["PATH"],
        "SLURMD_NODENAME": node,
        "SLURM_LOCALID": str(localid),
        "SLURM_STEP_GPUS": granted,
        "CUDA_VISIBLE_DEVICES": granted if visible is None else visible,
        "GPU_DEVICE_ORDINAL": granted,
    }
    # Replace the srun line by running the wrapper text as one task would.
    lines = [ln for ln in script.splitlines() if not ln.startswith("srun")]
    lines.append('bash -c "$W" topoweb-rank')
    out = subprocess.run(
        ["bash", "-c", "\n".join(lines)], env=env, capture_output=True, text=True, check=check
    )
    # The rank's output went to its rank log (stdout and stderr both), read here as both.
    logged = ""
    for path in sorted(RANK_LOGS.glob("topoweb-5-2-rank*.out")):
        logged += path.read_text()
        path.unlink()
    out = subprocess.CompletedProcess(out.args, out.returncode, out.stdout + logged, out.stderr + logged)
    if not check:
        return out
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


SLOTS = [
    RankSlot(0, "gpu03", 5, "mlx5_0"),
    RankSlot(1, "gpu07", 0),
    RankSlot(2, "gpu03", 4),
    RankSlot(3, "gpu03", 7),
]


def test_wrapper_exports_the_agents_launch_contract_on_every_rank():
    body = _body(SLOTS, command=("sh", "-c", 'env; echo ARG="$0"', "it's $HOME; `x`"))
    work = {
        "job": 5,
        "generation": 2,
        "world_size": 4,
        "master_addr": "10.0.0.1",
        "master_port": 20001,
        "ranks": [{"rank": s.rank, "node": s.node, "gpu": s.gpu, "nic": s.nic} for s in SLOTS],
    }
    for node_rank, node, granted in ((0, "gpu03", "4,5,7"), (1, "gpu07", "0")):
        for plan in plan_env({**work, "node_rank": node_rank}, node):
            env = _run_wrapper(body, node, plan.local_rank, granted)
            # Exactly what the node agent gives the rank (its planned env), and the job's own env.
            assert {k: env.get(k) for k in plan.env} == plan.env
            assert env["A"] == "x y" and env["ARG"] == "it's $HOME; `x`"
            assert "GPU_DEVICE_ORDINAL" not in env
    rank3 = _run_wrapper(body, "gpu03", 2, "4,5,7")
    assert (rank3["RANK"], rank3["LOCAL_RANK"], rank3["LOCAL_WORLD_SIZE"], rank3["NODE_RANK"]) == (
        "3",
        "2",
        "3",
        "0",
    )
    # The node's job GPUs in local-rank order: LOCAL_RANK indexes the rank's planned GPU.
    assert rank3["CUDA_VISIBLE_DEVICES"] == "5,4,7"
    assert rank3["CUDA_VISIBLE_DEVICES"].split(",")[2] == "7"
    assert rank3["MASTER_ADDR"] == "10.0.0.1" and rank3["MASTER_PORT"] == "20001"
    assert _run_wrapper(body, "gpu03", 0, "4,5,7")["NCCL_IB_HCA"] == "=mlx5_0"


def test_wrapper_names_gpus_as_slurm_exposes_them_under_constrain_devices():
    body = _body(SLOTS, command=("env",))
    # task/cgroup + ConstrainDevices: the step sees its granted GPUs 4, 5, 7 as devices 0, 1, 2.
    env = _run_wrapper(body, "gpu03", 1, "4,5,7", visible="0,1,2")
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0,2" and env["TOPOWEB_SLURM_GRANTED_GPUS"] == "4,5,7"
    assert _run_wrapper(body, "gpu07", 0, "0", visible="0")["CUDA_VISIBLE_DEVICES"] == "0"
    # Slurm granted other GPUs than planned: the ranks take them in planned order (bind_granted).
    assert bind_granted([5, 4, 7], [1, 2, 3]) == [2, 1, 3]
    assert _run_wrapper(body, "gpu03", 0, "1,2,3")["CUDA_VISIBLE_DEVICES"] == "2,1,3"
    assert _run_wrapper(body, "gpu03", 0, "1,2,3", visible="0,1,2")["CUDA_VISIBLE_DEVICES"] == "1,0,2"
    short = _run_wrapper(body, "gpu03", 0, "1,2", check=False)
    assert short.returncode == 98 and "granted GPUs 1,2 for planned GPUs 5,4,7" in short.stderr
    stray = _run_wrapper(body, "gpu05", 0, "0", check=False)
    assert stray.returncode == 97 and "no rank planned" in stray.stderr


def test_wrapper_quotes_every_value(tmp_path):
    hostile = f"$(touch {tmp_path}/pwned); `touch {tmp_path}/pwned`'\"\n"
    body = _body(
        [RankSlot(0, "gpu01", 0, hostile)], command=("printf", "%s|", hostile, "*"), env={"B": hostile}
    )
    out = _run_wrapper(body, "gpu01", 0, "0", check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{hostile}|*|"
    assert not (tmp_path / "pwned").exists()


def test_each_rank_writes_its_output_to_its_own_log_or_else_to_slurms(tmp_path):
    """Rank 1 (gpu07's only task) writes stdout and stderr, in order, to topoweb-5-2-rank1.out in
    the log directory; a directory it cannot write leaves its output to Slurm's file, with why."""
    command = ("sh", "-c", "echo out $RANK; echo err $RANK >&2; echo end")
    body = _body(SLOTS, command=command, log_dir=tmp_path)
    out = _run_wrapper(body, "gpu07", 0, "0", check=False)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == "", out
    assert (tmp_path / rank_log_name(5, 2, 1)).read_text() == "out 1\nerr 1\nend\n"
    assert [p.name for p in tmp_path.iterdir()] == ["topoweb-5-2-rank1.out"]
    missing = tmp_path / "not-there"
    out = _run_wrapper(_body(SLOTS, command=command, log_dir=missing), "gpu03", 2, "4,5,7", check=False)
    assert out.returncode == 0 and out.stdout == "out 3\nend\n", out
    assert f"cannot write {missing}/topoweb-5-2-rank3.out" in out.stderr and "err 3" in out.stderr


def test_submission_refuses_bad_input():
    with pytest.raises(ValueError, match="not in the Slurm cluster"):
        _body([RankSlot(0, "gpu99", 0)])
    with pytest.raises(ValueError, match="environment variable name"):
        _body([RankSlot(0, "gpu01", 0)], env={"BAD NAME": "x"})
    with pytest.raises(ValueError, match="ranks must be"):
        _body([RankSlot(1, "gpu01", 0)])


def test_granted_map_keeps_every_rank_on_its_node():
    from apps.executors.slurm.script import granted_map

    # tp4 x dp2 planned on two nodes, each TP group in one node; Slurm granted other indexes.
    planned = [(r, "a" if r < 4 else "b", r % 4) for r in range(8)]
    got = granted_map(planned, {"a": [4, 5, 6, 7], "b": [0, 2, 4, 6]})
    assert got == {
        0: ("a", 4),
        1: ("a", 5),
        2: ("a", 6),
        3: ("a", 7),
        4: ("b", 0),
        5: ("b", 2),
        6: ("b", 4),
        7: ("b", 6),
    }
    for group in ([0, 1, 2, 3], [4, 5, 6, 7]):
        assert len({got[r][0] for r in group}) == 1
    assert granted_map(planned, {"a": [0, 1, 2, 3]}) is None  # no record of b's GPUs
    assert granted_map(planned, {"a": [0, 1, 2, 3], "b": [1]}) is None


def test_gres_types_become_gpu_models_and_their_peaks():
    from apps.executors.slurm.rest import gres_gpu_type, node_conf, parse_node
    from apps.placement.convert import Source
    from apps.topology.conversion import spec_from_format

    assert gres_gpu_type("gpu:h100:8(S:0-1)") == "h100"
    assert gres_gpu_type("gpu:8") == "" and gres_gpu_type("gpu:a100:4,gpu:h100:4") == ""
    nodes = [
        parse_node({"name": "h1", "gres": "gpu:h100:8(S:0-1)"}),
        parse_node({"name": "a1", "gres": "gpu:a100:8"}),
        parse_node({"name": "x1", "gres": "gpu:4"}),
    ]
    conf = node_conf(nodes)
    assert "NodeName=h1 Gres=gpu:h100:8" in conf and "NodeName=x1 Gres=gpu:4" in conf
    spec, _ = spec_from_format(
        fmt="slurm-tree",
        sources=[Source("topology", "SwitchName=leaf Nodes=h1,a1,x1\n"), Source("nodes", conf)],
        defaults={"name": "typed"},
    )
    models = {n["name"]: n["gpu_model"] for n in spec["nodes"]}
    assert models == {"h1": "H100-SXM5-80GB", "a1": "A100-SXM4-80GB", "x1": "H100-SXM5-80GB"}
    assert spec["gpu_models"]["A100-SXM4-80GB"]["peak_tflops"] == 312.0
    assert spec["gpu_models"]["H100-SXM5-80GB"]["peak_tflops"] == 989.0
