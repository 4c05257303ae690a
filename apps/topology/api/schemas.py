"""OpenAPI descriptions of the topology spec v1 bodies (spec/topology-v1.md): the full form and the
compact `generate:` form. These serializers only describe; `apps.placement.topology.load_topology`
validates."""

from __future__ import annotations

from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from apps.placement.topology import SHAPES

from ..choices import SwitchTier
from .serializers import ClusterImportSerializer


class GpuModelSchema(serializers.Serializer):
    peak_tflops = serializers.FloatField(min_value=0, help_text="dense BF16/FP16 peak, TFLOP/s")
    speed = serializers.FloatField(
        min_value=0, required=False, help_text="measured speed relative to the other models (all or none)"
    )


class SwitchSchema(serializers.Serializer):
    name = serializers.CharField()
    tier = serializers.ChoiceField(choices=SwitchTier.values)


class LinkSchema(serializers.Serializer):
    a = serializers.CharField(help_text="switch name")
    b = serializers.CharField(help_text="switch name")
    bw_GBps = serializers.FloatField(min_value=0)
    latency_us = serializers.FloatField(min_value=0)


class NvlinkSchema(serializers.Serializer):
    domain = serializers.CharField()
    bw_GBps = serializers.FloatField(min_value=0)
    latency_us = serializers.FloatField(min_value=0)
    nvls = serializers.BooleanField(
        required=False,
        help_text="whether the domain's switches run NVLS (NVLink SHARP); default from the GPU model",
    )


class NicSchema(serializers.Serializer):
    name = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=0), help_text="GPU indices")
    leaf = serializers.CharField(help_text="leaf switch name")
    bw_GBps = serializers.FloatField(min_value=0)
    latency_us = serializers.FloatField(min_value=0)


class NodeSchema(serializers.Serializer):
    name = serializers.CharField()
    gpu_model = serializers.CharField(help_text="a key of gpu_models")
    gpus = serializers.IntegerField(min_value=1)
    nvlink = NvlinkSchema()
    nics = NicSchema(many=True, required=False)
    dcgm_url = serializers.URLField(required=False)
    standalone = serializers.BooleanField(required=False)


class TopologySpecFullSchema(serializers.Serializer):
    """Topology spec v1, full form."""

    version = serializers.ChoiceField(choices=[1])
    name = serializers.CharField(help_text="cluster name, unique")
    gpu_models = serializers.DictField(child=GpuModelSchema())
    switches = SwitchSchema(many=True)
    links = LinkSchema(many=True, required=False)
    nodes = NodeSchema(many=True)


class GenerateSchema(serializers.Serializer):
    shape = serializers.ChoiceField(choices=SHAPES)
    spines = serializers.IntegerField(min_value=1)
    leaves = serializers.IntegerField(min_value=1)
    nodes_per_leaf = serializers.IntegerField(min_value=1)
    gpus_per_node = serializers.IntegerField(min_value=1)
    gpu_model = serializers.CharField()
    peak_tflops = serializers.FloatField(min_value=0)
    nvlink_bw_GBps = serializers.FloatField(min_value=0)
    nic_bw_GBps = serializers.FloatField(min_value=0)
    nics_per_node = serializers.IntegerField(min_value=1)
    uplink_bw_GBps = serializers.FloatField(min_value=0)
    pods = serializers.IntegerField(min_value=1, required=False)
    cores = serializers.IntegerField(min_value=0, required=False)
    core_uplink_bw_GBps = serializers.FloatField(min_value=0, required=False)
    nvlink_domain_nodes = serializers.IntegerField(min_value=1, required=False)
    nvlink_latency_us = serializers.FloatField(min_value=0, required=False)
    nic_latency_us = serializers.FloatField(min_value=0, required=False)
    uplink_latency_us = serializers.FloatField(min_value=0, required=False)
    core_uplink_latency_us = serializers.FloatField(min_value=0, required=False)
    nvls = serializers.BooleanField(required=False)


class TopologySpecGenerateSchema(serializers.Serializer):
    """Topology spec v1, compact `generate:` form (expanded by the importer)."""

    version = serializers.ChoiceField(choices=[1])
    name = serializers.CharField()
    generate = GenerateSchema()


TOPOLOGY_SPEC = PolymorphicProxySerializer(
    component_name="TopologySpecV1",
    serializers=[TopologySpecFullSchema, TopologySpecGenerateSchema],
    resource_type_field_name=None,
)

IMPORT_BODY = {
    "application/json": TOPOLOGY_SPEC,
    "application/yaml": TOPOLOGY_SPEC,
    "text/yaml": TOPOLOGY_SPEC,
    "multipart/form-data": ClusterImportSerializer,
}
