"""The server-drawn overview: one bar per leaf group by job, one uplink bundle per group with its
total load, the spines, hatches, and a legend of the largest jobs."""

import re
import xml.etree.ElementTree as ET

import pytest

from apps.dashboard.figures import cluster_figure
from apps.dashboard.jobview import JobView
from apps.dashboard.layout import cluster_layout
from apps.dashboard.overview import group_uplinks, hatch_defs, legend_rows, load_color, overview_svg
from apps.placement.topology import load_topology

from .conftest import generated
from .test_figures import placed

NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_one_bar_segment_per_job_and_group_and_a_bundle_per_group_with_its_load(leafspine, dp16):
    # One job across both leaves: its traffic leaves each leaf over that leaf's two uplinks.
    spread = placed(leafspine, dp16, list(range(8)) + list(range(16, 24)))
    client = cluster_figure(cluster_layout(leafspine), [spread]).client
    root = parse(overview_svg(client))
    bars = root.findall(f"{NS}rect[@class='ov-bar']")
    job_bars = [b for b in bars if b.get("data-job") == "0"]
    assert len(job_bars) == 2  # the job's GPUs in each of the two groups
    assert {b.get("fill") for b in job_bars} == {client["jobs"][0]["color"]}
    assert all("job 1 · dp16 (alice): 8 GPUs here" in b.find(f"{NS}title").text for b in job_bars)
    bundles = root.findall(f"{NS}line[@class='ov-bundle']")
    assert len(bundles) == len(client["group_names"]) == 2
    ups = group_uplinks(client)
    assert [u["count"] for u in ups] == [2, 2]
    assert [u["cap"] for u in ups] == [800.0, 800.0]
    # The load of each group's bundle is the sum of its uplinks' predicted loads.
    links = client["links"]
    assert sum(u["load"] for u in ups) == pytest.approx(sum(links["load"][: links["n_uplinks"]]))
    for line, up in zip(bundles, ups, strict=True):
        share = up["load"] / up["cap"]
        assert share > 0
        assert float(line.get("data-load")) == pytest.approx(share, abs=1e-3)
        assert line.get("stroke") == load_color(share)
        assert re.search(
            r"2 uplinks, 800 GB/s; predicted load [\d.]+ GB/s \(\d+%\)", line.find(f"{NS}title").text
        )
    spines = root.findall(f"{NS}rect[@class='ov-switch']")
    assert sorted(s.find(f"{NS}title").text for s in spines) == ["spine-1", "spine-2"]


def test_a_job_inside_one_leaf_leaves_the_bundles_unloaded(leafspine, dp16):
    compact = placed(leafspine, dp16, list(range(16)))
    client = cluster_figure(cluster_layout(leafspine), [compact]).client
    root = parse(overview_svg(client))
    assert {line.get("data-load") for line in root.findall(f"{NS}line[@class='ov-bundle']")} == {"0.000"}
    # Free GPUs: the other group is wholly free.
    free = [b for b in root.findall(f"{NS}rect[@class='ov-bar']") if b.get("data-job") == "-2"]
    assert len(free) == 1 and "16 GPUs" in free[0].find(f"{NS}title").text


def test_many_spines_draw_as_one_band_with_their_count():
    topo = load_topology(
        generated("leaf-spine", spines=80, leaves=4, nodes_per_leaf=1, gpus_per_node=1, nics_per_node=1)
    )
    client = cluster_figure(cluster_layout(topo), []).client
    root = parse(overview_svg(client))
    (band,) = root.findall(f"{NS}rect[@class='ov-switch']")
    assert band.find(f"{NS}title").text == "80 spine switches"


def test_hatched_jobs_reference_a_defined_pattern_and_labels_are_escaped(leafspine):
    jobs = [JobView(id=i, label=f"job {i} <b>&", details=False, gids=(i,)) for i in range(14)]
    client = cluster_figure(cluster_layout(leafspine), jobs).client
    svg = overview_svg(client)
    root = parse(svg)  # parses: every label was escaped
    defined = set(re.findall(r'id="(ov-hatch-[a-z]+)"', hatch_defs()))
    used = set(re.findall(r"url\(#(ov-hatch-[a-z]+)\)", svg))
    assert used and used <= defined  # past the palette, jobs carry a hatch
    assert any("job 3 <b>&" in (t.text or "") for t in root.iter(f"{NS}title"))


def test_legend_rows_list_the_largest_jobs_first_and_count_the_rest(leafspine):
    jobs = [
        JobView(id=i, label=f"job {i}", details=False, gids=tuple(range(i * 2, i * 2 + 1 + i % 2)))
        for i in range(10)
    ]
    client = cluster_figure(cluster_layout(leafspine), jobs).client
    rows, more = legend_rows(client, limit=4)
    assert [r["gpus"] for r in rows] == [2, 2, 2, 2] and [r["label"] for r in rows] == [
        "job 1",
        "job 3",
        "job 5",
        "job 7",
    ]
    assert more == 6
    assert all(r["color"] == client["jobs"][r["index"]]["color"] for r in rows)


@pytest.mark.parametrize("leaves, all_shown", [(4, True), (96, False)])
def test_load_labels_never_touch_each_other(leaves, all_shown):
    """64 leaf groups of a 16k cluster ran their labels together ("0%0%0%..."): a label that would
    touch the last one drawn is left out, and a few groups keep all theirs."""
    from apps.dashboard.overview import LABEL_CHAR_W, LABEL_GAP

    topo = load_topology(
        generated("leaf-spine", spines=4, leaves=leaves, nodes_per_leaf=1, gpus_per_node=1, nics_per_node=1)
    )
    client = cluster_figure(cluster_layout(topo), []).client
    labels = parse(overview_svg(client)).findall(f"{NS}text[@class='ov-load']")
    spans = sorted(
        (
            float(t.get("x")) - LABEL_CHAR_W * len(t.text) / 2,
            float(t.get("x")) + LABEL_CHAR_W * len(t.text) / 2,
        )
        for t in labels
    )
    assert spans and all(b[0] - a[1] >= LABEL_GAP for a, b in zip(spans, spans[1:], strict=False))
    groups = sum(1 for u in group_uplinks(client) if u["count"])
    assert (len(labels) == groups) is all_shown
