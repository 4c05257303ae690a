"""The cluster figure: GPU traces, legend, hover, link load, aggregate, highlight data."""

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from apps.dashboard.figures import MAX_JOB_TRACES, cluster_figure, job_styles
from apps.dashboard.jobview import JobView, job_view
from apps.dashboard.layout import cluster_layout
from apps.dashboard.links import link_loads
from apps.dashboard.traces import JOB_PALETTE, job_style
from apps.placement.costmodel import evaluate
from apps.placement.solvers import prediction_output

BAD_CASE44 = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def traces(fig, role):
    return [t for t in fig.figure["data"] if t["meta"]["role"] == role]


def placed(topo, job, gids, *, id=1, label="job 1 · dp16 (alice)", details=True):
    p = evaluate(topo, job, gids)
    return job_view(
        topo,
        id=id,
        label=label,
        details=details,
        job=job,
        gids=gids,
        predicted=prediction_output(p),
        flows=p.flows,
    )


def test_every_gpu_is_drawn_once_across_free_and_job_traces(leafspine, dp16):
    jobs = [placed(leafspine, dp16, list(range(16)))]
    fig = cluster_figure(cluster_layout(leafspine), jobs)
    gids = [g for t in traces(fig, "gpu-free") + traces(fig, "gpu-job") for g in t["customdata"]]
    assert sorted(gids) == list(range(leafspine.n_gpus))


def test_legend_has_one_entry_per_job_in_its_colour(leafspine, dp16):
    a = placed(leafspine, dp16, list(range(16)), id=1, label="job 1")
    b = placed(leafspine, dp16, list(range(16, 32)), id=2, label="job 2")
    fig = cluster_figure(cluster_layout(leafspine), [a, b])
    job_traces = traces(fig, "gpu-job")
    assert [t["name"] for t in job_traces] == ["job 1", "job 2"]
    assert all(t["showlegend"] for t in job_traces)
    assert job_traces[0]["marker"]["color"] != job_traces[1]["marker"]["color"]
    assert [j["color"] for j in fig.client["jobs"]] == [t["marker"]["color"] for t in job_traces]


def test_free_gpus_are_grey_and_counted_in_the_legend(leafspine, dp16):
    fig = cluster_figure(cluster_layout(leafspine), [placed(leafspine, dp16, list(range(16)))])
    (free,) = traces(fig, "gpu-free")
    assert free["name"] == "free (16)"
    assert free["marker"]["color"] == "#c4c8cc"


def test_jobs_past_the_legend_cap_share_one_trace():
    from apps.placement.topology import load_topology

    from .conftest import generated

    topo = load_topology(generated("leaf-spine", leaves=4, nodes_per_leaf=4))
    n_jobs = MAX_JOB_TRACES + 10
    jobs = [JobView(id=i, label=f"job {i}", details=False, gids=(i,)) for i in range(n_jobs)]
    fig = cluster_figure(cluster_layout(topo), jobs)
    job_traces = traces(fig, "gpu-job")
    assert len(job_traces) == MAX_JOB_TRACES + 1
    assert job_traces[-1]["name"] == "10 more jobs"
    assert sum(len(t["customdata"]) for t in job_traces) == n_jobs


def test_hover_data_gives_each_rank_its_groups_level_and_bottleneck(case44, case44_job):
    job = placed(case44, case44_job, BAD_CASE44, label="job 1 · bert (alice)")
    client = cluster_figure(cluster_layout(case44), [job]).client
    # gid 8 is node-b GPU 0, which holds rank 4 in the bad mapping.
    assert client["node_names"][client["gpu_node"][8]] == "node-b"
    assert client["gpu_index"][8] == 0
    assert client["gpu_rank"][8] == 4
    (hover,) = client["jobs"]
    dp_row = hover["groups"]["dp"][hover["rank_group"]["dp"][4]]
    assert dp_row[:4] == [0, 8, "leaf", 11.0]
    assert dp_row[4] == pytest.approx(109.0909, rel=1e-4)
    pp_row = hover["groups"]["pp"][hover["rank_group"]["pp"][4]]
    # Ranks 4 and 12 both sit on node-b; PP is not priced by this job.
    assert pp_row[:3] == [4, 2, "nvlink"] and pp_row[4] is None


def test_gpu_traces_leave_hover_text_to_the_client(case44, case44_job):
    fig = cluster_figure(cluster_layout(case44), [placed(case44, case44_job, BAD_CASE44)])
    # Hover strings are built in the browser from the compact data: they are not sent twice.
    assert all(t["text"] == [] for t in traces(fig, "gpu-job") + traces(fig, "gpu-metric"))


