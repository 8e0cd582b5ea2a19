"""The capability contract in Python: what a model on a worker supports (``Capabilities``),
what a request needs (``Needs``), and the one rule matching them (``unmet``).

Shared because three places must agree on it word for word: the worker reports capabilities
(proto ``ModelCapabilities``), the router's ``capability`` filter refuses workers that lack
what a request needs (proto ``RequestNeeds``), and the edge ranks from its last view with the
same rule while the router is down and shows merged capabilities on ``/v1/models``. Frozen
dataclasses (hashable), so the router memoises verdicts per distinct ``Needs``.

A worker older than issue 12 reports no capabilities: it is read as chat only (``legacy``).
A request without needs (an edge older than issue 12) is a plain chat request.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final, Literal

from meridian.v1 import router_pb2, worker_pb2

Endpoint = Literal["chat", "completions", "embeddings"]

#: The error code the router and the edge give a request no worker can serve for lack of a
#: feature (HTTP 400, gRPC INVALID_ARGUMENT).
UNSUPPORTED_CODE: Final = "unsupported_capability"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """``ModelCapabilities`` (worker.proto), as the router and edge hold it."""

    chat: bool = True
    completions: bool = False
    embeddings: bool = False
    tools: bool = False
    tool_parser: str = ""
    structured_outputs: bool = False
    structured_output_backend: str = ""
    max_context_len: int = 0  # 0: unknown (not checked)
    embedding_dimensions: int = 0
    dimensions_configurable: bool = False
    echo: bool = False
    max_logprobs: int = 20  # limits.MAX_TOP_LOGPROBS, what chat has always allowed
    suffix: bool = False
    max_embedding_inputs: int = 0
    max_n: int = 1

    @classmethod
    def from_pb(cls, info: worker_pb2.ModelInfo) -> Capabilities:
        if not info.HasField("capabilities"):
            return legacy(info.max_model_len)
        c = info.capabilities
        return cls(
            chat=c.chat,
            completions=c.completions,
            embeddings=c.embeddings,
            tools=c.tools,
            tool_parser=c.tool_parser,
            structured_outputs=c.structured_outputs,
            structured_output_backend=c.structured_output_backend,
            max_context_len=c.max_context_len or info.max_model_len,
            embedding_dimensions=c.embedding_dimensions,
            dimensions_configurable=c.dimensions_configurable,
            echo=c.echo,
            max_logprobs=c.max_logprobs,
            suffix=c.suffix,
            max_embedding_inputs=c.max_embedding_inputs,
            max_n=max(1, c.max_n),
        )

    def to_pb(self) -> worker_pb2.ModelCapabilities:
        return worker_pb2.ModelCapabilities(**{f.name: getattr(self, f.name) for f in fields(self)})

    def merge(self, other: Capabilities) -> Capabilities:
        """What either supports (features: or; limits: the larger) — for ``/v1/models``."""
        merged: dict[str, object] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, bool):
                merged[f.name] = a or b
            elif isinstance(a, int):
                merged[f.name] = max(a, b)
            else:
                merged[f.name] = a or b
        return Capabilities(**merged)  # type: ignore[arg-type]


#: What a worker that reports nothing is taken to support (context unknown).
CHAT_ONLY: Final = Capabilities()


def legacy(max_model_len: int) -> Capabilities:
    """A worker that reports no capabilities: chat only, as every worker was before."""
    return Capabilities(max_context_len=max_model_len)


@dataclass(frozen=True, slots=True)
class Needs:
    """``RequestNeeds`` (router.proto), as the router's filter keys on it."""

    endpoint: Endpoint = "chat"
    tools: bool = False
    structured_outputs: bool = False
    echo: bool = False
    logprobs: int = 0
    suffix: bool = False
    context_tokens: int = 0
    embedding_dimensions: int = 0
    n: int = 1

    @classmethod
    def from_pb(cls, pb: router_pb2.RouteRequest) -> Needs:
        if not pb.HasField("needs"):
            return CHAT
        n = pb.needs
        endpoint: Endpoint = (
            "embeddings" if n.embeddings else "completions" if n.completions else "chat"
        )
        return cls(
            endpoint=endpoint,
            tools=n.tools,
            structured_outputs=n.structured_outputs,
            echo=n.echo,
            logprobs=n.logprobs,
            suffix=n.suffix,
            context_tokens=n.context_tokens,
            embedding_dimensions=n.embedding_dimensions,
            n=max(1, n.n),
        )

    def to_pb(self) -> router_pb2.RequestNeeds:
        return router_pb2.RequestNeeds(
            chat=self.endpoint == "chat",
            completions=self.endpoint == "completions",
            embeddings=self.endpoint == "embeddings",
            tools=self.tools,
            structured_outputs=self.structured_outputs,
            echo=self.echo,
            logprobs=self.logprobs,
            suffix=self.suffix,
            context_tokens=self.context_tokens,
            embedding_dimensions=self.embedding_dimensions,
            n=self.n,
        )


