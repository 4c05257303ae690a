"""The CLI's commands: small functions over the API client, a table for people, --json for scripts."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .client import Api, CliError

MAX_SPEC_BYTES = 1 << 20
# Exit codes: 0 done (completed), 1 the job failed or was cancelled, 2 bad input or a refused
# request, 3 server unreachable or credentials refused, 4 `--timeout-s` passed with the job still
# unfinished, 130 interrupted (Ctrl-C).
EXIT_TIMEOUT = 4
LOG_PAGE_BYTES = 1024 * 1024
EXIT_INTERRUPTED = 130
FINISHED = {"completed": 0, "failed": 1, "cancelled": 1}
JOB_COLUMNS = ("id", "name", "status", "gpus", "priority", "cluster_name", "owner", "pending_reason")
NODE_COLUMNS = ("name", "cluster_name", "state", "since", "reason", "running", "unhealthy_gpus", "last_seen")
CELL_MAX = 60  # a table cell's width; one job's status prints its whole reasons below the table
RANKMAP_FORMATS = ("openmpi", "slurm", "slurm-hostfile", "torchrun", "json")


def table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """A plain text table; long cells are cut at CELL_MAX characters."""

    def cell(value: Any) -> str:
        text = "" if value is None else (json.dumps(value) if isinstance(value, (list, dict)) else str(value))
        text = text.replace("\n", " ")
        return text if len(text) <= CELL_MAX else text[: CELL_MAX - 3] + "..."

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def emit(data: Any, as_json: bool, columns: tuple[str, ...] | None = None) -> None:
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    elif columns is not None:
        print(table(data if isinstance(data, list) else [data], columns))
    else:
        print(data)


def read_spec(path: str) -> bytes:
    """A job spec file (YAML or JSON) as it is, at most 1 MiB. The server parses it with its own
    loader, so the CLI reads a spec exactly as the API does (`2.6e14` is a number there, where
    YAML 1.1 would make it a string)."""
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise CliError(f"{path}: {size} bytes; a job spec is at most {MAX_SPEC_BYTES} bytes")
        return file.read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: {exc}") from exc


def with_gpu_models(path: str, content: bytes, models: str) -> bytes:
    """The spec as JSON with `gpu_models` set to the comma-separated `models`, read by the loader
    the server uses (so the rest of the spec reaches it as the file says); the server checks the
    names against the cluster's models."""
    from apps.placement.topology import JOB_LIMITS, SpecError, parse_spec_text

    names = [m.strip() for m in models.split(",")]
    if not models.strip() or not all(names):
        raise CliError(f"--gpu-models: a comma-separated list of GPU model names, got {models!r}")
    try:
        data = parse_spec_text(content, JOB_LIMITS)
    except SpecError as exc:
        raise CliError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CliError(f"{path}: a job spec is a mapping, got {type(data).__name__}")
    data["gpu_models"] = names
    return json.dumps(data).encode()


class WaitTimeout(CliError):
    """`--timeout-s` passed while the job was still unfinished (exit code EXIT_TIMEOUT)."""

    def __init__(self, message: str):
        super().__init__(message, code=EXIT_TIMEOUT)


def wait_job(api: Api, job_id: int, *, poll_s: float = 2.0, timeout_s: float | None = None) -> dict:
    """Poll the job until it is finished, showing its status on stderr; returns the job."""
    t0 = time.monotonic()
    last = ""
    tty = sys.stderr.isatty()
    while True:
        job = api.json("GET", f"jobs/{job_id}/")
        line = f"job {job_id} {job['status']} ({time.monotonic() - t0:.0f} s)"
        if job.get("pending_reason") and job["status"] in ("queued", "preempted", "migrating"):
            line += f": {job['pending_reason'][:80]}"
        if tty:
            print(f"\r{line:<120}", end="", file=sys.stderr, flush=True)
        elif job["status"] != last:
            print(line, file=sys.stderr, flush=True)
        last = job["status"]
        if job["status"] in FINISHED:
            if tty:
                print(file=sys.stderr)
            return job
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            if tty:
                print(file=sys.stderr)
            raise WaitTimeout(f"job {job_id} still {job['status']} after {timeout_s:.0f} s; it keeps running")
        time.sleep(poll_s)


def submit(api: Api, args) -> int:
    params = {"cluster": args.cluster} if args.cluster else None
    content, content_type = read_spec(args.file), "application/yaml"
    if getattr(args, "gpu_models", None) is not None:
        content, content_type = with_gpu_models(args.file, content, args.gpu_models), "application/json"
    job = api.json(
        "POST",
        "jobs/",
        content=content,
        # A retry of this submission (a busy server's 503 or 429) returns the job it queued.
        headers={"Content-Type": content_type, "Idempotency-Key": f"cli-{uuid.uuid4().hex}"},
        params=params,
    )
    if not args.wait:
        emit(job, args.json, JOB_COLUMNS)
        return 0
    print(f"submitted job {job['id']} ({job['name']})", file=sys.stderr)
    try:
        job = wait_job(api, job["id"], poll_s=args.poll_s, timeout_s=args.timeout_s)
    except KeyboardInterrupt:
        return interrupted(api, job["id"])
    emit(job, args.json, JOB_COLUMNS)
    if job["status"] != "completed" and job.get("pending_reason"):
        print(job["pending_reason"], file=sys.stderr)
    return FINISHED[job["status"]]


