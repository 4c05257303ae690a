"""`GET /api/v1/usage/`: the usage page's figures as JSON (the same `usage_by_user`)."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.scheduling.api.authentication import AUTHENTICATION
from apps.scheduling.usage import GROUP_FIELDS
from apps.topology.models import Cluster

from .usage import USAGE_COLUMNS, usage_by_user

MAX_SPAN = timedelta(days=366)


class UsageQuery(serializers.Serializer):
    start = serializers.DateTimeField(help_text="Period start (ISO 8601; naive times are UTC).")
    end = serializers.DateTimeField(help_text="Period end, exclusive; at most 366 days after start.")
    by = serializers.ChoiceField(choices=sorted(GROUP_FIELDS), default="user")
    cluster = serializers.CharField(required=False, max_length=100)

    def validate_cluster(self, name: str) -> Cluster:
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise serializers.ValidationError(f"no cluster named {name!r}")
        return cluster

    def validate(self, data):
        if data["start"] >= data["end"]:
            raise serializers.ValidationError({"end": "must be after start"})
        if data["end"] - data["start"] > MAX_SPAN:
            raise serializers.ValidationError({"end": "at most 366 days after start"})
        return data


class UsageView(APIView):
    """GPU-seconds used inside a period per user, account or cluster (running jobs included,
    split at the period's edges). Operators and viewers see every job, users their own."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsAuthenticated]

    @extend_schema(
        summary="GPU use inside a period per user, account or cluster",
        parameters=[
            OpenApiParameter("start", OpenApiTypes.DATETIME, required=True),
            OpenApiParameter("end", OpenApiTypes.DATETIME, required=True),
            OpenApiParameter("by", OpenApiTypes.STR, enum=sorted(GROUP_FIELDS)),
            OpenApiParameter("cluster", OpenApiTypes.STR),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        query = UsageQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        rows = usage_by_user(
            user=request.user, since=q["start"], until=q["end"], cluster=q.get("cluster"), by=q["by"]
        )
        results = [{(q["by"] if c == "user" else c): r[c] for c in USAGE_COLUMNS} for r in rows]
        return Response(
            {
                "start": q["start"].isoformat(),
                "end": q["end"].isoformat(),
                "by": q["by"],
                "cluster": q["cluster"].name if q.get("cluster") else None,
                "results": results,
            }
        )