def test_other_users_job_sends_no_ranks_or_groups(case44, case44_job):
    job = placed(case44, case44_job, BAD_CASE44, label="job 1 (other user)", details=False)
    (hover,) = cluster_figure(cluster_layout(case44), [job]).client["jobs"]
    assert hover["details"] is False
    assert hover["groups"] == {} and hover["rank_group"] == {}
    assert hover["url"] is None


def test_metric_overlays_carry_each_jobs_predicted_values(leafspine):
    a = JobView(id=1, label="a", details=False, gids=tuple(range(8)), mfu=0.5, util=0.9, comm_share=0.1)
    b = JobView(id=2, label="b", details=False, gids=tuple(range(8, 12)), mfu=0.25, util=0.6, comm_share=0.4)
    fig = cluster_figure(cluster_layout(leafspine), [a, b])
    (metric,) = traces(fig, "gpu-metric")
    by_gid = dict(zip(metric["customdata"], fig.client["metrics"]["mfu"], strict=True))
    assert by_gid[0] == 0.5 and by_gid[9] == 0.25
    comm = dict(zip(metric["customdata"], fig.client["metrics"]["comm"], strict=True))
    assert comm[3] == 0.1 and comm[10] == 0.4
    assert metric["visible"] is False  # the page opens on the placement overlay


def test_link_loads_put_a_cross_leaf_jobs_traffic_on_its_nics_and_both_leaves_uplinks(leafspine, dp16):
    lay = cluster_layout(leafspine)
    # Ranks on nodes 0 and 2 (leaf-1 and leaf-2): one DP group crossing the spine.
    spread = placed(leafspine, dp16, list(range(8)) + list(range(16, 24)))
    (dp,) = spread.groups["dp"]
    step = spread.step_ms
    rate = dp.bottleneck_GBps * dp.time_ms / step
    loads = link_loads(lay, [spread])
    busy_nics = np.flatnonzero(loads.nic_load > 0)
    assert busy_nics.size == 16
    assert loads.nic_load[busy_nics] == pytest.approx(rate, rel=1e-3)
    assert loads.nic_job[busy_nics].tolist() == [0] * 16 and loads.nic_jobs == {}
    assert loads.leaf_jobs[0][0] == pytest.approx(8 * rate / 2, rel=1e-3)
    # Half of the group is under the other leaf: half of each member's rate leaves its leaf,
    # spread over the leaf's two uplinks by capacity.
    per_leaf = 8 * rate / 2
    for i, (lo, _hi, _, _) in enumerate(lay.uplinks):
        expected = per_leaf / 2 if lo in ("leaf-1", "leaf-2") else 0.0
        assert loads.up_load[i] == pytest.approx(expected, rel=1e-3)
    assert loads.up_cap.tolist() == [bw for _, _, bw, _ in lay.uplinks]
    # Trunks add up their cables.
    assert loads.trunk_load.sum() == pytest.approx(loads.nic_load.sum())
    assert loads.trunk_cap.sum() == pytest.approx(loads.nic_cap.sum())


def test_a_job_inside_one_leaf_loads_no_uplink(leafspine, dp16):
    compact = placed(leafspine, dp16, list(range(16)))
    loads = link_loads(cluster_layout(leafspine), [compact])
    assert loads.nic_load.sum() > 0
    assert loads.up_load.sum() == 0


def test_other_users_jobs_still_load_the_links(leafspine, dp16):
    gids = list(range(8)) + list(range(16, 24))
    mine = placed(leafspine, dp16, gids)
    theirs = placed(leafspine, dp16, gids, details=False)
    lay = cluster_layout(leafspine)
    assert theirs.groups == {}
    assert link_loads(lay, [theirs]).up_load.tolist() == link_loads(lay, [mine]).up_load.tolist()


def test_link_data_names_each_loaded_links_jobs(leafspine, dp16):
    lay = cluster_layout(leafspine)
    fig = cluster_figure(lay, [placed(leafspine, dp16, list(range(8)) + list(range(16, 24)))])
    links = fig.client["links"]
    assert links["n_uplinks"] == len(lay.uplinks)
    assert (
        len(links["cap"])
        == len(links["load"])
        == len(links["seg"])
        == len(lay.uplinks) + len(links["trunk_rail"])
    )
    # Both leaves' uplinks carry the job: its traffic per leaf, shared by the leaf's uplinks.
    names = links["switches"]
    assert {names[int(k)] for k in links["leaf_jobs"]} == {"leaf-1", "leaf-2"}
    for rows in links["leaf_jobs"].values():
        assert rows[0][0] == 0 and rows[0][1] > 0
    # Trunks name their jobs; NICs whose own GPUs hold the job need no entry.
    trunks = [i for i, v in enumerate(links["load"]) if v > 0 and i >= links["n_uplinks"]]
    assert trunks and all(links["jobs"][str(i)][0][0] == 0 for i in trunks)
    assert len(links["nic_load"]) == 16 and links["nic_jobs"] == {}
    assert len(traces(fig, "load")) == 6  # one per bucket, filled by the client


