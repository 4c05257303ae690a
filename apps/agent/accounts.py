"""Which Unix accounts may run ranks: people's, not the system's (stdlib only; the node agent
checks at each rank start, the server's `unix_account` at mapping time)."""

from __future__ import annotations

import pwd
from pathlib import Path

LOGIN_DEFS = Path("/etc/login.defs")
DEFAULT_UID_MIN = 1000


def uid_min(path: Path = LOGIN_DEFS) -> int:
    """The system's first uid for people's accounts: UID_MIN of login.defs, else 1000."""
    try:
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "UID_MIN" and parts[1].isdigit():
                return int(parts[1])
    except OSError:
        pass
    return DEFAULT_UID_MIN


def system_account_refusal(name: str, uid: int, minimum: int) -> str:
    """Why account `name` (uid `uid`) may not run ranks, or "" when it may: root and accounts
    below `minimum` are the system's."""
    if uid == 0:
        return f"Unix account {name!r} is root (uid 0): ranks never run as root"
    if uid < minimum:
        return (
            f"Unix account {name!r} is a system account (uid {uid}, below UID_MIN {minimum}): ranks run"
            " as people's accounts"
        )
    return ""


def local_uid(name: str) -> int | None:
    """The uid of account `name` on this host, None when it has none."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None
