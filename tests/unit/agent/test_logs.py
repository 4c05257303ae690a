"""Rank log files: chunks cut at character boundaries, bytes-safe text, copytruncate rotation."""

from __future__ import annotations

from apps.agent.logs import LogFile, read_tail, safe_text
from apps.agent.runner import MAX_REPORTS, report_batch


def test_safe_text_replaces_nul_and_invalid_utf8():
    assert safe_text(b"a\x00b\xffc \xc3\xa9") == "a\ufffdb\ufffdc \u00e9"


def test_chunks_follow_the_shipped_mark_and_never_split_a_character(tmp_path):
    path = tmp_path / "rank.log"
    path.write_bytes("héllo".encode() + b"\xe2\x82")  # a euro sign, cut short by the writer
    logfile = LogFile(path)
    piece = logfile.chunk(limit=3)
    assert piece == {"offset": 0, "size": 3, "data": "hé"}
    logfile.shipped_to(3)
    piece = logfile.chunk()
    assert piece == {"offset": 3, "size": 3, "data": "llo"}
    logfile.shipped_to(6)
    assert logfile.chunk() is None and logfile.pending()
    assert logfile.chunk(final=True) == {"offset": 6, "size": 2, "data": "\ufffd"}
    with path.open("ab") as fh:
        fh.write(b"\xac!")
    assert logfile.chunk()["data"] == "\u20ac!"


def test_rotation_keeps_offsets_of_the_whole_output(tmp_path):
    path = tmp_path / "rank.log"
    with path.open("ab") as writer:
        writer.write(b"x" * 100)
        writer.flush()
        logfile = LogFile(path)
        logfile.shipped_to(100)
        assert not logfile.rotate(0) and not logfile.rotate(100)
        assert logfile.rotate(50)
        assert (tmp_path / "rank.log.1").read_bytes() == b"x" * 100
        # The rank's appending writes go on at the start of the truncated file.
        writer.write(b"after\n")
        writer.flush()
    assert path.read_bytes() == b"after\n"
    assert logfile.size() == 106
    assert logfile.chunk() == {"offset": 100, "size": 6, "data": "after\n"}


def test_output_unshipped_when_its_file_rotated_ships_from_the_rotated_file_first(tmp_path):
    path = tmp_path / "rank.log"
    with path.open("ab") as writer:
        writer.write(b"a" * 10)
        writer.flush()
        logfile = LogFile(path)
        logfile.shipped_to(4)
        assert logfile.rotate(5) and logfile.backlog()
        writer.write("bé".encode())
        writer.flush()
    # The rest of the rotated output, cut at the rotation point, then the new file: contiguous.
    assert logfile.chunk(limit=4) == {"offset": 4, "size": 4, "data": "aaaa"}
    logfile.shipped_to(8)
    assert logfile.chunk() == {"offset": 8, "size": 2, "data": "aa"}
    logfile.shipped_to(10)
    assert not logfile.backlog()
    assert logfile.chunk() == {"offset": 10, "size": 3, "data": "bé"}
    logfile.shipped_to(13)
    assert not logfile.pending()


def test_a_rotated_file_not_yet_shipped_is_kept_until_the_live_file_reaches_twice_the_cap(tmp_path):
    path = tmp_path / "rank.log"
    path.write_bytes(b"a" * 10)
    logfile = LogFile(path)
    assert logfile.rotate(5)
    path.write_bytes(b"b" * 10)
    assert not logfile.rotate(5)
    assert (tmp_path / "rank.log.1").read_bytes() == b"a" * 10
    path.write_bytes(b"b" * 11)
    # Past twice the cap the disk bound wins: the first file's output is skipped, never misplaced.
    assert logfile.rotate(5)
    assert logfile.chunk() == {"offset": 10, "size": 11, "data": "b" * 11}


def test_a_restarted_agent_counts_offsets_from_the_recorded_rotations(tmp_path):
    path, state = tmp_path / "rank.log", tmp_path / "log-rotated"
    path.write_bytes(b"a" * 10)
    logfile = LogFile.resume(path, state)
    assert logfile.rotate(5)
    logfile.shipped_to(10)
    path.write_bytes(b"b" * 4)
    assert logfile.rotate(3)
    assert state.read_text().split() == ["14", "10"]
    path.write_bytes(b"new")
    # The agent restarts; the server's copy ends at 14 (everything before the second rotation).
    again = LogFile.resume(path, state)
    again.shipped_to(14)
    assert (again.rotated, again.old_base, again.size()) == (14, 10, 17)
    assert again.chunk() == {"offset": 14, "size": 3, "data": "new"}
    # Without the record the new output would sit below the server's end and never ship.
    forgetful = LogFile(path)
    forgetful.shipped_to(14)
    assert not forgetful.pending()
    # A corrupt or impossible record counts as none.
    for text in ("garbage", "3 9", "-1 0"):
        state.write_text(text)
        assert LogFile.resume(path, state).rotated == 0


def test_the_tail_continues_into_the_rotated_file(tmp_path):
    path = tmp_path / "rank.log"
    path.write_bytes(b"0123456789")
    logfile = LogFile(path)
    assert logfile.rotate(5)
    path.write_bytes(b"ab")
    assert read_tail(path, 6) == b"6789ab"
    assert read_tail(path, 2) == b"ab"
    assert read_tail(tmp_path / "none.log", 6) == b""


def test_a_report_batch_is_bounded_by_count_and_bytes():
    small = [{"job": 1, "generation": 1, "rank": r, "event": "started"} for r in range(MAX_REPORTS + 10)]
    assert len(report_batch(small)) == MAX_REPORTS
    big = [
        {"job": 1, "generation": 1, "rank": r, "event": "exited", "log_tail": "x" * 600_000}
        for r in range(10)
    ]
    batch = report_batch(big)
    assert 1 <= len(batch) <= 4 and batch == big[: len(batch)]
    assert report_batch(big[:1]) == big[:1]
