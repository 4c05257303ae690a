"""Intra-node links (`nodes[].intra`): PCIe-only nodes and partial NVLink meshes through the spec,
the path model, the cost model, the lower bound and the topo solver."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from apps.placement.bounds import lower_bound
from apps.placement.convert import Source, import_sources
from apps.placement.costmodel import evaluate, ring_allreduce_ms
from apps.placement.solvers import place
from apps.placement.topology import SpecError, load_topology, topology_to_spec
from apps.placement.topology.examples import DGX1_CUBE_MESH, PCIE_TWO_SOCKETS, intra_spec
from tests.unit.placement.specs import job

DGX1_PCIE_VIEW = Path("/work/shared/data/topology/nvidia-smi-topo-mp_DGX-1-V100_8gpu_4nic_pcie-view.txt")


def box(links, name="box", nic_links=None) -> dict:
    """One 8-GPU node with intra links, four NICs (GPU pairs 0-1, 2-3, ...) on one leaf."""
    intra = intra_spec(links)
    if nic_links:
        intra["nic_links"] = nic_links
    nics = [
        {"name": f"mlx5_{k}", "gpus": [2 * k, 2 * k + 1], "leaf": "leaf-1", "bw_GBps": 12, "latency_us": 1.5}
        for k in range(4)
    ]
    return {
        "version": 1,
        "name": name,
        "gpu_models": {"V100": {"peak_tflops": 125}},
        "switches": [{"name": "leaf-1", "tier": "leaf"}],
        "nodes": [
            {
                "name": "n1",
                "gpu_model": "V100",
                "gpus": 8,
                "nvlink": {"domain": "n1", "bw_GBps": 50, "latency_us": 2},
                "nics": nics,
                "intra": intra,
            }
        ],
    }


def allreduce(gpus, tp=1) -> object:
    return job(gpus, tp=tp, comm=[("tp" if tp > 1 else "dp", "allreduce", 1e9)])


def busy(topo, *gpus):
    free = np.ones(topo.n_gpus, dtype=bool)
    free[list(gpus)] = False
    return free


def pcie_views():
    """The DGX-1 PCIe view imported by the converter (when the shared sample is here) and the
    same shape written by hand."""
    out = [pytest.param(lambda: load_topology(box(PCIE_TWO_SOCKETS)), id="two-socket-pcie")]
    marks = pytest.mark.skipif(not DGX1_PCIE_VIEW.exists(), reason="the shared DGX-1 sample is not here")
    out.append(
        pytest.param(
            lambda: import_sources(
                "nvidia-smi", [Source(DGX1_PCIE_VIEW.name, DGX1_PCIE_VIEW.read_text())]
            ).topology(),
            id="dgx1-pcie-view",
            marks=marks,
        )
    )
    return out


def pcie_class(topo, a: int, b: int) -> str:
    intra = topo.node_intra[0]
    return intra.links[topo.gpu_index[a]][topo.gpu_index[b]]


def test_intra_links_load_and_round_trip():
    spec = box(
        PCIE_TWO_SOCKETS, nic_links={"mlx5_0": ["PIX", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]}
    )
    topo = load_topology(spec)
    assert topo.path(0, 1).bw_GBps == 24 and topo.path(0, 2).bw_GBps == 14 and topo.path(0, 7).bw_GBps == 8
    assert topo.group_path([0, 1, 2, 3]).bw_GBps == 14
    assert topo.group_path([0, 1]).bw_GBps == 24
    assert topology_to_spec(load_topology(topology_to_spec(topo))) == topology_to_spec(topo)
    assert topology_to_spec(topo)["nodes"][0]["intra"]["links"][0][1] == "PIX"


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda i: i["links"][2].__setitem__(3, "PHB"), "nodes[0].intra.links[2][3]", "symmetric"),
        (lambda i: i["links"][1].__setitem__(0, "NV9"), "nodes[0].intra.links[1][0]", "unknown class"),
        (lambda i: i["links"].pop(), "nodes[0].intra.links", "one row per GPU"),
        (
            lambda i: i["classes"]["PIX"].__setitem__("bw_GBps", -1),
            "nodes[0].intra.classes.PIX.bw_GBps",
            "positive",
        ),
        (
            lambda i: i.__setitem__("nic_links", {"mlx5_9": ["PIX"] * 8}),
            "nodes[0].intra.nic_links.mlx5_9",
            "unknown NIC",
        ),
    ],
)
def test_bad_intra_links_are_refused_naming_the_field(change, field, message):
    spec = copy.deepcopy(box(PCIE_TWO_SOCKETS))
    change(spec["nodes"][0]["intra"])
    with pytest.raises(SpecError) as exc:
        load_topology(spec)
    assert any(p == field and message in m for p, m in exc.value.errors), exc.value.errors


def test_intra_links_need_a_domain_of_their_own():
    spec = box(PCIE_TWO_SOCKETS)
    other = copy.deepcopy(spec["nodes"][0])
    other["name"] = "n2"
    del other["intra"]
    spec["nodes"].append(other)
    with pytest.raises(SpecError, match="domain of its own"):
        load_topology(spec)


def test_a_nic_behind_the_other_socket_caps_its_gpus_network_bandwidth():
    far = ["SYS"] * 8
    topo = load_topology(box(PCIE_TWO_SOCKETS, nic_links={"mlx5_0": far}))
    assert topo.gpu_nic_bw[0] == 8 and topo.gpu_nic_bw[2] == 12


def test_cost_model_prices_a_pair_at_its_own_link():
    topo = load_topology(box(PCIE_TWO_SOCKETS))
    j = allreduce(2)
    pix, phb, sys_ = (evaluate(topo, j, g).comm_ms for g in ([0, 1], [0, 2], [0, 4]))
    assert pix == pytest.approx(ring_allreduce_ms(2, 1e9, 24, 5))
    assert phb == pytest.approx(ring_allreduce_ms(2, 1e9, 14, 5))
    assert sys_ == pytest.approx(ring_allreduce_ms(2, 1e9, 8, 5))


@pytest.mark.parametrize("gids", [[0, 1], [0, 2], [1, 6], [0, 1, 2, 3], [0, 1, 4, 5], list(range(8))])
def test_the_bound_stays_below_every_placement_on_the_node(gids):
    topo = load_topology(box(DGX1_CUBE_MESH))
    j = allreduce(len(gids))
    assert lower_bound(topo, j).comm_ms <= evaluate(topo, j, gids).comm_ms + 1e-9


@pytest.mark.parametrize("build", pcie_views())
def test_a_two_gpu_job_gets_a_pix_pair_on_the_pcie_view(build):
    topo = build()
    result = place(topo, busy(topo, 0), None, allreduce(2))
    assert pcie_class(topo, *result.gids) == "PIX"


@pytest.mark.parametrize("build", pcie_views())
def test_a_four_gpu_job_gets_one_socket_with_its_nearest_nics(build):
    topo = build()
    result = place(topo, busy(topo, 0), None, allreduce(4))
    assert sorted(result.gids) == [4, 5, 6, 7]
    node = topo.nodes[0]
    nics = {c.name for c in node.nics for g in c.gpus if g in result.gids}
    assert nics == {"mlx5_2", "mlx5_3"}
    # Each GPU's NIC sits under the same PCIe switch as the GPU.
    if DGX1_PCIE_VIEW.exists() and node.intra.nic_links:
        assert all(node.intra.nic_links[c.name][g] == "PIX" for c in node.nics for g in c.gpus)


def test_a_tp_pair_on_a_partial_nvlink_mesh_is_nvlink_connected():
    topo = load_topology(box(DGX1_CUBE_MESH))
    result = place(topo, busy(topo, 1, 2, 3, 4), None, allreduce(2, tp=2))
    assert pcie_class(topo, *result.gids).startswith("NV")


def test_tp_pairs_of_a_larger_job_on_a_partial_mesh_are_nvlink_connected():
    topo = load_topology(box(DGX1_CUBE_MESH))
    j = job(4, tp=2, comm=[("tp", "allreduce", 1e9), ("dp", "allreduce", 1e8)])
    result = place(topo, busy(topo, 0, 1, 2), None, j)
    for a, b in ((0, 1), (2, 3)):
        assert pcie_class(topo, result.gids[a], result.gids[b]).startswith("NV")


@pytest.mark.parametrize(
    ("links", "gids"),
    [
        (PCIE_TWO_SOCKETS, [0, 1]),
        (PCIE_TWO_SOCKETS, [0, 1, 2, 3]),
        (DGX1_CUBE_MESH, [4, 5, 6, 7]),
        (DGX1_CUBE_MESH, list(range(8))),
    ],
)
def test_the_bound_is_tight_for_the_best_subset_of_each_size(links, gids):
    spec = box(links)
    # Standalone, so that no network path can undercut the node's own links.
    node = spec["nodes"][0]
    node["standalone"] = True
    del node["nics"]
    spec["switches"] = []
    topo = load_topology(spec)
    j = allreduce(len(gids))
    bound, placed = lower_bound(topo, j).comm_ms, evaluate(topo, j, gids).comm_ms
    # Tight in bandwidth; the bound keeps the node's lowest latency, a few microseconds per step.
    assert placed * 0.999 <= bound <= placed + 1e-9
