"""A real OTLP/gRPC trace receiver for tests: what a collector would get from our services."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[str, ...]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


@dataclass
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    spans: list[ReceivedSpan] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)  # one per Export call
    server: grpc.aio.Server | None = None
    port: int = 0

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.metadata.append({k: v for k, v in context.invocation_metadata() or ()})
        for rs in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=tuple(e.name for e in s.events),
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()

    async def start(self, port: int = 0) -> str:
        self.server = grpc.aio.server()
        # opentelemetry-proto's generated gRPC module has no annotations.
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)  # type: ignore[no-untyped-call]
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]
