"""OpenAPI descriptions of the scheduling API's free-form bodies: the job spec v1 (request) and
the placement and preview outputs (responses). These serializers only describe; the placement
core's loader (`apps.placement.jobs.load_job`) validates. And the postprocessing hook that
explains each status of its enums (settings SPECTACULAR_SETTINGS POSTPROCESSING_HOOKS)."""

from __future__ import annotations

from rest_framework import serializers

from apps.placement.jobs import COLLECTIVES, GROUP_KINDS, POLICY_NAMES

from ..choices import STATUS_HELP


class ParallelismSchema(serializers.Serializer):
    tp = serializers.IntegerField(min_value=1, required=False, help_text="tensor parallel size (default 1)")
    pp = serializers.IntegerField(min_value=1, required=False, help_text="pipeline stages (default 1)")
    dp = serializers.IntegerField(min_value=1, required=False, help_text="data parallel size (default 1)")
    ep = serializers.IntegerField(min_value=1, required=False, help_text="expert parallel size; divides dp")
    cp = serializers.IntegerField(
        min_value=1, required=False, help_text="context parallel size (default 1); ranks after tp"
    )


class ModelSchema(serializers.Serializer):
    flops_per_step = serializers.FloatField(min_value=0, help_text="model FLOPs of one step of the whole job")


class StepSchema(serializers.Serializer):
    compute_ms = serializers.FloatField(min_value=0, help_text="pure compute time of one step, ms")
    overlap = serializers.FloatField(
        min_value=0, max_value=1, required=False, help_text="share of communication hidden behind compute"
    )


class CommEntrySchema(serializers.Serializer):
    group = serializers.ChoiceField(choices=GROUP_KINDS)
    collective = serializers.ChoiceField(choices=COLLECTIVES)
    bytes = serializers.FloatField(min_value=0, help_text="payload per rank, bytes")
    count = serializers.IntegerField(min_value=1, required=False, help_text="repeats per step (default 1)")


class JobSpecV1Schema(serializers.Serializer):
    """A job spec v1 (spec/job-v1.md), as JSON or YAML. Unknown fields are an error."""

    version = serializers.ChoiceField(choices=[1])
    name = serializers.CharField(max_length=200)
    cluster = serializers.CharField(required=False, help_text="cluster name; or give ?cluster=")
    user = serializers.CharField(required=False, help_text="ignored over REST: the signed-in user")
    priority = serializers.IntegerField(required=False, help_text="higher runs first (default 0)")
    gpus = serializers.IntegerField(min_value=1)
    parallelism = ParallelismSchema(help_text="tp*cp*pp*dp must equal gpus")
    rank_order = serializers.CharField(
        required=False, help_text="Megatron order, default tp-ep-dp-pp (tp-cp-ep-dp-pp with cp > 1)"
    )
    model = ModelSchema(required=False)
    step = StepSchema()
    comm = CommEntrySchema(many=True)
    estimated_runtime_s = serializers.FloatField(min_value=0, required=False, allow_null=True)
    policy = serializers.ChoiceField(choices=POLICY_NAMES, required=False, allow_null=True)


class RankSchema(serializers.Serializer):
    rank = serializers.IntegerField()
    node = serializers.CharField()
    gpu = serializers.IntegerField()


class GroupCostSchema(serializers.Serializer):
    group = serializers.CharField()
    ranks = serializers.ListField(child=serializers.IntegerField())
    level = serializers.CharField()
    bottleneck_GBps = serializers.FloatField(allow_null=True)
    time_ms = serializers.FloatField(allow_null=True)


class PredictedSchema(serializers.Serializer):
    comm_ms = serializers.FloatField(allow_null=True)
    step_ms = serializers.FloatField(allow_null=True)
    mfu = serializers.FloatField(allow_null=True)
    groups = GroupCostSchema(many=True, required=False)


class PlacementOutputSchema(serializers.Serializer):
    """The placement output of job spec v1: one {rank, node, gpu} per rank and predicted costs."""

    job = serializers.CharField()
    policy = serializers.CharField(allow_null=True)
    ranks = RankSchema(many=True)
    predicted = PredictedSchema(allow_null=True)


class PolicyPreviewSchema(serializers.Serializer):
    """One policy's placement (when `fits`), or why it does not fit."""

    policy = serializers.CharField()
    fits = serializers.BooleanField()
    reason = serializers.CharField(required=False)
    job = serializers.CharField(required=False)
    ranks = RankSchema(many=True, required=False)
    predicted = PredictedSchema(required=False)


class BoundSchema(serializers.Serializer):
    comm_ms = serializers.FloatField()
    step_ms = serializers.FloatField()
    mfu = serializers.FloatField(allow_null=True)


class PlacementPreviewSchema(serializers.Serializer):
    """Every policy's placement on the GPUs free now, and the lower bound; nothing booked."""

    job = serializers.CharField()
    cluster = serializers.CharField()
    free_gpus = serializers.IntegerField()
    policies = PolicyPreviewSchema(many=True)
    lower_bound = BoundSchema()


def spec_body(schema) -> dict:
    """The request body of a spec endpoint: `schema` in JSON and in YAML."""
    return {"application/json": schema, "application/yaml": schema, "text/yaml": schema}


# Status enum components and the kind of status each lists (the texts: ..choices.STATUS_HELP).
STATUS_ENUMS = {
    "JobStatusEnum": "job",
    "NodeStateEnum": "node",
    "ProposalStatusEnum": "proposal",
    "ExitCauseEnum": "exit",
}


def status_descriptions(result, generator, request, public):
    """drf-spectacular postprocessing hook: each status enum's description says what every
    status means, from the same table as the dashboard's tooltips and glossary."""
    schemas = result.get("components", {}).get("schemas", {})
    for name, kind in STATUS_ENUMS.items():
        if name in schemas:
            help_ = STATUS_HELP[kind]
            lines = [f"* `{value}`: {help_.get(value, '')}" for value in schemas[name].get("enum", [])]
            schemas[name]["description"] = "\n".join(lines)
    return result
