"""REST views of the launch loop: the node agents' sync (heartbeat, reports, work long-poll),
node health (list, drain, resume) and job logs. Views validate and translate; writes are
services in `agents`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.authentication import node_token_of
from apps.api.parsers import parse_spec_body
from apps.api.throttling import NodeSyncThrottle
from apps.placement.topology import SpecLimits
from apps.scheduling.api.authentication import NodeAuthentication
from apps.topology.models import Node
from apps.topology.retry import retry_when_locked
from apps.topology.signals import nic_counters_received

from .. import services as agents
from ..selectors import node_work, sync_node
from ..wakeups import epoch, wait_for_change
from .serializers import (
    AgentSyncSerializer,
    split_logs,
    split_reports,
)

MAX_WAIT_S = 60.0
# A sync body: at most MAX_REPORTS reports of a few kB of output each (see topoweb/bodylimits.py).
AGENT_SYNC_LIMITS = SpecLimits(max_bytes=4 * 1024 * 1024, max_nodes=200_000)


def _clean_reports(data: Any) -> Any:
    """Rank output as the database can store it, before the NUL check of the validation layer:
    whatever bytes a rank wrote, its report is stored (see `agents.clean_text`)."""
    if not isinstance(data, dict):
        return data
    for field, text in (("reports", "log_tail"), ("logs", "data")):
        if isinstance(data.get(field), list):
            for item in data[field]:
                if isinstance(item, dict) and isinstance(item.get(text), str):
                    item[text] = agents.clean_text(item[text])
    return data


class AgentSyncParser(BaseParser):
    """The agent sync's JSON body: bounded like every body; report output is cleaned, not refused."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        return parse_spec_body(stream, parser_context, json_only=True, clean=_clean_reports)


