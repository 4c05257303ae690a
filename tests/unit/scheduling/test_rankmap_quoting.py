"""Output is never executable input: whatever a node or NIC is called (rows may predate the name
rule), the torchrun script runs no command of the name's and each name stays one shell word."""

from __future__ import annotations

import shlex
import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.scheduling.rankmaps import torchrun_commands

HOSTILE = st.one_of(
    st.sampled_from(
        [
            "a;touch /tmp/pwned",
            "$(reboot)",
            "`id`",
            "a\nrm -rf ~",
            "-rf",
            "a b",
            "'",
            '"',
            "\\",
            "a\x01b",
            "\x1b[31m",
        ]
    ),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=1,
        max_size=30,
    ),
)


def ranks_on(node_a: str, node_b: str, nic: str) -> list[dict]:
    return [{"rank": r, "node": node_a if r < 2 else node_b, "gpu": r % 2, "nic": nic} for r in range(4)]


def run_script(script: str, tmp_path) -> tuple[list[list[str]], str]:
    """Run the script in bash with no PATH (any command a name smuggled in fails loudly) and a
    `torchrun` function that records its arguments; returns the calls and stderr."""
    out = tmp_path / "calls"
    # Each call writes its argument count, then its arguments, NUL-terminated (names hold no NUL).
    prelude = f'torchrun() {{ printf \'%s\\0\' "$#" "$@" >> {shlex.quote(str(out))}; }}\n'
    done = subprocess.run(
        ["/bin/bash", "-c", prelude + script], env={"PATH": "/nonexistent"}, capture_output=True, timeout=10
    )
    fields = out.read_bytes().split(b"\0")[:-1] if out.exists() else []
    calls = []
    while fields:
        count = int(fields.pop(0))
        calls.append([f.decode() for f in fields[:count]])
        del fields[:count]
    return calls, done.stderr.decode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(HOSTILE, HOSTILE, HOSTILE)
def test_the_script_runs_torchrun_twice_with_the_names_as_given_and_nothing_else(
    tmp_path, node_a, node_b, nic
):
    if node_a == node_b:
        node_b += "2"
    (tmp_path / "calls").unlink(missing_ok=True)
    calls, stderr = run_script(torchrun_commands(ranks_on(node_a, node_b, nic)), tmp_path)
    assert stderr == ""
    assert len(calls) == 2
    for node_rank, args in enumerate(calls):
        assert f"--master-addr={node_a}" in args and f"--node-rank={node_rank}" in args
        wrapper = args[args.index("-c") + 1]
        table = wrapper.split("H=(", 1)[1].split(");", 1)[0]
        assert shlex.split(table) == [f"={nic}", f"={nic}"]