def test_highlight_data_lists_the_links_a_cross_leaf_job_crosses(leafspine, dp16):
    lay = cluster_layout(leafspine)
    # Ranks on nodes 0 and 2 (gids 0-7 and 16-23): the DP group crosses the spine.
    spread = placed(leafspine, dp16, list(range(8)) + list(range(16, 24)))
    compact = placed(leafspine, dp16, list(range(16)), id=2)
    fig = cluster_figure(lay, [spread])
    (hl,) = fig.client["jobs"]
    assert len(hl["nics"]) == 16
    ups = {lay.uplinks[i][0] for i in hl["uplinks"]}
    assert ups == {"leaf-1", "leaf-2"}
    fig2 = cluster_figure(lay, [compact])
    # Two nodes under one leaf: NIC cables are crossed, uplinks are not.
    assert fig2.client["jobs"][0]["uplinks"] == []
    assert len(fig2.client["jobs"][0]["nics"]) == 16


def test_zoomed_out_bars_stack_jobs_then_free_gpus_per_leaf_group(leafspine):
    # leaf-1's nodes: job a on all of node 0 and 2 GPUs of node 1; node 1 keeps 6 free GPUs.
    a = JobView(id=1, label="a", details=False, gids=tuple(range(10)), mfu=0.4)
    fig = cluster_figure(cluster_layout(leafspine), [a])
    (bar,) = traces(fig, "agg")
    bars = fig.client["bars"]
    rows = [(g, j, n) for g, j, n in zip(bars["group"], bars["job"], bars["gpus"], strict=True)]
    # Group 0: the job, then the free GPUs on node 1; group 1: two wholly free nodes.
    assert rows == [(0, 0, 10), (0, -1, 6), (1, -2, 16)]
    assert bar["marker"]["color"][0] == fig.client["jobs"][0]["color"]
    assert "largest free block: 0 whole nodes (0 GPUs); most free on one node: 6" in bar["hovertext"][1]
    assert "largest free block: 2 whole nodes (16 GPUs)" in bar["hovertext"][2]
    # Each group's bar fills the GPU band whatever its size.
    assert bar["y"][0] + bar["y"][1] == pytest.approx(bar["y"][2])


def test_job_styles_differ_between_neighbouring_jobs_and_use_safe_colours(leafspine):
    jobs = [JobView(id=i, label=f"j{i}", details=False, gids=(i,)) for i in range(30)]
    lay = cluster_layout(leafspine)
    styles = job_styles(lay, jobs)
    assert len(set(styles)) == 30  # all on one small cluster: every job its own look
    colors = [job_style(s)[0] for s in styles]
    assert set(colors) <= set(JOB_PALETTE)
    assert "#d62728" not in colors and "#2ca02c" not in colors  # D3's red and green are gone
    # Past the palette, the colour repeats with a mark inside the GPU squares.
    assert job_style(styles[len(JOB_PALETTE)])[1] != "square"


def test_metric_overlays_keep_an_outline_per_job(leafspine):
    a = JobView(id=1, label="a", details=False, gids=tuple(range(10)), mfu=0.4)
    fig = cluster_figure(cluster_layout(leafspine), [a])
    (outline,) = traces(fig, "job-outline")
    assert outline["line"]["color"] == fig.client["jobs"][0]["color"]
    # One box (five corners and a gap) per node the job touches.
    assert len(outline["x"]) == 12


def test_rails_are_drawn_as_separate_coloured_bundles(rail):
    lay = cluster_layout(rail)
    fig = cluster_figure(lay, [])
    wires = traces(fig, "wire")
    trunks = traces(fig, "trunk")
    assert [t["name"] for t in trunks] == ["rail 0", "rail 1", "rail 2", "rail 3"]
    assert len({t["line"]["color"] for t in trunks}) == 4
    # One bundle per (leaf group, leaf) pair; the client draws each rail's cables and bundles.
    assert [t["meta"]["rail"] for t in wires] == [0, 1, 2, 3]
    links = fig.client["links"]
    trunks_of_rail = [links["trunk_rail"].count(r) for r in range(4)]
    assert trunks_of_rail == [len(lay.group_names)] * 4
    assert sum(links["trunk_cables"]) == lay.n_nics


