"""``GET /v1/explanations/{request_id}``: why the router sent *this* request where it went.

The chat page asks for it when a person clicks "why here?" under a reply: the same API key
that made the request (its tenant must own the decisions), the request id from the reply's
``x-request-id`` header. The edge asks its router (``ExplainRequest``), which answers from its
decision journal — every decision for the request (the first Route, any reroute), each with
every candidate's per-signal contributions and what the filters removed. Nothing is kept at
the edge and nothing is added to the chat path: the router journals every decision anyway.

The journal is bounded (the router's last N decisions, 256 by default), so an explanation can
age out on a busy router: that is a 404 that says so. Answers are capped (the best
:data:`MAX_CANDIDATES` candidates, :data:`MAX_FILTERED` filtered workers) with counts of what
was left out, so a fleet of a thousand workers does not make a megabyte answer.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from meridian.v1 import router_pb2
from services.common.errors import InvalidRequest, NotFound
from services.edge.tenancy.auth import Authenticator
from services.edge.upstream.router_client import RouterClient

MAX_CANDIDATES = 8
MAX_FILTERED = 32
#: The edge's own request ids (chat, completions, embeddings; app.py): nothing else is looked up.
REQUEST_ID = re.compile(r"^(?:(?:chatcmpl|cmpl|embd)-|resp_)[0-9a-f]{32}$")


def explanation_json(resp: router_pb2.RequestExplanation) -> dict[str, Any]:
    decisions = []
    for item in resp.decisions:
        d = item.decision
        decisions.append(
            {
                "at": item.at_unix_ms,
                "decision_id": d.decision_id,
                "router_site": d.router_site,
                "explanation": d.explanation,
                "signal": item.signal,
                "reroute": bool(item.exclude_worker_ids),
                "excluded": list(item.exclude_worker_ids),
                "empty_reason": item.empty_reason or None,
                "decision_us": round(d.decision_us, 1),
                "candidates": [
                    {
                        "worker": c.worker_id,
                        "region": c.region,
                        "score": round(c.score, 4),
                        "contributions": [
                            {
                                "signal": s.signal,
                                "score": round(s.score, 4),
                                "weight": s.weight,
                                "weighted": round(s.weighted, 4),
                                "detail": s.detail,
                            }
                            for s in c.contributions
                        ],
                    }
                    for c in d.candidates[:MAX_CANDIDATES]
                ],
                "more_candidates": max(0, len(d.candidates) - MAX_CANDIDATES),
                "filtered": [
                    {
                        "worker": f.worker_id,
                        "region": f.region,
                        "filter": f.filter,
                        "reason": f.reason,
                    }
                    for f in d.filtered[:MAX_FILTERED]
                ],
                "more_filtered": max(0, len(d.filtered) - MAX_FILTERED),
            }
        )
    return {"object": "routing.explanation", "request_id": resp.request_id, "decisions": decisions}


def explanation_handler(*, auth: Authenticator, router: RouterClient) -> Handler:
    async def explanation(request: web.Request) -> web.Response:
        principal = await auth.from_request(request)
        request_id = request.match_info["request_id"]
        if not REQUEST_ID.fullmatch(request_id):
            raise InvalidRequest(
                "request_id must be the x-request-id of a request to the API (chatcmpl-…, "
                "cmpl-…, embd-… or resp_…)",
                param="request_id",
            )
        try:
            resp = await router.explain_request(
                router_pb2.ExplainRequestQuery(
                    request_id=request_id, tenant_id=principal.tenant.tenant_id
                )
            )
        except NotFound:
            raise NotFound(
                f"no routing explanation is kept for {request_id}: the router keeps its most "
                "recent decisions only, for the tenant that made them",
                param="request_id",
            ) from None
        return web.json_response(explanation_json(resp), headers={"Cache-Control": "no-store"})

    return explanation