def interrupted(api: Api, job_id: int) -> int:
    """Ctrl-C while waiting: the job runs on; at a terminal, offer to cancel it."""
    print(file=sys.stderr)
    answer = ""
    if sys.stdin.isatty():
        try:
            answer = input(f"stopped waiting. Cancel job {job_id} too? [y/N] ").strip().lower()
        except (KeyboardInterrupt, EOFError):
            print(file=sys.stderr)
    if answer in ("y", "yes"):
        job = api.json("POST", f"jobs/{job_id}/cancel/")
        print(f"job {job_id} {job['status']}", file=sys.stderr)
    else:
        print(
            f"job {job_id} keeps running: `topoweb status {job_id}` follows it,"
            f" `topoweb cancel {job_id}` stops it",
            file=sys.stderr,
        )
    return EXIT_INTERRUPTED


def status(api: Api, args) -> int:
    if args.job is None:
        emit(api.pages("jobs/", {"ordering": "-submitted_at"}, limit=args.limit), args.json, JOB_COLUMNS)
        return 0
    job = api.json("GET", f"jobs/{args.job}/")
    emit(job, args.json, JOB_COLUMNS)
    reason = str(job.get("pending_reason") or "").replace("\n", " ")
    if not args.json and len(reason) > CELL_MAX:
        print(f"reason: {reason}")
    if not args.json and job.get("requeue_reason"):
        print(f"last requeued {job['requeued_at']}: {job['requeue_reason']}")
    return 1 if job["status"] in ("failed", "cancelled") else 0


def queue(api: Api, args) -> int:
    params: dict[str, Any] = {"status": ["queued", "preempted", "placing", "running", "migrating"]}
    if args.cluster:
        params["cluster"] = args.cluster
    emit(api.pages("jobs/", params, limit=args.limit), args.json, JOB_COLUMNS)
    return 0


def cancel(api: Api, args) -> int:
    emit(api.json("POST", f"jobs/{args.job}/cancel/"), args.json, JOB_COLUMNS)
    return 0


def rank_log(api: Api, job: int, rank: int, generation: int | None, out=None) -> int:
    """Write one rank's whole stored output to `out` (stdout), a page at a time; returns bytes."""
    out = out or sys.stdout
    params: dict[str, Any] = {"offset": 0, "limit": LOG_PAGE_BYTES}
    if generation is not None:
        params["generation"] = generation
    total = 0
    while True:
        page = api.json("GET", f"jobs/{job}/logs/{rank}/", params=params)
        out.write(page["text"])
        total += page["next_offset"] - page["offset"]
        if not page["more"] or page["next_offset"] <= params["offset"]:
            break
        params["offset"] = page["next_offset"]
    out.flush()
    if page.get("cut"):
        print(f"topoweb: the server keeps only the first {page['size']} bytes of this log", file=sys.stderr)
    return total


def logs(api: Api, args) -> int:
    """Each rank's output tail; with --rank, that rank's whole output (paged from the server)."""
    params = {k: v for k, v in (("rank", args.rank), ("generation", args.generation)) if v is not None}
    if args.rank is not None and not args.json and not args.tail:
        if rank_log(api, args.job, args.rank, args.generation):
            return 0
        # Nothing shipped in chunks (an older agent): the tail of its reports is all there is.
    runs = api.json("GET", f"jobs/{args.job}/logs/", params=params)
    if args.json:
        emit(runs, True)
        return 0
    for run in runs:
        code = "" if run["exit_code"] is None else f" exit {run['exit_code']}"
        print(f"==> generation {run['generation']} rank {run['rank']} on {run['node']}: {run['state']}{code}")
        print(run["log_tail"].rstrip("\n"))
    return 0


def rankmap(api: Api, args) -> int:
    params = {"format": args.format}
    if args.entrypoint:
        params["entrypoint"] = args.entrypoint
    response = api.call("GET", f"jobs/{args.job}/rankmap/", params=params)
    print(response.text, end="" if response.text.endswith("\n") else "\n")
    return 0


def nodes(api: Api, args) -> int:
    """`topoweb nodes [--cluster C] [--state S]`: the nodes as sinfo lists them."""
    params = {k: v for k, v in (("cluster", args.cluster), ("state", args.state)) if v} or None
    emit(api.pages("node-health/", params), args.json, NODE_COLUMNS)
    return 0


def _node(api: Api, name: str, cluster: str | None) -> dict:
    params = {"node": name, **({"cluster": cluster} if cluster else {})}
    found = api.pages("node-health/", params)
    if not found:
        raise CliError(f"no node {name!r}" + (f" in cluster {cluster!r}" if cluster else ""))
    if len(found) > 1:
        clusters = ", ".join(sorted(n["cluster_name"] for n in found))
        raise CliError(f"node {name!r} is in several clusters ({clusters}): pass --cluster")
    return found[0]


def drain(api: Api, args) -> int:
    node = _node(api, args.node, args.cluster)
    emit(
        api.json("POST", f"node-health/{node['id']}/drain/", json={"reason": args.reason}),
        args.json,
        NODE_COLUMNS,
    )
    return 0


def resume(api: Api, args) -> int:
    node = _node(api, args.node, args.cluster)
    emit(api.json("POST", f"node-health/{node['id']}/resume/"), args.json, NODE_COLUMNS)
    return 0
