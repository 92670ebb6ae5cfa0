"""The server's log records: every logger's (the server's, uvicorn's, grpc's) to stderr, as text lines or one JSON
object per line (`--log-format json`), naming the inference request running when a line is written.

A record is one line, whatever its message quotes: a client's model name, path or header may hold line breaks or
terminal escapes, and written as they are they would forge log lines of their own or steer the terminal that shows
them. So the text format writes every control character and line separator of a message escaped, as Python writes
it in a string (a backslash, then `n`, `x1b` or `u2028`), and the JSON format escapes the line separators JSON
leaves as they are. An exception's traceback keeps its lines.

Warnings that say the same thing over and over are kept to a line a minute (`Repeats`): OpenTelemetry's exporter
writes three or four lines for each batch of spans it fails to send (a collector that is down), about thirty a
minute under load, for as long as it stays down; uvicorn writes one for each malformed HTTP request, and a model
that fails a traceback for each request it fails, as many as clients send (`REPEATS_AS`).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from . import events, tracing

__all__ = ["REPEATING", "REPEATS_AS", "JsonFormatter", "Repeats", "TextFormatter", "configure_logging",
           "one_line"]

# The loggers (and those below them) whose warnings and errors `Repeats` thins out, each message (before its
# arguments) on its own.
REPEATING: Final = ("opentelemetry", "uvicorn")
# A record's `extra` entry that has `Repeats` thin it out too, with those whose entry is the same.
REPEATS_AS: Final = "repeats_as"
_MOST_MESSAGES: Final = 1000  # messages `Repeats` remembers at once

# Control characters (C0 but the tab, DEL, C1) and Unicode's line and paragraph separators.
_UNSAFE: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_JSON_BREAKS: Final = re.compile("[\x85\u2028\u2029]")  # line breaks to some readers, left as they are by JSON


def _escaped(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]


def _json_escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def one_line(text: str) -> str:
    """`text` with its control characters and line separators escaped, as Python writes them in a string: one
    line, inert."""
    return _UNSAFE.sub(_escaped, text) if _UNSAFE.search(text) else text


class TextFormatter(logging.Formatter):
    """Time, level, logger and message on one line (the message's control characters escaped: `one_line`)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)


class Repeats(logging.Filter):
    """Of the warnings and errors of the loggers named in `loggers` (and below them), one of each message (logger,
    level and message before its arguments) every `seconds`, and likewise of the records whose `REPEATS_AS` entry
    is the same: the first passes, those that follow within `seconds` are counted, and the next one to pass says how
    many were left out since the last one written. Other records all pass. `clock`: seconds, monotonic."""

    def __init__(self, loggers: tuple[str, ...] = REPEATING, seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.prefixes = tuple(f"{name}." for name in loggers)
        self.loggers = frozenset(loggers)
        self.seconds = seconds
        self.clock = clock
        self.last: dict[tuple[str, int, str], float] = {}  # when a record of (logger, level, message) last passed
        self.left_out: dict[tuple[str, int, str], int] = {}
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if record.levelno < logging.WARNING:
            return True
        same = getattr(record, REPEATS_AS, None)
        if same is None:
            if name not in self.loggers and not name.startswith(self.prefixes):
                return True
            same = str(record.msg)
        key, now = (name, record.levelno, str(same)), self.clock()
        with self.lock:
            last = self.last.get(key)
            if last is not None and now - last < self.seconds:
                self.left_out[key] = self.left_out.get(key, 0) + 1
                return False
            if last is None and len(self.last) >= _MOST_MESSAGES:  # bounded, whatever messages a library makes
                self.last = {seen: at for seen, at in self.last.items() if now - at < self.seconds}
                if len(self.last) >= _MOST_MESSAGES:
                    self.last.clear()
                self.left_out = {seen: n for seen, n in self.left_out.items() if seen in self.last}
            self.last[key] = now
            left_out = self.left_out.pop(key, 0)
        if left_out:
            record.msg = f"{record.getMessage()} (and {left_out} more like it since the last one written)"
            record.args = None
        return True


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
        line = json.dumps(entry, ensure_ascii=False)
        return _JSON_BREAKS.sub(_json_escaped, line) if _JSON_BREAKS.search(line) else line


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Log records of every logger (the server's, uvicorn's, grpc's) to stderr at `level` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(Repeats())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
