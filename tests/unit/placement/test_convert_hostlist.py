"""Slurm hostlist expressions: expansion, compression and their round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.convert.hostlist import MAX_HOSTS, HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("tux[0-3,12]", ["tux0", "tux1", "tux2", "tux3", "tux12"]),
        ("n[001-003]", ["n001", "n002", "n003"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("circe-n[017-018,021-022]", ["circe-n017", "circe-n018", "circe-n021", "circe-n022"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("switch.2.[1-3]", ["switch.2.1", "switch.2.2", "switch.2.3"]),
        ("[1101-1102]", ["1101", "1102"]),
        ("", []),
    ],
)
def test_expand_reads_slurm_hostlists(expr, names):
    assert expand(expr) == names


@pytest.mark.parametrize(
    "expr", ["n[1-", "n]1[", "n[3-1]", "n[a-b]", "n[1-2", "n[[1]]", "a,,b", "n[0-99999999]", "a b"]
)
def test_malformed_hostlists_are_refused_with_a_message(expr):
    with pytest.raises(HostlistError):
        expand(expr)


def test_a_hostlist_may_not_name_more_than_the_host_limit():
    with pytest.raises(HostlistError, match="more than"):
        expand(f"r[1-1000]n[1-{MAX_HOSTS // 1000 + 1}]")


def test_compress_writes_the_shortest_ranges():
    names = [f"circe-n{i:03d}" for i in (17, 18, *range(21, 37))]
    assert compress(names) == "circe-n[017-018,021-036]"
    assert compress(["srv1101", "srv1102", "db", "srv1103"]) == "srv[1101-1102],db,srv1103"
    assert compress(["n9", "n10", "n11"]) == "n[9-11]"
    assert compress(["n09", "n10"]) == "n[09-10]"


_prefix = st.sampled_from(["n", "node-", "gpu", "rack1-n", "", "a.b"])


@st.composite
def host_names(draw):
    """Unique host names with mixed prefixes, padding widths and gaps."""
    out, seen = [], set()
    for _ in range(draw(st.integers(0, 40))):
        prefix = draw(_prefix)
        width = draw(st.sampled_from([0, 2, 3, 4]))
        value = draw(st.integers(0, 1200))
        name = f"{prefix}{value:0{width}d}"
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


@settings(max_examples=300, deadline=None)
@given(host_names())
def test_compress_then_expand_gives_the_names_back_in_order(names):
    assert expand(compress(names)) == names


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), unique=True, min_size=1, max_size=60), st.sampled_from([0, 3, 5]))
def test_compressed_sorted_runs_are_one_bracket_group(values, width):
    names = [f"h{v:0{width}d}" for v in sorted(values)]
    text = compress(names)
    assert expand(text) == names
    if width and max(values) < 10**width:
        assert text.count("[") <= 1


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="n0123456789[]-,. x", max_size=30))
def test_any_text_expands_or_raises_hostlist_error(text):
    try:
        names = expand(text)
    except HostlistError:
        return
    assert all(isinstance(n, str) and n for n in names)
