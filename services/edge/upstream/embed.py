"""One Embed call on the best worker that answers, with failover (POST /v1/embeddings).

The unary counterpart of :mod:`.failover`: the router's ranked candidates in order, a worker
that refuses or fails (busy, draining, gone, too slow) costs the client nothing, the next one
is tried, and when the list runs out the router is asked once more with the tried workers
excluded. A bad request (an empty input, ``dimensions`` the model cannot give) ends it at once.
Every attempt is a CLIENT span ``edge.attempt`` whose context travels to the worker's
``worker.Embed`` span, and its outcome goes to the router (in-flight accounting, ejection).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from meridian.v1 import router_pb2, worker_pb2
from meridian.v1.router_pb2 import Outcome
from services.common import metric_names as mn
from services.common.errors import (
    UpstreamTimeout,
)
from services.edge.context import Reroute
from services.edge.upstream.failover import (
    FailoverPolicy,
    OutcomeSink,
    _stream_error,
    attempt_span,
    error_outcome,
    over_candidates,
)
from services.edge.upstream.router_client import RouteResult
from services.edge.upstream.worker_pool import WorkerPool

log = logging.getLogger("meridian.edge.failover")

#: ``(request_id, decision_id) -> fresh EmbedRequest`` for one attempt.
EmbedFactory = Callable[[str, str], worker_pb2.EmbedRequest]


@dataclass(frozen=True, slots=True)
class Embedded:
    response: worker_pb2.EmbedResponse
    candidate: router_pb2.Candidate
    attempts: int


async def embed_with_failover(
    *,
    first_route: RouteResult,
    reroute: Reroute,
    outcomes: OutcomeSink,
    workers: WorkerPool,
    request_id: str,
    build: EmbedFactory,
    policy: FailoverPolicy,
    tracer: trace.Tracer,
) -> Embedded:
    """One Embed call on the first candidate that answers, with the chat path's failover
    (:func:`~services.edge.upstream.failover.over_candidates`)."""

    async def attempt(
        cand: router_pb2.Candidate, attempt_id: str, decision_id: str, attempts: int
    ) -> Embedded:
        resp = await _attempt(
            outcomes=outcomes,
            workers=workers,
            cand=cand,
            decision_id=decision_id,
            request=build(attempt_id, decision_id),
            policy=policy,
            attempts=attempts,
            tracer=tracer,
        )
        return Embedded(resp, cand, attempts)

    return await over_candidates(
        first_route=first_route,
        reroute=reroute,
        request_id=request_id,
        policy=policy,
        attempt=attempt,
        what="embed this request",
    )


async def _attempt(
    *,
    outcomes: OutcomeSink,
    workers: WorkerPool,
    cand: router_pb2.Candidate,
    decision_id: str,
    request: worker_pb2.EmbedRequest,
    policy: FailoverPolicy,
    attempts: int,
    tracer: trace.Tracer,
) -> worker_pb2.EmbedResponse:
    span, metadata = attempt_span(tracer, cand, attempts, **{mn.OPERATION: "embeddings"})
    outcome: Outcome = router_pb2.OUTCOME_CANCELLED
    try:
        resp = await workers.embed(
            cand.address, request, timeout_s=policy.first_token_timeout_s, metadata=metadata
        )
        outcome = router_pb2.OUTCOME_SUCCESS
        span.set_attribute("gen_ai.usage.input_tokens", resp.usage.prompt_tokens)
        return resp
    except grpc.aio.AioRpcError as err:
        span.set_attribute("rpc.grpc.status_code", err.code().value[0])
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            outcome = router_pb2.OUTCOME_FAILED
            raise UpstreamTimeout("the worker did not answer in time") from None
        mapped = _stream_error(err)
        outcome = error_outcome(err, mapped)
        raise mapped from None
    finally:
        span.set_attribute(mn.OUTCOME, router_pb2.Outcome.Name(outcome))
        if outcome != router_pb2.OUTCOME_SUCCESS:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        outcomes.report_outcome(
            router_pb2.OutcomeReport(
                decision_id=decision_id, worker_id=cand.worker_id, outcome=outcome
            )
        )
