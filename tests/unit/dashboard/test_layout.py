"""The layered drawing's geometry: tiers, node boxes, leaves over their nodes, rails."""

import numpy as np
import pytest

from apps.dashboard import layout as geo
from apps.dashboard.layout import cluster_layout, gpu_grid
from apps.placement.topology import load_topology

from .conftest import generated


def test_each_gpu_sits_inside_its_nodes_box(leafspine):
    lay = cluster_layout(leafspine)
    node = leafspine.gpu_node
    assert (lay.gpu_x > lay.node_x0[node]).all()
    assert (lay.gpu_x < lay.node_x1[node]).all()
    assert (lay.gpu_y > lay.node_y0[node]).all()


def test_node_boxes_do_not_overlap(leafspine):
    lay = cluster_layout(leafspine)
    assert (lay.node_x0[1:] > lay.node_x1[:-1]).all()


def test_tiers_stack_core_spine_leaf_nic_gpu():
    topo = load_topology(
        {
            "version": 1,
            "name": "3tier",
            "generate": {
                "shape": "leaf-spine",
                "spines": 1,
                "leaves": 2,
                "nodes_per_leaf": 1,
                "gpus_per_node": 4,
                "gpu_model": "A",
                "peak_tflops": 100,
                "nvlink_bw_GBps": 300,
                "nic_bw_GBps": 25,
                "nics_per_node": 1,
                "uplink_bw_GBps": 100,
                "pods": 2,
                "cores": 1,
            },
        }
    )
    lay = cluster_layout(topo)
    assert lay.switch_y["core-1"] > lay.switch_y["spine-1"] > lay.switch_y["leaf-1"] > geo.Y_NIC
    assert (lay.gpu_y < geo.Y_NIC).all()


def test_each_leaf_sits_over_its_own_nodes(leafspine):
    lay = cluster_layout(leafspine)
    for li, leaf in enumerate(leafspine.leaf_names):
        nodes = np.flatnonzero(leafspine.node_leaf == li)
        assert lay.node_x0[nodes].min() <= lay.switch_x[leaf] <= lay.node_x1[nodes].max()


def test_rail_optimized_cluster_has_one_rail_per_nic_position(rail):
    lay = cluster_layout(rail)
    assert lay.rail_optimized
    # NIC k of every node goes to the same leaf: rail k.
    for k in range(4):
        assert len(set(lay.nic_leaf[lay.nic_rail == k].tolist())) == 1


def test_leaf_spine_cluster_is_not_rail_optimized(leafspine):
    assert not cluster_layout(leafspine).rail_optimized


def test_parallel_cables_are_drawn_once_with_capacity_summed():
    spec = {
        "version": 1,
        "name": "two-cables",
        "gpu_models": {"A": {"peak_tflops": 100}},
        "switches": [{"name": "l1", "tier": "leaf"}, {"name": "s1", "tier": "spine"}],
        "links": [
            {"a": "l1", "b": "s1", "bw_GBps": 100, "latency_us": 1.0},
            {"a": "s1", "b": "l1", "bw_GBps": 50, "latency_us": 3.0},
        ],
        "nodes": [
            {
                "name": "n1",
                "gpu_model": "A",
                "gpus": 2,
                "nvlink": {"domain": "n1", "bw_GBps": 300, "latency_us": 1.0},
                "nics": [{"name": "m0", "gpus": [0, 1], "leaf": "l1", "bw_GBps": 25, "latency_us": 1.0}],
            }
        ],
    }
    lay = cluster_layout(load_topology(spec))
    assert lay.uplinks == (("l1", "s1", 150.0, 2.0),)


def test_aggregation_groups_are_the_nodes_of_each_leaf(leafspine):
    lay = cluster_layout(leafspine)
    assert lay.group_names == ("leaf-1 nodes", "leaf-2 nodes")
    assert lay.group_of_node.tolist() == [0, 0, 1, 1]
    assert lay.group_leaves == ((0,), (1,))


def test_gpu_grid_is_taller_than_wide_and_at_most_four_rows():
    assert gpu_grid(8) == (2, 4)
    assert gpu_grid(4) == (2, 2)
    assert gpu_grid(1) == (1, 1)
    cols, rows = gpu_grid(72)
    assert rows == 4 and cols * rows >= 72


def test_nic_markers_of_a_node_never_overlap():
    """One NIC per GPU on a grid two columns wide put four NIC markers on one spot: they are
    spread over the node's box, in the order of their GPUs' positions, and stay inside it."""
    topo = load_topology(generated("leaf-spine"))
    lay = cluster_layout(topo)
    for i, node in enumerate(topo.nodes):
        xs = sorted(float(lay.nic_x[k]) for k in range(lay.n_nics) if lay.nic_node[k] == i)
        assert len(xs) == len(node.nics) == 8
        assert min(b - a for a, b in zip(xs, xs[1:], strict=False)) >= 0.2
        assert lay.node_x0[i] <= xs[0] and xs[-1] <= lay.node_x1[i]
    # A node's only NIC stays above its GPUs.
    one = load_topology(generated("leaf-spine", nics_per_node=1))
    lay = cluster_layout(one)
    assert lay.nic_x[0] == pytest.approx(float(lay.gpu_x[:8].mean()))
