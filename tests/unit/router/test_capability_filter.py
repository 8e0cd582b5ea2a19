"""The ``capability`` filter: a request reaches only workers whose model supports what it
needs, and a request no worker can serve is refused as unsupported (a 400), naming the field."""

from __future__ import annotations

from meridian.v1 import router_pb2, worker_pb2
from services.common.capabilities import (
    CHAT,
    UNSUPPORTED_CODE,
    Capabilities,
    Needs,
    legacy,
    unmet,
)
from services.common.errors import InvalidRequest, Unavailable
from services.router.scheduling.filters.capability import CapabilityFilter
from services.router.scheduling.framework import SchedulerProfile, WeightedScorer
from services.router.scheduling.scorers.latency import LatencyScorer
from services.router.scheduling.types import ModelState, ModelStatus, NoCandidate
from services.router.service import error_for, query_from_pb
from tests.support.builders import profile, q, w

TOOLS = Capabilities(chat=True, tools=True, tool_parser="hermes", structured_outputs=True)
EMBED = Capabilities(chat=False, embeddings=True, embedding_dimensions=64)
MATRYOSHKA = Capabilities(
    chat=False, embeddings=True, embedding_dimensions=64, dimensions_configurable=True
)
COMPLETIONS = Capabilities(chat=True, completions=True, echo=True, max_logprobs=5)


def serving(caps: Capabilities) -> tuple[ModelStatus, ...]:
    return (ModelStatus("m", ModelState.READY, capabilities=caps),)


def sched() -> SchedulerProfile:
    return profile(WeightedScorer(LatencyScorer(tau_ms=50, unknown_score=0.25), 1.0))


def test_a_tools_request_lands_only_on_a_worker_that_parses_tool_calls() -> None:
    workers = [w("plain", rtt_ms=1.0), w("tooled", rtt_ms=90.0, models=serving(TOOLS))]
    decision = sched().schedule(q(needs=Needs(tools=True)), workers)
    assert [s.worker.worker_id for s in decision.ranked] == ["tooled"]
    (rejection,) = [r for r in decision.rejected if r.filter == "capability"]
    assert rejection.worker_id == "plain"
    assert rejection.reason == "tools: model 'm' does not parse tool calls"


def test_a_plain_chat_request_goes_anywhere_chat_is_served() -> None:
    workers = [w("plain", rtt_ms=1.0), w("tooled", rtt_ms=90.0, models=serving(TOOLS))]
    decision = sched().schedule(q(), workers)
    assert [s.worker.worker_id for s in decision.ranked] == ["plain", "tooled"]


def test_an_embeddings_request_no_worker_supports_is_unsupported_naming_input() -> None:
    decision = sched().schedule(q(needs=Needs(endpoint="embeddings")), [w("a"), w("b")])
    assert not decision.ranked
    assert decision.empty_reason is NoCandidate.UNSUPPORTED
    err = error_for(decision, q(needs=Needs(endpoint="embeddings")))
    assert isinstance(err, InvalidRequest)
    assert err.param == "input"
    assert err.code == UNSUPPORTED_CODE
    assert "does not serve embeddings" in err.message


def test_unsupported_outranks_unavailable_only_when_no_worker_could_ever_serve_it() -> None:
    # The one worker with tools is down: the request should wait for it (503), not be refused.
    workers = [w("plain"), w("tooled", healthy=False, models=serving(TOOLS))]
    decision = sched().schedule(q(needs=Needs(tools=True)), workers)
    assert decision.empty_reason is NoCandidate.UNAVAILABLE
    assert isinstance(error_for(decision, q(needs=Needs(tools=True))), Unavailable)


def test_dimensions_are_served_only_where_the_model_truncates() -> None:
    workers = [w("fixed", models=serving(EMBED)), w("mrl", models=serving(MATRYOSHKA))]
    needs = Needs(endpoint="embeddings", embedding_dimensions=16)
    decision = sched().schedule(q(needs=needs), workers)
    assert [s.worker.worker_id for s in decision.ranked] == ["mrl"]
    own = Needs(endpoint="embeddings", embedding_dimensions=64)
    assert len(sched().schedule(q(needs=own), workers).ranked) == 2
    too_many = Needs(endpoint="embeddings", embedding_dimensions=65)
    decision = sched().schedule(q(needs=too_many), workers)
    assert decision.empty_reason is NoCandidate.UNSUPPORTED
    assert error_for(decision, q(needs=too_many)).param == "dimensions"


def test_each_missing_feature_names_its_request_field() -> None:
    cases = {
        Needs(tools=True): "tools",
        Needs(structured_outputs=True): "response_format",
        Needs(endpoint="completions", echo=True): "echo",
        Needs(endpoint="completions", suffix=True): "suffix",
        Needs(logprobs=21): "logprobs",
        Needs(n=2): "n",
    }
    completions_only = Capabilities(chat=True, completions=True)
    for needs, param in cases.items():
        miss = unmet(completions_only, needs)
        assert miss is not None, needs
        assert miss.param == param, (needs, miss)
    assert unmet(COMPLETIONS, Needs(endpoint="completions", echo=True, logprobs=5)) is None
    assert unmet(COMPLETIONS, Needs(endpoint="completions", logprobs=6)) is not None
    miss = unmet(legacy(4096), Needs(endpoint="completions"))
    assert miss is not None
    assert miss.param == "prompt"


def test_a_worker_that_reports_no_capabilities_is_read_as_chat_only() -> None:
    old = worker_pb2.ModelInfo(name="m", max_model_len=2048)
    caps = Capabilities.from_pb(old)
    assert caps == legacy(2048)
    assert unmet(caps, CHAT) is None
    assert unmet(caps, Needs(endpoint="embeddings")) is not None


def test_capabilities_and_needs_survive_the_wire() -> None:
    info = worker_pb2.ModelInfo(name="m", max_model_len=512, capabilities=MATRYOSHKA.to_pb())
    assert Capabilities.from_pb(info) == Capabilities(
        chat=False,
        embeddings=True,
        embedding_dimensions=64,
        dimensions_configurable=True,
        max_context_len=512,
    )
    needs = Needs(endpoint="completions", echo=True, logprobs=3)
    pb = router_pb2.RouteRequest(request_id="r", model="m", needs=needs.to_pb())
    assert query_from_pb(pb).needs == needs
    assert query_from_pb(router_pb2.RouteRequest(request_id="r", model="m")).needs == CHAT


def test_the_filter_is_memoised_per_model_and_needs() -> None:
    f = CapabilityFilter()
    assert f.key(q(needs=Needs(tools=True))) == ("m", Needs(tools=True))
    assert f.key(q()) != f.key(q(needs=Needs(tools=True)))
