"""The fast exporter-text parser against prometheus-client's (the reference): the same Scrape on
real dcgm-exporter pages and the simulated exporter's, read without the reference; anything else
(escapes, odd spacing, a kept field typed counter, garbage) gives the reference's answer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.metrics import exposition
from apps.metrics.exposition import GPU_FIELDS, IB_RX, IB_TX, parse_scrape, parse_scrape_reference
from apps.metrics.simulate import RunningJob, gpu_states, node_pages
from apps.placement.jobs import load_job
from apps.placement.solvers import place
from apps.placement.topology import load_topology, read_spec_file

from .conftest import FIXTURES, REPO


def outcome(parse, text: str, n_gpus: int | None = 8):
    """("ok", scrape) or ("error", exception type) of parsing `text`."""
    try:
        return "ok", parse(text, n_gpus=n_gpus)
    except Exception as exc:  # noqa: BLE001 - the two parsers must fail alike, whatever the type
        return "error", type(exc)


def simulated_pages() -> list[str]:
    topo = load_topology(read_spec_file(REPO / "examples" / "case-4-4.yaml"))
    job = load_job(read_spec_file(REPO / "examples" / "case-4-4-job.yaml"))
    placed = place(topo, np.ones(topo.n_gpus, dtype=bool), {}, job, policy="naive")
    return list(node_pages(topo, gpu_states(topo, topo, [RunningJob(job, placed.gids)], {})).values())


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.prom")), ids=lambda p: p.name[:40])
def test_real_exporter_pages_are_read_without_the_reference_and_alike(path):
    text = path.read_text()
    # _parse_canonical raises when it would hand the page to the reference parser.
    fast = exposition._parse_canonical(text, 8)
    assert fast == parse_scrape_reference(text, n_gpus=8)
    assert fast.gpus and parse_scrape(text, n_gpus=8) == fast


def test_simulated_exporter_pages_are_read_without_the_reference_and_alike():
    pages = simulated_pages()
    assert pages
    for text in pages:
        fast = exposition._parse_canonical(text, 8)
        assert fast == parse_scrape_reference(text, n_gpus=8)
        assert len(fast.gpus) == 8


@pytest.mark.parametrize(
    "text",
    [
        # An escaped quote in a label value, tabs, leading spaces: the reference reads them.
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-\\"x\\""} 61\n',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"}\t61\n',
        '  DCGM_FI_DEV_GPU_TEMP{gpu="1"} 61\n',
        'DCGM_FI_DEV_GPU_TEMP{ gpu = "2" } 61\n',
        # A kept field typed counter: prometheus-client renames its samples (so keeps none).
        '# TYPE DCGM_FI_DEV_XID_ERRORS counter\nDCGM_FI_DEV_XID_ERRORS{gpu="0"} 13\n',
        '#  TYPE DCGM_FI_DEV_XID_ERRORS counter\nDCGM_FI_DEV_XID_ERRORS{gpu="0"} 13\n',
        # node-exporter's counter typed without _total: its samples become the kept _total ones.
        "# TYPE node_infiniband_port_data_received_bytes counter\n"
        'node_infiniband_port_data_received_bytes{device="mlx5_0",port="1"} 7\n',
        # Values between the value and the timestamp (ignored there).
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 61 12 13\n',
    ],
)
def test_pages_it_does_not_read_itself_get_the_references_answer(text):
    with pytest.raises(exposition._NotCanonical):
        exposition._parse_canonical(text, 8)
    assert outcome(parse_scrape, text) == outcome(parse_scrape_reference, text)


@pytest.mark.parametrize(
    "text",
    [
        "<html>502 Bad Gateway</html>\n{{{",
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-3431',  # truncated
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 61\n',  # a label named twice
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 6_1\n',
        "# TYPE DCGM_FI_DEV_GPU_TEMP\n",
    ],
)
def test_what_the_reference_refuses_is_refused(text):
    assert outcome(parse_scrape_reference, text)[0] == "error"
    assert outcome(parse_scrape, text) == outcome(parse_scrape_reference, text)


def test_rejections_read_alike():
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 900\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0"} NaN\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="9"} 0.5\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="x",GPU_I_ID="abc"} 0.5\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1",GPU_I_ID="1234567890"} 0.5\n'
        f'{IB_RX}{{device="",port="1"}} 5 1700000000000\n'
        # An integer out of range: an int in the message, as the reference reads it.
        f'{IB_TX}{{device="mlx5_0",port="1"}} -5\n'
    )
    fast = exposition._parse_canonical(text, 8)
    assert fast.rejected_count == 7 and "-5 is not a byte count" in fast.rejected[-1]
    assert fast == parse_scrape_reference(text, n_gpus=8)


# Lines of every kind, canonical or not; a page is any sequence of them.
_NAMES = [*GPU_FIELDS, IB_TX, IB_RX, "DCGM_FI_DEV_SM_CLOCK", "node_load1", "x:y_total"]
_LABEL_VALUES = st.sampled_from(["0", "1", "7", "9", "x", "", "13", "mlx5_0", 'a"b', "a\\b", "a,b=c}", "é"])
_VALUES = st.sampled_from(
    ["0", "1", "61", "0.5", "1e3", "-1", "+Inf", "-Inf", "NaN", "1_0", "0x10", "", ".5", "7.", "1" * 41]
)


@st.composite
def _sample_line(draw) -> str:
    name = draw(st.sampled_from(_NAMES))
    keys = draw(
        st.lists(st.sampled_from(["gpu", "GPU_I_ID", "device", "port", "UUID", "__x", "_", "1a"]), max_size=4)
    )
    quote = draw(st.sampled_from(['"', '"', "'"]))
    body = ",".join(f"{k}={quote}{draw(_LABEL_VALUES)}{quote}" for k in keys)
    if draw(st.booleans()):
        body = body.replace('a"b', 'a\\"b')
    labels = "{" + body + draw(st.sampled_from(["", ",", " "])) + "}" if keys or draw(st.booleans()) else ""
    sep = draw(st.sampled_from([" ", " ", "  ", "\t", ""]))
    stamp = draw(st.sampled_from(["", "", " 1700000000000", "\t17", " x"]))
    tail = draw(st.sampled_from(["", "", " ", "\r", "\x0b"]))
    return f"{name}{labels}{sep}{draw(_VALUES)}{stamp}{tail}"


_COMMENTS = st.sampled_from(
    [
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        '# HELP DCGM_FI_DEV_GPU_TEMP "quoted',
        "# HELP",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        "# TYPE DCGM_FI_DEV_GPU_TEMP counter",
        f"# TYPE {IB_TX} counter",
        f"# TYPE {IB_TX.removesuffix('_total')} counter",
        "# TYPE DCGM_FI_DEV_GPU_TEMP",
        "# TYPE 1bad gauge",
        "#TYPE DCGM_FI_DEV_GPU_TEMP counter",
        "# a comment",
        "#",
        "",
        "   ",
        "<html>",
    ]
)


@settings(max_examples=300)
@given(st.lists(st.one_of(_sample_line(), _COMMENTS), max_size=8), st.sampled_from([None, 8]))
def test_any_page_reads_as_the_reference_reads_it(lines, n_gpus):
    text = "\n".join(lines)
    assert outcome(parse_scrape, text, n_gpus) == outcome(parse_scrape_reference, text, n_gpus)
