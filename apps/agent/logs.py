"""Rank log files on the node: shipped to the server in chunks, capped and rotated.

Each rank writes to one file (opened for appending). `LogFile` ships it from where the server's
copy ends, a chunk at a time, cut at a UTF-8 character boundary, and rotates it when it grows past
the cap: the file is copied to `<name>.1` (replacing the previous one) and truncated, which the
rank's appending writes follow (copytruncate, as logrotate does for a process that keeps its
file open). Offsets are positions in the rank's whole output: rotated bytes count, so the
server's copy stays in one piece. What had not shipped when its file rotated ships from `<name>.1`
before the new file does. A `<name>.1` not yet shipped is not replaced until the live file holds
twice the cap (the disk bound wins: output never shipped by then is skipped). Output the rank
writes between the copy and the truncation is lost (a few bytes at most: the copy is repeated
until the file stops growing).

Where the bytes rotated so far are counted is written to a small file beside the rank's other
records (`state`), so an agent that restarts keeps counting offsets from the same origin as the
server's copy (counted from zero, everything the rank writes after a rotation would sit below the
server's end and never ship).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK_BYTES = 64 * 1024


def safe_text(data: bytes) -> str:
    """Bytes as text any JSON parser and database take: invalid UTF-8 and NUL become U+FFFD."""
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


def utf8_cut(data: bytes) -> int:
    """How many leading bytes of `data` end on a character boundary (a multi-byte character cut
    at the end is left for the next chunk)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        if byte & 0x80 == 0:
            return end
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return end if back >= need else end - back
    return end


def read_tail(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of the rank's output in `path`, continued from `<path>.1` when the
    file rotated a moment ago (b'' when neither exists)."""
    data = b""
    for name in (path, path.with_name(path.name + ".1")):
        try:
            with name.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(size - (limit - len(data)), 0))
                data = fh.read(limit - len(data)) + data
        except OSError:
            pass
        if len(data) >= limit:
            break
    return data


@dataclass(slots=True)
class LogFile:
    """One rank's log file: `shipped` bytes of its output are on the server; `rotated` bytes of
    it were moved out by rotations, the last of them (from byte `old_base` on) to `<path>.1`;
    `full` once the server keeps no more of it."""

    path: Path
    shipped: int = 0
    rotated: int = 0
    old_base: int = 0
    full: bool = False
    # Where `rotated` and `old_base` are remembered across agent restarts (None: in memory only).
    state: Path | None = None

    @classmethod
    def resume(cls, path: Path, state: Path | None) -> LogFile:
        """The log at `path`, with the rotations recorded in `state` (none when it is missing or
        unreadable)."""
        logfile = cls(path, state=state)
        if state is not None:
            try:
                rotated, old_base = (int(v) for v in state.read_text().split())
            except (OSError, ValueError):
                return logfile
            if 0 <= old_base <= rotated:
                logfile.rotated, logfile.old_base = rotated, old_base
        return logfile

    @property
    def old(self) -> Path:
        return self.path.with_name(self.path.name + ".1")

    def size(self) -> int:
        """The rank's whole output so far, in bytes (rotated ones included)."""
        try:
            return self.rotated + self.path.stat().st_size
        except OSError:
            return self.rotated

    def pending(self) -> bool:
        return not self.full and self.size() > self.shipped

    def backlog(self) -> bool:
        """Output in `<path>.1` has not shipped yet (it goes at once, before the file rotates
        again)."""
        return not self.full and max(self.shipped, self.old_base) < self.rotated

    def chunk(self, limit: int = CHUNK_BYTES, final: bool = False) -> dict[str, Any] | None:
        """The next piece to ship ({"offset", "size", "data"}), or None: first what rotated to
        `<path>.1` unshipped, then the live file. Output that rotated away before it shipped is
        skipped. A trailing partial character waits for the next chunk unless `final` (the rank
        exited) or it ends the rotated part."""
        if self.full:
            return None
        start = max(self.shipped, self.old_base)
        data = b""
        if start < self.rotated:
            try:
                with self.old.open("rb") as fh:
                    fh.seek(start - self.old_base)
                    data = fh.read(min(limit, self.rotated - start))
            except OSError:
                data = b""
            if data:
                cut = len(data) if start + len(data) == self.rotated else utf8_cut(data)
                return {"offset": start, "size": cut, "data": safe_text(data[:cut])} if cut else None
            # `<path>.1` is gone: its unshipped output is skipped.
            start = self.rotated
        try:
            with self.path.open("rb") as fh:
                fh.seek(start - self.rotated)
                data = fh.read(limit)
        except OSError:
            return None
        if not data:
            return None
        cut = len(data) if final else utf8_cut(data)
        if cut == 0:
            return None
        return {"offset": start, "size": cut, "data": safe_text(data[:cut])}

    def shipped_to(self, end: int) -> None:
        """The server's copy reaches byte `end` (it may be ahead after an agent restart)."""
        self.shipped = max(self.shipped, end)

    def rotate(self, max_bytes: int) -> bool:
        """Copy the file to `<path>.1` and truncate it when it is over `max_bytes` (and, while
        `<path>.1` has output not shipped yet, only once it is over twice that)."""
        if max_bytes <= 0:
            return False
        try:
            size = self.path.stat().st_size
            if size <= max_bytes or (self.backlog() and size <= 2 * max_bytes):
                return False
            old = self.old
            old.unlink(missing_ok=True)
            # Created 0600 (then given the log's owner and mode): never readable by others meanwhile.
            fd = os.open(old, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as dst, self.path.open("r+b") as src:
                # Copy until the file stops growing, then truncate: what the rank writes in
                # between is all that is lost.
                copied = 0
                while chunk := src.read(CHUNK_BYTES):
                    dst.write(chunk)
                    copied += len(chunk)
                src.truncate(0)
            try:
                st = self.path.stat()
                os.chmod(old, st.st_mode & 0o777)
                os.chown(old, st.st_uid, st.st_gid)
            except OSError:
                pass
        except OSError:
            return False
        self.old_base = self.rotated
        self.rotated += copied
        self._remember()
        return True

    def _remember(self) -> None:
        """Record `rotated` and `old_base` in `state` (replaced whole: a crash leaves the old or
        the new record, never half of one)."""
        if self.state is None:
            return
        tmp = self.state.with_name(self.state.name + ".tmp")
        try:
            tmp.write_text(f"{self.rotated} {self.old_base}\n")
            os.replace(tmp, self.state)
        except OSError:
            pass
