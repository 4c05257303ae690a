"""One cgroup per rank: the set of processes a rank is, whatever they fork or `setsid`.

Two backends. cgroup v2 (a writable subtree of the unified hierarchy; the agent needs no
controller, only `cgroup.procs`, `cgroup.events` and `cgroup.kill`; `pids` and `memory` limit a
rank where the hierarchy delegates them). cgroup v1 (`freezer` and `pids` hierarchies, plus
`devices` and `memory` where mounted and writable): the freezer cgroup tracks the processes and
stops them atomically (freeze, SIGKILL every member, thaw), the devices cgroup denies the GPU
device files the rank was not given.

A rank that ended at one of its limits says so (`limit_hit`): the pids controller counts the
forks it refused (`pids.events` `max`), the memory controller the processes its OOM killer
killed (`memory.events` `oom_kill` on v2, `memory.oom_control` `oom_kill` on v1).

Device isolation on v2 needs a BPF device program; this agent does not load one, so on v2 a
rank could open another GPU's `/dev/nvidiaN` (docs/security.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")
V1_TRACK = "freezer"
V1_CONTROLLERS = ("freezer", "pids", "devices", "memory")
# v1 controllers a rank can do without (the agent still runs; `describe` says what is missing).
V1_OPTIONAL = ("memory",)
PIDS_LIMIT = "pids_limit"
MEMORY_LIMIT = "memory_limit"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
GPU_DEVICE = re.compile(r"^nvidia([0-9]+)$")


class CgroupError(RuntimeError):
    """The cgroup hierarchy is missing or not writable."""


def _mounts(mounts: Path = MOUNTS) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup mount."""
    out = []
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1].replace("\\040", " "), parts[2], set(parts[3].split(","))))
    return out


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in the v2 hierarchy (controller None) or a v1 controller's."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, ctrls, path = line.split(":", 2)
        if controller is None and num == "0" and ctrls == "":
            return path
        if controller is not None and controller in ctrls.split(","):
            return path
    return "/"


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def _procs(directory: Path) -> set[int]:
    """The pids of a cgroup directory and of its descendants."""
    found: set[int] = set()
    try:
        text = (directory / "cgroup.procs").read_text()
    except OSError:
        return found
    found.update(int(p) for p in text.split())
    with contextlib.suppress(OSError):
        for child in directory.iterdir():
            if child.is_dir():
                found |= _procs(child)
    return found