CHAT: Final = Needs()

#: The request field a missing endpoint is named by.
_ENDPOINT_PARAM: Final = {"chat": "messages", "completions": "prompt", "embeddings": "input"}


@dataclass(frozen=True, slots=True)
class Unmet:
    """The first need a model's capabilities do not meet."""

    feature: str  # "embeddings", "tools", "echo", ...
    param: str  # the request field that needs it (the 400's ``param``)
    reason: str  # one line, for explanations: "does not support tools"


def unmet(caps: Capabilities, needs: Needs) -> Unmet | None:
    """``None`` when ``caps`` can serve ``needs``; else the first feature missing.

    Checked in a fixed order (endpoint first), so every router and edge names the same one.
    """
    if not getattr(caps, needs.endpoint):
        return Unmet(
            needs.endpoint, _ENDPOINT_PARAM[needs.endpoint], f"does not serve {needs.endpoint}"
        )
    if needs.tools and not caps.tools:
        return Unmet("tools", "tools", "does not parse tool calls")
    if needs.structured_outputs and not caps.structured_outputs:
        return Unmet("structured_outputs", "response_format", "has no structured outputs")
    if needs.echo and not caps.echo:
        return Unmet("echo", "echo", "cannot echo the prompt")
    if needs.suffix and not caps.suffix:
        return Unmet("suffix", "suffix", "cannot complete with a suffix")
    if needs.logprobs > caps.max_logprobs:
        return Unmet(
            "logprobs", "logprobs", f"returns at most {caps.max_logprobs} logprobs per token"
        )
    if needs.n > caps.max_n:
        return Unmet("n", "n", f"returns at most {caps.max_n} choices")
    if needs.embedding_dimensions:
        if not caps.dimensions_configurable and needs.embedding_dimensions != (
            caps.embedding_dimensions
        ):
            return Unmet(
                "dimensions",
                "dimensions",
                f"has fixed embedding dimensions ({caps.embedding_dimensions})",
            )
        if needs.embedding_dimensions > caps.embedding_dimensions:
            return Unmet(
                "dimensions",
                "dimensions",
                f"embeds into at most {caps.embedding_dimensions} dimensions",
            )
    if caps.max_context_len and needs.context_tokens > caps.max_context_len:
        param = "input" if needs.endpoint == "embeddings" else "max_tokens"
        return Unmet("context_length", param, f"has a context of {caps.max_context_len} tokens")
    return None


def merged(infos: list[worker_pb2.ModelInfo]) -> worker_pb2.ModelCapabilities:
    """The capabilities of one model over several workers, for ``/v1/models``."""
    out: Capabilities | None = None
    for info in infos:
        c = Capabilities.from_pb(info)
        out = c if out is None else out.merge(c)
    return (out or Capabilities()).to_pb()


def as_json(caps: worker_pb2.ModelCapabilities) -> dict[str, object]:
    """The ``capabilities`` object of a ``/v1/models`` entry (every field, proto names)."""
    return {f.name: getattr(caps, f.name) for f in caps.DESCRIPTOR.fields}
