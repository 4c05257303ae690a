"""The cluster figure: GPU traces, legend, hover, link load, aggregate, highlight data."""

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from apps.dashboard.figures import MAX_JOB_TRACES, cluster_figure, leaf_loads
from apps.dashboard.jobview import JobView, job_view
from apps.dashboard.layout import cluster_layout
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


def test_link_load_buckets_follow_the_jobs_flows_per_leaf(leafspine):
    jobs = [JobView(id=1, label="a", details=False, gids=(0,), flows={"leaf-1": 3.0})]
    lay = cluster_layout(leafspine)
    assert leaf_loads(lay, jobs).tolist() == [3.0, 0.0]
    fig = cluster_figure(lay, jobs)
    names = {t["name"]: t for t in traces(fig, "load")}
    assert set(names) == {"link load: no heavy flows", "link load: 2-4 flows"}
    busy = names["link load: 2-4 flows"]
    # Both of leaf-1's uplinks (one per spine): two segments of three points each.
    assert len(busy["x"]) == 6
    assert busy["meta"]["load_width"] > names["link load: no heavy flows"]["meta"]["load_width"]
    assert fig.client["leaf_flows"] == {"leaf-1": 3.0}


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


def test_aggregate_reports_busy_share_per_leaf(leafspine):
    jobs = [JobView(id=1, label="a", details=False, gids=tuple(range(8)), mfu=0.4)]
    fig = cluster_figure(cluster_layout(leafspine), jobs)
    (agg,) = traces(fig, "agg")
    assert fig.client["aggregate"]["placement"] == [0.5, 0.0]
    assert fig.client["aggregate"]["mfu"] == [0.4, None]
    assert "16 GPUs, 8 busy" in agg["text"][0]


def test_rails_are_drawn_as_separate_coloured_traces(rail):
    fig = cluster_figure(cluster_layout(rail), [])
    wires = traces(fig, "wire")
    assert [t["name"] for t in wires] == ["rail 0", "rail 1", "rail 2", "rail 3"]
    assert len({t["line"]["color"] for t in wires}) == 4


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
    assert len(traces(fig, "gpu-free")[0]["x"]) == topo.n_gpus
    assert np.all(np.asarray(fig.client["gpu_job"]) == -1)


def test_large_clusters_draw_per_gpu_layers_with_webgl_and_the_rest_with_svg():
    from apps.placement.topology import load_topology

    from .conftest import generated

    big = load_topology(generated("leaf-spine", leaves=8, nodes_per_leaf=80))  # 5,120 GPUs
    fig = cluster_figure(cluster_layout(big), [])
    kinds = {t["meta"]["role"]: t["type"] for t in fig.figure["data"]}
    assert kinds["gpu-free"] == kinds["wire"] == "scattergl"
    assert kinds["agg"] == kinds["load"] == kinds["switch"] == "scatter"
    small = cluster_figure(cluster_layout(load_topology(generated("leaf-spine"))), [])
    assert {t["type"] for t in small.figure["data"]} == {"scatter"}


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
