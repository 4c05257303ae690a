"""A client of slurmrestd's OpenAPI v0.0.38 (Slurm 22.05) and the parsing of what it returns.

No Django here: the client takes a URL (`unix:/path/to/socket` or `http://host:port`) and, for
`rest_auth/jwt`, a user name with either a token or the cluster's JWT key (HS256) from which a
short-lived token is minted per user, as `scontrol token username=` does. With `rest_auth/local`
on a unix socket no header is sent: slurmrestd acts as its own user.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import jwt

from apps.placement.convert.hostlist import HostlistError, expand

API = "/slurm/v0.0.38"
TOKEN_TTL_S = 300  # each call mints its own token: five minutes covers one call and clock skew
MAX_TOKEN_TTL_S = 3600


class SlurmError(Exception):
    """slurmrestd could not be reached, or it answered with errors (`errors`: its error entries)."""

    def __init__(self, message: str, errors: Sequence[Mapping[str, Any]] = ()):
        super().__init__(message)
        self.errors = list(errors)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def mint_token(key: bytes, user: str, *, ttl_s: int = TOKEN_TTL_S, now: float | None = None) -> str:
    """A Slurm JWT (HS256, claims `sun` = user name, `iat`, `exp`) valid for `ttl_s` seconds,
    signed with the cluster's `jwt_hs256.key`: what `scontrol token username=USER lifespan=TTL`
    prints. Slurm's auth/jwt runs the job as `sun`, so whoever holds the key acts as any user."""
    if not key:
        raise ValueError("an empty JWT key signs nothing")
    if not user:
        raise ValueError("a Slurm token names a user")
    if not 1 <= ttl_s <= MAX_TOKEN_TTL_S:
        raise ValueError(f"token lifetime must be 1..{MAX_TOKEN_TTL_S} s, got {ttl_s}")
    issued = int(time.time() if now is None else now)
    claims = {"exp": issued + ttl_s, "iat": issued, "sun": user}
    return jwt.encode(claims, key, algorithm="HS256")


