"""The access log (`--access-log`): one line per answered request, over both transports, on the logger `oip.access`.

A line reads `<client> "<request>" <status> <ms> ms <n> bytes in, <m> bytes out` (REST: the method and path;
gRPC: the service and RPC); with `--log-format json` its fields are the record's `access` entries (transport,
operation, status, duration_ms, request_bytes, response_bytes, and REST's method, path and client). A path longer
than PATH_LIMIT characters is written as its start and its length: a client's long path (up to the header limit)
must not make each of its requests write as much again to the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from ..errors import clip

__all__ = ["PATH_LIMIT", "log_access"]

_LOG: Final = logging.getLogger("oip.access")
PATH_LIMIT: Final = 1000  # characters of a request's path that a line keeps


def log_access(transport: str, operation: str, request: str, status: int | str, start_ns: int, received: int,
               sent: int, *, method: str | None = None, path: str | None = None, client: str | None = None) -> None:
    """Log one answered request: `request` as the line names it, `status` its HTTP status or gRPC code's name,
    `start_ns` when it arrived (`time.perf_counter_ns()`), the bytes received and sent."""
    duration_ms = (time.perf_counter_ns() - start_ns) / 1e6
    request = clip(request, PATH_LIMIT)
    if path is not None:
        path = clip(path, PATH_LIMIT)
    fields: dict[str, Any] = {"transport": transport, "operation": operation}
    if method is not None:
        fields["method"], fields["path"] = method, path
    fields.update(status=status, duration_ms=round(duration_ms, 3), request_bytes=received, response_bytes=sent)
    if client is not None:
        fields["client"] = client
    _LOG.info('%s"%s" %s %.3f ms %d bytes in, %d bytes out', "" if client is None else f"{client} ", request,
              status, duration_ms, received, sent, extra={"access": fields})
