"""The server's log records: every logger's (the server's, uvicorn's, grpc's) to stderr, as text lines or one JSON
object per line (`--log-format json`), naming the inference request running when a line is written."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

from . import events, tracing

__all__ = ["JsonFormatter", "configure_logging"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, when there is one). A line
    written while an inference request runs carries its `request_id` (its first `tracing.REQUEST_ID_LIMIT`
    characters), and when it is traced its `trace_id` and
    `span_id`; an access log line carries the request's fields (`access`)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,  # which worker, with --workers
        }
        timer = events.current()
        if timer is not None:
            if timer.request_id:  # the client's: as much of it as a span keeps
                entry["request_id"] = timer.request_id[:tracing.REQUEST_ID_LIMIT]
            ids = tracing.current_ids()
            if ids is not None:
                entry["trace_id"], entry["span_id"] = ids
        fields = getattr(record, "access", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Log records of every logger (the server's, uvicorn's, grpc's) to stderr at `level` and above."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