class SlurmRest:
    """slurmrestd at `url`. `user`/`token` or `user`/`jwt_key`: the rest_auth/jwt identity used
    when a call names no other user; a call's `user` needs `jwt_key` (a token is one user's)."""

    def __init__(
        self, url: str, *, user: str = "", token: str = "", jwt_key: bytes = b"", timeout: float = 15.0
    ):
        if url.startswith("unix:"):
            self._unix = url[len("unix:") :]
            self._host = ""
        else:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"slurmrestd URL must be unix:/path or http(s)://host:port, got {url!r}")
            self._unix = ""
            self._host = url
        self.url = url
        self.user = user
        self.token = token
        self.jwt_key = jwt_key
        self.timeout = timeout

    def _headers(self, user: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        name = user or self.user
        if not name:
            return headers
        if self.jwt_key:
            headers["X-SLURM-USER-NAME"] = name
            headers["X-SLURM-USER-TOKEN"] = mint_token(self.jwt_key, name)
        elif self.token and (user is None or user == self.user):
            headers["X-SLURM-USER-NAME"] = name
            headers["X-SLURM-USER-TOKEN"] = self.token
        elif user and user != self.user:
            raise SlurmError(f"cannot act as Slurm user {user!r}: no JWT key to mint a token with")
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        if self._unix:
            return _UnixConnection(self._unix, self.timeout)
        parts = urlsplit(self._host)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=self.timeout)

    def request(self, method: str, path: str, body: Any = None, *, user: str | None = None) -> dict[str, Any]:
        """One call; returns the decoded JSON. SlurmError when unreachable, on a non-JSON answer,
        or when the answer has errors and no job id."""
        conn = self._connection()
        payload = None if body is None else json.dumps(body).encode()
        try:
            conn.request(method, API + path, body=payload, headers=self._headers(user))
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as exc:
            raise SlurmError(f"slurmrestd at {self.url} unreachable: {exc}") from exc
        finally:
            conn.close()
        try:
            data = json.loads(raw or b"{}")
        except ValueError as exc:
            if resp.status == 401:
                raise SlurmError(
                    f"slurmrestd at {self.url} refused the credentials (HTTP 401, {raw[:100].decode(errors='replace')}):"
                    " under rest_auth/jwt TopoWeb needs a Slurm user with its token or the cluster's JWT key"
                ) from exc
            raise SlurmError(f"slurmrestd answered HTTP {resp.status} without JSON: {raw[:200]!r}") from exc
        errors = [e for e in data.get("errors") or () if e.get("error_code") != 0 or e.get("error")]
        if errors and data.get("job_id") is None:
            raise SlurmError(error_text(errors) or f"HTTP {resp.status}", errors)
        if resp.status >= 400 and data.get("job_id") is None:
            raise SlurmError(f"slurmrestd answered HTTP {resp.status}", errors)
        return data

    def ping(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/ping").get("pings") or ())

    def nodes(self) -> list[SlurmNode]:
        return [parse_node(n) for n in self.request("GET", "/nodes").get("nodes") or ()]

    def jobs(self) -> list[SlurmJob]:
        return [parse_job(j) for j in self.request("GET", "/jobs").get("jobs") or ()]

    def job(self, job_id: int) -> list[SlurmJob]:
        """The job's records: one, or one per component of a heterogeneous job. [] if unknown."""
        try:
            data = self.request("GET", f"/job/{int(job_id)}")
        except SlurmError as exc:
            if any("Invalid job id" in str(e.get("error", "")) for e in exc.errors):
                return []
            raise
        return [parse_job(j) for j in data.get("jobs") or ()]

    def submit(self, body: Mapping[str, Any], *, user: str | None = None) -> int:
        """Submit a job ({"job": ..., "script": ...} or {"jobs": [...], "script": ...}); its id."""
        data = self.request("POST", "/job/submit", dict(body), user=user)
        job_id = data.get("job_id")
        if job_id is None:
            raise SlurmError("slurmrestd accepted the submission without a job id", data.get("errors") or ())
        return int(job_id)

    def cancel(self, job_id: int, *, user: str | None = None) -> None:
        """Cancel the job (all its components); an unknown or finished job is not an error."""
        try:
            self.request("DELETE", f"/job/{int(job_id)}?signal={quote('SIGKILL')}", user=user)
        except SlurmError as exc:
            text = str(exc)
            if "already completed" in text or "Invalid job id" in text or "completed" in text:
                return
            raise


def error_text(errors: Sequence[Mapping[str, Any]]) -> str:
    """slurmrestd's error entries as one line."""
    parts = []
    for e in errors:
        text = str(e.get("description") or e.get("error") or "").strip()
        if text and text not in parts:
            parts.append(text)
    return "; ".join(parts)


# -- nodes ---------------------------------------------------------------------------------------

_GRES_COUNT = re.compile(r"^gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", re.IGNORECASE)


def gres_gpu_count(gres: str) -> int:
    """GPUs in a node's Gres string: "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a:4,gpu:b:4" -> 8, 8, 8."""
    total = 0
    for item in _split_gres(gres or ""):
        m = _GRES_COUNT.match(item)
        if m:
            total += int(m.group(1))
        elif item.lower() == "gpu":
            total += 1
    return total


_GRES_TYPE = re.compile(r"^gpu:([A-Za-z][A-Za-z0-9_.-]*):\d+", re.IGNORECASE)


def gres_gpu_type(gres: str) -> str:
    """The GPU type a node's Gres names ("gpu:h100:8(S:0-1)" -> "h100"); "" when untyped or
    mixed."""
    types = set()
    for item in _split_gres(gres or ""):
        if not item.lower().startswith("gpu"):
            continue
        m = _GRES_TYPE.match(item)
        types.add(m.group(1) if m else "")
    return types.pop() if len(types) == 1 else ""


def _split_gres(gres: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in gres:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """A node as slurmrestd reports it: base state (idle, mixed, allocated, down, ...), state
    flags (DRAIN, NOT_RESPONDING, ...), reason, GPUs from its Gres, and the address to reach it."""

    name: str
    state: str
    flags: tuple[str, ...]
    reason: str
    gpus: int
    address: str
    gpu_type: str = ""

    @property
    def health(self) -> str:
        """TopoWeb's node state: down, drained, draining or up."""
        flags = {f.upper() for f in self.flags}
        if self.state in ("down", "fail", "future", "unknown") or flags & {
            "NOT_RESPONDING",
            "FAIL",
            "POWERED_DOWN",
        }:
            return "down"
        if "DRAIN" in flags:
            return "draining" if self.state in ("allocated", "mixed", "completing") else "drained"
        return "up"

    @property
    def describe(self) -> str:
        """Slurm's own words, e.g. "idle+DRAIN: disk failed"."""
        text = "+".join([self.state, *self.flags])
        return f"{text}: {self.reason}" if self.reason else text


def parse_node(data: Mapping[str, Any]) -> SlurmNode:
    return SlurmNode(
        name=str(data.get("name") or ""),
        state=str(data.get("state") or "unknown").lower(),
        flags=tuple(str(f) for f in data.get("state_flags") or ()),
        reason=str(data.get("reason") or ""),
        gpus=gres_gpu_count(str(data.get("gres") or "")),
        gpu_type=gres_gpu_type(str(data.get("gres") or "")),
        address=str(data.get("address") or data.get("hostname") or data.get("name") or ""),
    )


# -- jobs ----------------------------------------------------------------------------------------

_IDX = re.compile(r"IDX:([0-9,\-]+)")

ACTIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)
# States of a job record that will never run again; any other (pending, running, requeued, held,
# suspended, completing, resizing, ...) is live.
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)
# States of a job Slurm has put back in its queue.
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"})


