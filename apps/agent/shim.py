"""The parent of one rank process: `python -I shim.py SPEC_FILE` (standard library only).

The agent starts it (as root, in a new session, stdout and stderr on the rank's log file, with a
minimal environment: the job's variables never reach a root process, nor a command line others
can read). It forks the rank, which joins the rank's cgroups,
drops to the owner's account (supplementary groups, gid, uid) and execs the command in `workdir`.
The shim stays outside the rank's cgroups, waits for the rank and writes its exit status to
`exit_file` (atomically), so an agent that restarted meanwhile still learns it. It ignores
SIGTERM, SIGINT and SIGHUP: stopping the rank is the agent's business, by cgroup.

SPEC_FILE (root's alone, in the agent's state directory) is JSON: {"argv", "env" (the rank's
whole environment), "workdir", "uid", "gid", "groups" (null: keep the agent's identity), "procs"
(cgroup.procs files to join), "exit_file"}.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _child(spec: dict) -> None:
    """In the forked child: join the cgroups, drop privileges, exec. Never returns."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        pid = str(os.getpid())
        for path in spec.get("procs") or ():
            with open(path, "w") as fh:
                fh.write(pid)
        if spec.get("groups") is not None:
            os.setgroups([int(g) for g in spec["groups"]])
            os.setgid(int(spec["gid"]))
            os.setuid(int(spec["uid"]))
            if os.getuid() != int(spec["uid"]) or os.geteuid() != int(spec["uid"]):
                raise OSError("could not drop privileges")
        if spec.get("workdir"):
            os.chdir(spec["workdir"])
        else:
            try:
                os.chdir(spec["env"].get("HOME") or "/")
            except OSError:
                os.chdir("/")
        argv = [str(a) for a in spec["argv"]]
        os.execvpe(argv[0], argv, dict(spec["env"]))
    except BaseException as exc:  # noqa: BLE001 - anything before exec is the rank's start failure
        try:
            os.write(2, f"topoweb-agent: cannot start {spec.get('argv', ['?'])[0]!r}: {exc}\n".encode())
        finally:
            os._exit(127)


def _write_exit(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"exit_code": code}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    with open(argv[1]) as fh:
        spec = json.load(fh)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        _child(spec)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = 255 << 8
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    _write_exit(spec["exit_file"], code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
