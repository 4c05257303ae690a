"""A free TCP port on 127.0.0.1 for a server a test starts (the system picks it; the server binds
it a moment later)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