def gres_indexes(detail: str) -> list[int]:
    """GPU indexes of one node's gres_detail entry: "gpu:2(IDX:3-4)" -> [3, 4]; "gpu:h100:3(IDX:0,2,5)"."""
    out: list[int] = []
    for m in _IDX.finditer(detail or ""):
        for part in m.group(1).split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job record (or one heterogeneous job component): state, reason, exit code, the GPU
    indexes it holds per node (`gpus`, from the detailed record's GRES IDX), and how many times
    Slurm restarted it (`restarts`: it requeued the job after it had started)."""

    job_id: int
    het_job_id: int
    name: str
    user: str
    state: str
    reason: str
    exit_code: int | None
    signal: int | None
    nodes: tuple[str, ...]
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    comment: str = ""
    restarts: int = 0

    @property
    def group_id(self) -> int:
        """The id to act on: the heterogeneous job's leader id, or the job's own."""
        return self.het_job_id or self.job_id

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def live(self) -> bool:
        """Not finished: it may still run (or runs, or is cleaning up)."""
        return bool(self.state) and self.state not in FINISHED_STATES

    @property
    def requeued(self) -> bool:
        """Slurm put it back in its queue after it had started."""
        return self.state in REQUEUE_STATES or self.restarts > 0

    @property
    def holds_gpus(self) -> bool:
        """Running (or finishing) on its nodes: its GPUs are taken."""
        return self.state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")


def _exit(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) of slurmrestd's exit_code, a wait status: code << 8 | signal."""
    if value is None or value == "":
        return None, None
    try:
        status = int(value)
    except (TypeError, ValueError):
        return None, None
    return (status >> 8) & 0xFF, (status & 0x7F) or None


def parse_job(data: Mapping[str, Any]) -> SlurmJob:
    raw_nodes = str(data.get("nodes") or "")
    try:
        nodes = tuple(expand(raw_nodes)) if raw_nodes else ()
    except HostlistError:
        nodes = tuple(n for n in raw_nodes.split(",") if n)
    details = list(data.get("gres_detail") or ())
    gpus: dict[str, tuple[int, ...]] = {}
    for i, node in enumerate(nodes):
        if i < len(details):
            idx = gres_indexes(str(details[i]))
            if idx:
                gpus[node] = tuple(idx)
    code, sig = _exit(data.get("exit_code"))
    return SlurmJob(
        job_id=int(data.get("job_id") or 0),
        het_job_id=int(data.get("het_job_id") or 0),
        name=str(data.get("name") or ""),
        user=str(data.get("user_name") or data.get("user_id") or ""),
        state=str(data.get("job_state") or "").upper(),
        reason=str(data.get("state_reason") or ""),
        exit_code=code,
        signal=sig,
        nodes=nodes,
        gpus=gpus,
        comment=str(data.get("comment") or ""),
        restarts=_int(data.get("restart_cnt")),
    )


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def group(jobs: Sequence[SlurmJob]) -> dict[int, list[SlurmJob]]:
    """Job records by the id to act on (a heterogeneous job's components together)."""
    out: dict[int, list[SlurmJob]] = {}
    for j in jobs:
        out.setdefault(j.group_id, []).append(j)
    return out


# -- topology ------------------------------------------------------------------------------------


def topology_conf(scontrol_text: str) -> str:
    """`scontrol show topology` output as topology.conf lines (what the slurm-tree converter
    reads): Level= dropped, and a switch above others keeps Switches= only (scontrol also lists
    every node below it)."""
    out = []
    for line in scontrol_text.splitlines():
        pairs = [p for p in line.split() if "=" in p]
        if not pairs:
            continue
        keys = {p.split("=", 1)[0].lower() for p in pairs}
        kept = []
        for p in pairs:
            key = p.split("=", 1)[0].lower()
            if key == "level" or (key == "nodes" and "switches" in keys):
                continue
            kept.append(p)
        out.append(" ".join(kept))
    return "\n".join(out) + "\n"


def node_conf(nodes: Sequence[SlurmNode]) -> str:
    """slurm.conf NodeName lines giving each node's GPUs and their GRES type (which the converter
    maps to a GPU model and its peak), for the converters."""
    return "".join(
        f"NodeName={n.name} Gres=gpu:{n.gpu_type + ':' if n.gpu_type else ''}{n.gpus}\n"
        for n in nodes
        if n.name
    )