class AnswerJSON(DefaultContentNegotiation):
    """An agent's answer is JSON whatever the request accepts (no Accept header to parse on
    every poll of every node)."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class IsNodeAgent(BasePermission):
    """Only a node token (a node agent's own credential)."""

    message = "Agent calls need the node's token: 'Authorization: Node <key>' (manage.py create_node_token)."

    def has_permission(self, request, view) -> bool:
        return node_token_of(request) is not None


class AgentSyncView(APIView):
    """One round trip of a node agent: heartbeat, rank reports, then the node's work."""

    authentication_classes = [NodeAuthentication]
    permission_classes = [IsNodeAgent]
    parser_classes = [AgentSyncParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = AnswerJSON
    # A long-poll (up to TOPOWEB_AGENT_POLL_S): outside the per-process API write slots, which it
    # would hold while waiting (topoweb.middleware.WriteSlotsMiddleware).
    write_slot = False
    spec_limits = AGENT_SYNC_LIMITS
    # Per node, never per address: per-IP throttling would cut a rack behind one NAT off.
    throttle_classes = [NodeSyncThrottle]

    @extend_schema(
        summary="Agent: heartbeat, report rank starts and exits, long-poll the node's work",
        request=AgentSyncSerializer,
        responses={200: dict, 400: dict, 403: dict, 409: dict},
    )
    def post(self, request: Request) -> Response:
        """Record the heartbeat and the valid reports (the answer's `refused` lists the others and
        why), then answer the node's work and `stop`, the ranks it must stop (or report gone)
        although no work lists them; when nothing changed for the agent (no reports, it
        runs exactly its work) wait up to `wait_s` for a change. The credential's node is the
        only node this answers for: another `node` in the body, or a report about a rank placed
        on another node, is refused with 403 and nothing is recorded. The node syncs with one
        agent process (`instance`) at a time: another one's sync, while the one bound to the node
        has synced within `agents.down_after_s()`, is refused with 409 naming that one (unless it
        succeeds it on its state directory, `previous`), and nothing of it is recorded. The answer
        names this server (`server_id`), the cluster and the node: an agent adopts no record made
        for another."""
        body = AgentSyncSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        token = node_token_of(request)
        name = data.get("node", token.node.name)
        if name != token.node.name:
            return Response(
                {
                    "detail": f"this credential is node {token.node.name!r}'s; it cannot sync for node {name!r}"
                },
                status=status.HTTP_403_FORBIDDEN,
            )
        # A sync without reports or logs changes no rank: its node's work is read with the node,
        # in the same round trip (the change counters first, so a change committed after the read
        # still wakes its wait). One with reports reads the work once they are stored.
        unchanged = not data["reports"] and not data["logs"]
        since = epoch(token.node.cluster_id, name)
        node, known, read = sync_node(node_id=token.node_id, with_work=unchanged)
        if node is None or node.name != name:
            return Response(
                {"detail": "the credential's node no longer exists"}, status=status.HTTP_403_FORBIDDEN
            )
        if node.cluster_id != token.node.cluster_id:  # moved since the credential was remembered
            since, read = epoch(node.cluster_id, name), None
        row = known
        agent_row, holder = retry_when_locked(
            lambda: agents.agent_claim(node=node, agent=known, claim=body.claim()), what="agent claim"
        )
        if holder is not None:
            return Response(
                {
                    "detail": f"node {node.name!r} has a live agent already: instance {holder['instance']}"
                    f" on {holder['host'] or '?'} (address {holder['addr'] or '?'}), started"
                    f" {holder['started_at']}, last synced {holder['silent_s']:.0f} s ago. This agent is"
                    f" refused (it starts nothing) until that one has been silent for"
                    f" {agents.down_after_s():.0f} s: one agent per node credential.",
                    "node": node.name,
                    "holder": holder,
                },
                status=status.HTTP_409_CONFLICT,
            )
        known = agent_row
        reports, refused = split_reports(data["reports"])
        chunks, refused_logs = split_logs(data["logs"])
        foreign, unknown = agents.report_scope(node=node, reports=[*reports, *chunks])
        if foreign:
            job, generation, rank = sorted(foreign)[0]
            return Response(
                {
                    "detail": f"rank {rank} of job {job} generation {generation} is not placed on node "
                    f"{node.name!r}: a node reports only its own ranks"
                },
                status=status.HTTP_403_FORBIDDEN,
            )
        beat = body.heartbeat()
        # Both writes are safe to repeat: on the embedded SQLite they retry a lost write lock.
        agent = retry_when_locked(
            lambda: agents.agent_heartbeat(node=node, beat=beat, agent=known), what="agent heartbeat"
        )
        if data.get("nics"):
            counters = [dict(c) for c in data["nics"]]
            retry_when_locked(
                lambda: nic_counters_received.send(
                    sender=AgentSyncView, node_id=node.pk, counters=counters, at=timezone.now()
                ),
                what="agent NIC counters",
            )
        if unknown:
            refused += [
                {**_key(r), "reason": "no such rank was ever placed (its job may have been deleted)"}
                for r in reports
                if (r.job, r.generation, r.rank) in unknown
            ]
            reports = [r for r in reports if (r.job, r.generation, r.rank) not in unknown]
        if reports:
            stored = retry_when_locked(
                lambda: agents.agent_report(node=node, reports=reports), what="agent report"
            )
            refused += [{**_key(r), "reason": why} for r, why in stored]
        logs: dict[str, int] = {}
        if chunks:
            refused_logs += [
                {**_chunk_key(c), "reason": "no such rank was ever placed (its job may have been deleted)"}
                for c in chunks
                if (c.job, c.generation, c.rank) in unknown
            ]
            chunks = [c for c in chunks if (c.job, c.generation, c.rank) not in unknown]
            logs, not_stored = retry_when_locked(
                lambda: agents.agent_logs(node=node, chunks=chunks), what="agent logs"
            )
            refused_logs += [{**_chunk_key(c), "reason": why} for c, why in not_stored]
        work, stops = read if read is not None else node_work(node=node)
        # The server bounds the wait (its own poll interval), whatever the agent asks for.
        wait_s = min(data["wait_s"], float(settings.TOPOWEB_AGENT_POLL_S), MAX_WAIT_S)
        running = {tuple(k) for k in data["running"]}
        # Ranks to stop that the agent is not stopping yet (or has no trace of): answer at once.
        unheeded = {tuple(k) for k in stops} - {tuple(k) for k in data["stopping"]}
        server_id, cluster_name = agents.server_identity(cluster_id=node.cluster_id, agent=row)
        answer = {
            "node": node.name,
            "server_id": server_id,
            "cluster": cluster_name,
            "state": agent.state,
            "reason": agent.reason,
            "poll_s": float(settings.TOPOWEB_AGENT_POLL_S),
            "down_after_s": agents.down_after_s(),
            "refused": refused,
            "fence_after_s": agents.fence_after_s(),
            "fence_slack_s": agents.fence_slack_s(),
            "logs": logs,
            "refused_logs": refused_logs,
            "work": work,
            "stop": stops,
        }
        if wait_s > 0 and unchanged and running == _keys(work) and not unheeded:
            wait = AgentWait(node=node, since=since, wait_s=wait_s)
            if getattr(request._request, WAITS_ELSEWHERE, False):
                # The ASGI path (topoweb/agents_asgi.py) waits in its event loop, then `refresh`es;
                # this thread, and its database connection, serve the next sync meanwhile.
                response = Response(answer)
                response.agent_wait = wait
                return response
            if not connection.in_atomic_block:
                # A waiting poll holds no database connection: thousands of agents wait at once.
                connection.close()
            if wait_for_change(node.cluster_id, node.name, since, wait_s):
                answer["work"], answer["stop"] = node_work(node=node)
        return Response(answer)


# A request carrying this attribute (True) is served by a server that waits for the node's change
# itself: the view answers the current work with the wait attached instead of blocking its thread.
WAITS_ELSEWHERE = "topoweb_waits_elsewhere"


@dataclass(frozen=True, slots=True)
class AgentWait:
    """A sync's long-poll, left to the server: wait up to `wait_s` for a change of the node's
    work past `since` (`wakeups.changed`), then `refresh` the answer."""

    node: Node
    since: tuple[int, int]
    wait_s: float

    def refresh(self, response: Response) -> Response:
        """The answer after a change: the node's work and stops read again, rendered anew (the
        rest of the answer, headers included, stays as the view and middleware made it; the server
        sends the new length)."""
        response.data["work"], response.data["stop"] = node_work(node=self.node)
        response.content = response.rendered_content
        return response


def _chunk_key(c: agents.LogChunk) -> dict[str, Any]:
    return {"job": c.job, "generation": c.generation, "rank": c.rank, "offset": c.offset}


def _key(r: agents.RankReport) -> dict[str, Any]:
    return {"job": r.job, "generation": r.generation, "rank": r.rank, "event": r.event}


def _keys(work) -> set[tuple[int, int, int]]:
    return {(w["job"], w["generation"], r["rank"]) for w in work for r in w["ranks"]}