def _counter(path: Path, name: str) -> int | None:
    """The value of line `name N` of a flat-keyed cgroup file (None: no such file or line)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            with contextlib.suppress(ValueError):
                return int(parts[1])
    return None


def _rmdir_tree(directory: Path) -> None:
    with contextlib.suppress(OSError):
        for child in directory.iterdir():
            if child.is_dir():
                _rmdir_tree(child)
    with contextlib.suppress(OSError):
        directory.rmdir()


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass(frozen=True, slots=True)
class RankCgroup:
    """A rank's cgroup: `dirs` (one per hierarchy; the first tracks the processes) and `version`."""

    version: int
    dirs: tuple[Path, ...]

    @property
    def tracker(self) -> Path:
        return self.dirs[0]

    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files a process writes its pid to, to join the rank."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        """Every process in the rank now."""
        return _procs(self.tracker)

    def empty(self) -> bool:
        """No process left in the rank (a missing cgroup is empty)."""
        if self.version == 2:
            try:
                events = (self.tracker / "cgroup.events").read_text()
            except OSError:
                return True
            return "populated 0" in events
        return not self.pids()

    def exists(self) -> bool:
        return self.tracker.is_dir()

    def signal(self, sig: int, *, skip: frozenset[int] | set[int] = frozenset()) -> set[int]:
        """Send `sig` to every process of the rank but those in `skip`; returns the pids signalled.
        A stop sends SIGTERM through this once a process (its `skip` grows): a rank's SIGTERM
        handler, a checkpoint, runs once."""
        sent: set[int] = set()
        with contextlib.suppress(OSError):
            for pid in self.pids() - skip:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                    sent.add(pid)
        return sent

    def kill(self) -> None:
        """SIGKILL every process of the rank, including those forked meanwhile: `cgroup.kill` on
        v2, freeze then kill then thaw on v1."""
        if self.version == 2:
            kill = self.tracker / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
                    return
            for _ in range(10):
                pids = self.pids()
                if not pids:
                    return
                _signal_all(pids, signal.SIGKILL)
                time.sleep(0.01)
            return
        state = self.tracker / "freezer.state"
        try:
            state.write_text("FROZEN")
            deadline = time.monotonic() + 2.0
            while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.01)
        except OSError:
            pass
        _signal_all(self.pids(), signal.SIGKILL)
        with contextlib.suppress(OSError):
            state.write_text("THAWED")

    def limit_pids(self, limit: int) -> bool:
        """At most `limit` processes and threads in the rank (a fork bomb stops there); False
        where no hierarchy has the pids controller."""
        done = False
        for d in self.dirs:
            path = d / "pids.max"
            if path.exists():
                with contextlib.suppress(OSError):
                    path.write_text(str(int(limit)))
                    done = True
        return done

    def limit_memory(self, limit_bytes: int) -> bool:
        """At most `limit_bytes` of memory for the rank (v2 `memory.max`, v1
        `memory.limit_in_bytes`): past it the kernel's OOM killer kills within the rank. False
        where no hierarchy has the memory controller."""
        done = False
        for d in self.dirs:
            for name in ("memory.max", "memory.limit_in_bytes"):
                path = d / name
                if path.exists():
                    with contextlib.suppress(OSError):
                        path.write_text(str(int(limit_bytes)))
                        done = True
        return done

    def limit_hit(self) -> str | None:
        """Which limit the rank ran into, if any: PIDS_LIMIT when its pids controller refused a
        fork, MEMORY_LIMIT when its OOM killer killed a process (v1 kernels without an `oom_kill`
        count: its memory limit was reached, `memory.failcnt`)."""
        for d in self.dirs:
            if _counter(d / "pids.events", "max"):
                return PIDS_LIMIT
        for d in self.dirs:
            kills = _counter(d / "memory.events", "oom_kill")
            if kills is None:
                kills = _counter(d / "memory.oom_control", "oom_kill")
            if kills is None:
                with contextlib.suppress(OSError, ValueError):
                    kills = int((d / "memory.failcnt").read_text())
            if kills:
                return MEMORY_LIMIT
        return None

    def deny_devices(self, devices: list[tuple[int, int]]) -> None:
        """Deny read, write and mknod of character devices (major, minor) to the rank (v1
        `devices` only; a no-op elsewhere)."""
        for d in self.dirs:
            deny = d / "devices.deny"
            if deny.exists():
                for major, minor in devices:
                    deny.write_text(f"c {major}:{minor} rwm")

    def remove(self) -> None:
        """Remove the rank's cgroup directories (once empty)."""
        for d in self.dirs:
            _rmdir_tree(d)


