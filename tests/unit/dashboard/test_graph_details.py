"""Details of the drawing and the pages: PCIe-only nodes are not NVLink domains, switches are
named, a path passes through its NICs, the job legend stays under metric overlays, a node page
shows its GPU-pair matrix."""

from __future__ import annotations

from apps.dashboard.figures import cluster_figure
from apps.dashboard.layout import cluster_layout
from apps.dashboard.paths import Endpoint, endpoints_path
from apps.placement.topology import load_topology_file, read_spec_file
from apps.topology.services import cluster_import

from .conftest import EXAMPLES
from .test_figures import placed


def _legend(fig):
    return [t["name"] for t in fig.figure["data"] if t.get("showlegend")]


def test_a_pcie_only_node_is_not_called_an_nvlink_domain():
    fig = cluster_figure(cluster_layout(load_topology_file(str(EXAMPLES / "pcie-lab.yaml"))), [])
    names = _legend(fig)
    assert "node without NVLink (PCIe only)" in names
    assert "NVLink domain" in names  # the cube-mesh node has NVLink pairs


def test_switches_are_named_on_the_graph(leafspine):
    fig = cluster_figure(cluster_layout(leafspine), [])
    switches = [t for t in fig.figure["data"] if t["meta"]["role"] == "switch"]
    assert switches and all(t["mode"] == "markers+text" for t in switches)
    assert sorted(n for t in switches for n in t["text"]) == sorted(s.name for s in leafspine.switches)
    assert all("hovertext" in t for t in switches)


def test_a_path_between_leaves_passes_through_both_nics(leafspine):
    lay = cluster_layout(leafspine)
    out = endpoints_path(lay, Endpoint(0, 0), Endpoint(len(leafspine.nodes) - 1, 0))
    first, last = out["hops"][0], out["hops"][-1]
    assert first["via"][1] == last["via"][1] == 1.75  # the NIC row
    assert first["via"][0] == round(float(lay.nic_x[lay.gpu_nic[0]]), 3)


def test_metric_overlays_keep_the_job_legend(leafspine, dp16):
    fig = cluster_figure(cluster_layout(leafspine), [placed(leafspine, dp16, list(range(16)))])
    outlines = [t for t in fig.figure["data"] if t["meta"]["role"] == "job-outline"]
    jobs = [t for t in fig.figure["data"] if t["meta"]["role"] == "gpu-job"]
    assert [t["name"] for t in outlines] == [t["name"] for t in jobs]
    assert all(t["showlegend"] for t in outlines)


def test_node_page_of_a_mesh_node_shows_its_gpu_pairs(client, people):
    cluster_import(data=read_spec_file(str(EXAMPLES / "pcie-lab.yaml")))
    client.force_login(people["alice"])
    html = client.get("/clusters/pcie-lab/nodes/mesh-box/").content.decode()
    table = html.split('id="gpu-pairs"')[1].split("</table>")[0]
    assert table.count('<th scope="row">GPU ') == 8
    assert 'title="NV2: 50 GB/s' in html and 'title="SYS: 4.2 GB/s' in html
    assert "no agent" in html  # never had an agent: not "up"
