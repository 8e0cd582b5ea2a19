"""OTLP/gRPC span export with the lean wire encoder.

This is the SDK's ``OTLPSpanExporter`` — same ``OTEL_EXPORTER_OTLP_*`` variables (endpoint,
``…_TRACES_*`` overrides, TLS certificates, headers, compression, timeout), same retries with
back-off and ``RetryInfo``, same reconnect on ``UNAVAILABLE`` — with one part replaced: the
request is encoded by :func:`~services.common.tracing.otlp_wire.encode_export_request` and sent
as bytes, skipping the per-field protobuf objects of the SDK's encoder.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan

from services.common.tracing.otlp_wire import encode_export_request

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _PreEncodedTraceStub:
    """``TraceServiceStub`` for a request that is already bytes (no serializer)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.Export: grpc.UnaryUnaryMultiCallable[bytes, ExportTraceServiceResponse] = (
            channel.unary_unary(
                EXPORT_METHOD,
                request_serializer=None,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
        )


class LeanOtlpSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/gRPC span exporter, encoding with :mod:`.otlp_wire`."""

    def _initialize_channel_and_stub(self) -> None:
        # Called at start and again to reconnect after UNAVAILABLE: swap in our stub each time.
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        self._client = _PreEncodedTraceStub(self._channel)  # type: ignore[assignment,arg-type]

    def _translate_data(self, data: Sequence[ReadableSpan]) -> bytes:  # type: ignore[override]
        return encode_export_request(data)
