"""Structured (JSON-lines) logging with the current trace and span ids.

Every line is one JSON object: ``ts``, ``level``, ``service``, ``logger``, ``event`` and the
fields passed with :func:`event`; ``trace_id``/``span_id`` come from the active OpenTelemetry
span, so a log line can be joined to its trace. Prompts, completions and raw API keys are never
passed here; callers log ids, sizes and hashes.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from opentelemetry import trace

_FIELDS_ATTR = "meridian_fields"
_service_name = "meridian"


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
        return json.dumps(line, default=str, separators=(",", ":"))


def configure(service: str, level: str = "info") -> None:
    """Route the root logger to stderr as JSON lines. Called once by each service's main."""
    global _service_name
    _service_name = service
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Nothing above reads the caller's file and line, thread, process or multiprocessing
    # names: not gathering them takes a third off every record (the router logs one per
    # request). The logging docs' "Optimization" section names these switches.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # grpc/aiohttp access chatter stays at warning unless asked for.
    for noisy in ("aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``event(log, "route.decided", region="kr", score=0.8)``."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra={_FIELDS_ATTR: fields})