@dataclass(frozen=True, slots=True)
class Cgroups:
    """Where this agent creates its ranks' cgroups: one parent directory per hierarchy."""

    version: int
    parents: tuple[Path, ...]

    def describe(self) -> str:
        devices = "GPU device files denied per rank" if self.devices else "no per-rank GPU device filter"
        memory = "memory limits per rank" if self.memory else "no memory controller: memory_mb not enforced"
        return f"cgroup v{self.version} ({self.parents[0]}; {devices}; {memory})"

    @property
    def memory(self) -> bool:
        """Whether a rank's memory can be limited (v1 `memory` mounted, or v2 with the memory
        controller available to the agent's cgroup)."""
        if self.version == 1:
            return any((p / "memory.limit_in_bytes").exists() for p in self.parents)
        with contextlib.suppress(OSError):
            return "memory" in (self.parents[0] / "cgroup.controllers").read_text().split()
        return False

    @property
    def devices(self) -> bool:
        """Whether GPU device files can be denied per rank (v1 `devices` mounted)."""
        return any((p / "devices.deny").exists() for p in self.parents)

    def rank(self, name: str) -> RankCgroup:
        """The rank cgroup `name` (not created)."""
        if not NAME.match(name):
            raise ValueError(f"bad cgroup name {name!r}")
        return RankCgroup(self.version, tuple(p / name for p in self.parents))

    def create(self, name: str) -> RankCgroup:
        """Create the rank cgroup `name` (fresh: left-overs of an earlier rank are removed)."""
        group = self.rank(name)
        if self.version == 2:
            # The pids and memory controllers for the ranks below (where the hierarchy delegates them).
            for controller in ("+pids", "+memory"):
                with contextlib.suppress(OSError):
                    (self.parents[0] / "cgroup.subtree_control").write_text(controller)
        for d in group.dirs:
            d.mkdir(parents=False, exist_ok=True)
        return group

    def names(self) -> list[str]:
        """The rank cgroups that exist under the tracking parent."""
        with contextlib.suppress(OSError):
            return sorted(p.name for p in self.parents[0].iterdir() if p.is_dir())
        return []


def detect(mode: str, name: str, mounts: Path = MOUNTS) -> Cgroups | None:
    """The agent's cgroup parents for `mode` ("auto", "v2", "v1"), each `name` under the agent's
    own cgroup; CgroupError when the mode asked for is not available. "auto" takes v2 where
    /sys/fs/cgroup is the unified hierarchy alone, v1 freezer and pids where mounted, else a
    writable unified hierarchy (hybrid systems), else None."""
    if not NAME.match(name.replace("/", "_")):
        raise CgroupError(f"--cgroup-name: bad name {name!r}")
    try:
        found = _mounts(mounts)
    except OSError as exc:
        raise CgroupError(f"cannot read {mounts}: {exc}") from exc
    v2_mount = next((Path(m) for m, kind, _ in found if kind == "cgroup2"), None)
    v1 = {c: Path(m) for m, kind, opts in found if kind == "cgroup" for c in V1_CONTROLLERS if c in opts}

    def v2() -> Cgroups | None:
        if v2_mount is None:
            return None
        parent = v2_mount / _own_path(None).lstrip("/") / name
        return Cgroups(2, (parent,)) if _writable_dir(parent) else None

    def v1_groups() -> Cgroups | None:
        if "freezer" not in v1 or "pids" not in v1:
            return None
        parents = []
        for ctrl in V1_CONTROLLERS:
            if ctrl not in v1:
                continue
            parent = v1[ctrl] / _own_path(ctrl).lstrip("/") / name
            if not _writable_dir(parent):
                if ctrl in V1_OPTIONAL:
                    continue
                return None
            parents.append(parent)
        return Cgroups(1, tuple(parents))

    if mode == "v2":
        got = v2()
    elif mode == "v1":
        got = v1_groups()
    elif mode == "auto":
        pure_v2 = v2_mount is not None and str(v2_mount) == "/sys/fs/cgroup"
        got = (v2() if pure_v2 else None) or v1_groups() or v2()
        return got
    else:
        raise CgroupError(f"--cgroups: expected auto, v1 or v2, got {mode!r}")
    if got is None:
        raise CgroupError(f"no writable cgroup {mode} hierarchy (run the agent as root, or delegate one)")
    return got


def gpu_devices(dev_dir: str | Path = "/dev") -> dict[int, tuple[int, int]]:
    """GPU index -> (major, minor) of the node's `/dev/nvidiaN` character devices."""
    out: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(dev_dir):
            m = GPU_DEVICE.match(entry.name)
            if m is None:
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                out[int(m.group(1))] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out
