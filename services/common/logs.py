"""Structured (JSON-lines) logging with the current trace and span ids.

Every line is one JSON object: ``ts``, ``level``, ``service``, ``logger``, ``event`` and the
fields passed with :func:`event`; ``trace_id``/``span_id`` come from the active OpenTelemetry
span, so a log line can be joined to its trace. Prompts, completions and raw API keys are never
passed here; callers log ids, sizes and hashes.
"""

from __future__ import annotations

import json
import json.encoder as _json_encoder
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import trace

_FIELDS_ATTR = "meridian_fields"
_service_name = "meridian"

# One encoder for every line, built once: ``json.dumps`` with options builds a JSONEncoder and
# then its C encoder on every call, a third of the encoding cost of a short line (the router
# writes one per request). Same output as ``json.dumps(line, default=str,
# separators=(",", ":"))``; no circular-reference check (a line is a flat dict of ids,
# numbers and strings built here, never self-referencing). The pure-Python encoder is the
# fallback where the C accelerator is missing.
_c_make_encoder: Callable[..., Callable[[object, int], Iterable[str]]] | None = getattr(
    _json_encoder, "c_make_encoder", None
)
_encode = (
    _c_make_encoder(
        None, str, _json_encoder.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    if _c_make_encoder is not None
    else None
)
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))


def dumps(line: dict[str, Any]) -> str:
    """``line`` as one compact JSON object (see ``_encode``)."""
    if _encode is None:
        return _ENCODER.encode(line)
    return "".join(_encode(line, 0))


class JsonFormatter(logging.Formatter):
    """One JSON object per record; exceptions become a single ``exc`` string."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "service": _service_name,
            "logger": record.name,
            "event": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            line["trace_id"] = format(ctx.trace_id, "032x")
            line["span_id"] = format(ctx.span_id, "016x")
        fields = getattr(record, _FIELDS_ATTR, None)
        if fields:
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return dumps(line)


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes each line and flushes only a stream that does not flush
    itself: stderr is line-buffered (Python 3.9+), so its write of a whole line has already
    reached the file, and StreamHandler's second locked ``flush()`` per record was a no-op
    paid per request on the router."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
            stream = self.stream
            stream.write(msg + self.terminator)
            if not getattr(stream, "line_buffering", False):
                self.flush()
        except RecursionError:  # as StreamHandler.emit (Python issue 36272)
            raise
        except Exception:  # noqa: BLE001 - logging reports it and goes on, as StreamHandler
            self.handleError(record)


def configure(service: str, level: str = "info") -> None:
    """Route the root logger to stderr as JSON lines. Called once by each service's main."""
    global _service_name
    _service_name = service
    handler = LineHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Nothing above reads the caller's file and line or the thread: not gathering them takes
    # a third off every record (the router logs one per request). The logging docs'
    # "Optimization" section names these switches. The process id and name stay: libraries
    # with handlers of their own format them (vLLM's "(%(processName)s pid=%(process)d)"),
    # and a record without them fails that format, losing the line to a "Logging error".
    logging._srcfile = None
    logging.logThreads = False
    # grpc/aiohttp access chatter stays at warning unless asked for.
    for noisy in ("aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``event(log, "route.decided", region="kr", score=0.8)``."""
    if not logger.isEnabledFor(level):
        return
    if logging._srcfile is None:
        # configure() turned the caller lookup off: the record Logger.log would make (no
        # caller, no args), built here without its two extra calls and the ``extra`` copy.
        record = logger.makeRecord(
            logger.name, level, "(unknown file)", 0, name, (), None, "(unknown function)"
        )
        setattr(record, _FIELDS_ATTR, fields)
        logger.handle(record)
    else:
        logger.log(level, name, extra={_FIELDS_ATTR: fields})
