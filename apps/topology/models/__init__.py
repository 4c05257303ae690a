"""Topology models: clusters, switches and links, NVLink domains, nodes, NICs and GPUs."""

from .base import NAME_MAX_LENGTH, URL_MAX_LENGTH, touch_cluster, validate_positive
from .cluster import Cluster, GpuModel
from .imports import ClusterImport
from .network import Link, Switch
from .nodes import Gpu, Nic, Node, NvlinkDomain

__all__ = [
    "NAME_MAX_LENGTH",
    "URL_MAX_LENGTH",
    "Cluster",
    "ClusterImport",
    "Gpu",
    "GpuModel",
    "Link",
    "Nic",
    "Node",
    "NvlinkDomain",
    "Switch",
    "touch_cluster",
    "validate_positive",
]