def test_figure_is_valid_plotly_json(case44, case44_job):
    fig = cluster_figure(cluster_layout(case44), [placed(case44, case44_job, BAD_CASE44)])
    go.Figure(fig.figure)  # raises on any property Plotly does not know
    json.dumps(fig.client, allow_nan=False)


@pytest.mark.parametrize("n_nodes", [1, 3])
def test_empty_cluster_draws_only_free_gpus(n_nodes):
    from apps.placement.topology import load_topology

    from .conftest import generated

    topo = load_topology(generated("leaf-spine", leaves=1, nodes_per_leaf=n_nodes, spines=1))
    fig = cluster_figure(cluster_layout(topo), [])
    assert traces(fig, "gpu-job") == []
    assert len(traces(fig, "gpu-free")[0]["customdata"]) == topo.n_gpus
    assert np.all(np.asarray(fig.client["gpu_job"]) == -1)


def test_large_clusters_send_each_gpus_position_once():
    from apps.placement.topology import load_topology

    from .conftest import generated

    big = load_topology(generated("leaf-spine", leaves=8, nodes_per_leaf=80))  # 5,120 GPUs
    fig = cluster_figure(cluster_layout(big), [])
    # Per-GPU, per-NIC and per-node traces carry ids; coordinates come once in the client data.
    for role in ("gpu-free", "nic", "node", "wire", "link", "uplink"):
        assert all(t["x"] == [] for t in traces(fig, role)), role
    assert len(fig.client["gpu_x"]) == big.n_gpus
    # SVG throughout: the client hands Plotly only what is near the visible range.
    assert {t["type"] for t in fig.figure["data"]} == {"scatter", "bar"}


def test_nodes_with_intra_links_draw_their_nvlink_and_pcie_switch_pairs():
    from apps.dashboard.figures import cluster_figure
    from apps.dashboard.layout import cluster_layout
    from apps.placement.topology import load_topology

    links = [
        ["X", "NV2", "PIX", "SYS"],
        ["NV2", "X", "SYS", "PIX"],
        ["PIX", "SYS", "X", "NV1"],
        ["SYS", "PIX", "NV1", "X"],
    ]
    classes = {
        c: {"bw_GBps": bw, "latency_us": 2} for c, bw in (("NV2", 50), ("NV1", 25), ("PIX", 20), ("SYS", 8))
    }
    spec = {
        "version": 1,
        "name": "mesh",
        "gpu_models": {"V100": {"peak_tflops": 125}},
        "switches": [{"name": "leaf-1", "tier": "leaf"}],
        "nodes": [
            {
                "name": "n1",
                "gpu_model": "V100",
                "gpus": 4,
                "nvlink": {"domain": "n1", "bw_GBps": 50, "latency_us": 2},
                "nics": [
                    {"name": "mlx5_0", "gpus": [0, 1, 2, 3], "leaf": "leaf-1", "bw_GBps": 12, "latency_us": 1}
                ],
                "intra": {"links": links, "classes": classes},
            }
        ],
    }
    fig = cluster_figure(cluster_layout(load_topology(spec)), []).figure
    by_name = {t["name"]: t for t in fig["data"]}
    assert by_name["NVLink pairs"]["x"].count(None) == 2  # 0-1 and 2-3
    assert by_name["PCIe switch pairs"]["x"].count(None) == 2  # 0-2 and 1-3
    hovers = by_name["intra-node links"]["text"]
    assert "n1 GPU 0 - GPU 1: NV2, 50 GB/s, 2 us" in hovers and not any("SYS" in h for h in hovers)


def test_a_nic_shared_by_two_jobs_lists_both_with_their_rates():
    from apps.placement.topology import load_topology

    from .conftest import generated

    topo = load_topology(generated("leaf-spine", nics_per_node=4))  # each NIC serves two GPUs
    a = JobView(id=1, label="a", details=False, gids=(0,), net_rates=((0, "leaf", 2.0),))
    b = JobView(id=2, label="b", details=False, gids=(1,), net_rates=((1, "leaf", 3.0),))
    lay = cluster_layout(topo)
    loads = link_loads(lay, [a, b])
    assert loads.nic_load[0] == 5.0 and loads.nic_job[0] == -2
    assert loads.nic_jobs == {0: {0: 2.0, 1: 3.0}}
    client = cluster_figure(lay, [a, b]).client["links"]
    assert client["nic_jobs"] == {"0": [[1, 3.0], [0, 2.0]]}
    assert client["nic_load"] == {"0": 5.0}
