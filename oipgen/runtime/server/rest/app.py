"""The REST transport's app: a FastAPI app whose routes are rendered from the spec's REST operations
(`endpoints`), answered by the data plane through `handlers`.

- Routes: one per REST operation and path of the spec; a path the spec does not have is a 404 and a method it
  does not allow a 405, both with an error body; `/v2/` is not `/v2` (no redirects). Inference routes skip
  FastAPI's middleware and router (`OipApp`).
- The OpenAPI document (/openapi.json, /docs) is the spec's own, with the ready models' inference (`openapi`).
- Observability: `GET /metrics` (Prometheus, `Settings.metrics`; `metrics_app` is the `--metrics-port` listener);
  every answered request is counted by operation and status, and logged when `Settings.access_log` is on
  (`observe.access_log`: method, path, status, duration, bytes in and out).
"""

from __future__ import annotations

import functools
import inspect
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ... import framing
from ..core.dataplane_base import TENSOR_OPERATIONS, DataPlaneBase
from ..core.pipeline import Pipeline
from ..core.repository import ModelRepository
from ..errors import OipError
from ..observe.access_log import log_access
from ..observe.metrics import CONTENT_TYPE, Metric, Metrics, render
from ..settings import Settings
from .document import DOCUMENT
from .endpoints import ENDPOINTS, REST_ONLY_ENDPOINTS, Endpoint, RestOnlyEndpoint
from .handlers import Handler, answer_handler, error_response, message_handler, rest_only_answer, tensor_answer
from .http import Answer
from .infer_codec import BinaryParts
from .lean import LeanInfer
from .openapi import openapi_document, published_document

__all__ = ["OipApp", "create_app", "metrics_app"]

_JSON: Final = framing.JSON_TYPE
_OPENAPI_URL: Final = "/openapi.json"


# FastAPI's own OpenTelemetry spans, metrics and log records (in the versions that have them, on as soon as a
# tracer provider is set, as tracing sets one): off. The server's spans are the data plane's, one per inference
# request over either transport, not one per REST request of any kind (health probes included).
_NO_FRAMEWORK_TELEMETRY: Final[dict[str, Any]] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {}
)


class OipApp(FastAPI):
    """FastAPI, publishing the spec's OpenAPI document rather than one derived from the routes (at /openapi.json
    with the ready models' own inference schemas, `openapi_document`).

    Inference requests (the tensor operations' routes and the REST-only ones such as generate, `fast_routes`) skip
    FastAPI's middleware and router: their handler answers every error itself, and the framework's layers
    (exception and telemetry middleware, the route table) cost a fifth of the CPU of a small inference, and on an
    event stream a wrapper per event. Anything else, and a wrong method on an inference path, goes through FastAPI
    as usual.
    """

    fast_routes: tuple[tuple[str, re.Pattern[str], Handler], ...] = ()
    # The inference routes' answers, for the HTTP layer to call without ASGI (`rest.http`): POST paths only.
    direct_routes: tuple[tuple[re.Pattern[str], str, tuple[tuple[str, str], ...], Answer], ...] = ()
    # Told about every answered request: `count` (metrics) its operation and status; `log` (the access log) its
    # scope, status, bytes sent and start (perf_counter_ns).
    count: Callable[[str, int], None] | None = None
    log: Callable[[Scope, int, int, int], None] | None = None
    document: dict[str, Any] = DOCUMENT

    def openapi(self) -> dict[str, Any]:
        return self.document

    def direct(self, path: str) -> tuple[str, dict[str, str], Answer] | None:
        """The operation, path fields and answer of a POST to `path` that the HTTP layer may answer itself (an
        inference route); None for any other path, or when the app is mounted under a root path."""
        if self.root_path:
            return None
        for pattern, operation, params, answer in self.direct_routes:
            match = pattern.fullmatch(path)
            if match is not None:
                found = match.groupdict()
                return operation, {field: found[name] for name, field in params}, answer
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        count, log = self.count, self.log
        start = time.perf_counter_ns() if log is not None else 0
        if not self.root_path:
            method, path = scope["method"], scope["path"]
            for route_method, pattern, handler in self.fast_routes:
                match = pattern.fullmatch(path) if method == route_method else None
                if match is not None:
                    # The handler answers every error itself with a whole body: what is counted and logged is the
                    # response's status and body, without watching the messages go out.
                    scope["app"] = self
                    scope["path_params"] = match.groupdict()
                    status = sent = 0
                    try:
                        response = await handler(Request(scope, receive, send))
                        status = response.status_code
                        if isinstance(response, StreamingResponse):  # events: sent, and a gone client seen, by it
                            sent = await _stream(response, scope, receive, send, log is not None)
                            return
                        await send({"type": "http.response.start", "status": status,
                                    "headers": response.raw_headers})
                        if type(response) is BinaryParts:
                            await response.send_parts(send)
                            sent = response.size
                        else:
                            await send({"type": "http.response.body", "body": response.body})
                            sent = len(response.body)
                    finally:
                        if count is not None:
                            count(scope.get("oip_operation") or "unknown", status)
                        if log is not None:
                            log(scope, status, sent, start)
                    return
        if count is None and log is None:
            await super().__call__(scope, receive, send)
            return
        answer = [0, 0]  # status, body bytes

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                answer[0] = message["status"]
            elif message["type"] == "http.response.body":
                answer[1] += len(message.get("body", b""))
            await send(message)

        try:
            await super().__call__(scope, receive, sending)
        finally:
            if count is not None:
                count(scope.get("oip_operation") or "unknown", answer[0])
            if log is not None:
                log(scope, answer[0], answer[1], start)


async def _stream(response: StreamingResponse, scope: Scope, receive: Receive, send: Send, counting: bool) -> int:
    """Send a streamed answer (its own way: it watches for the client going away); the body bytes it sent, when
    `counting` (the access log wants them), else 0."""
    if not counting:
        await response(scope, receive, send)
        return 0
    sent = 0

    async def counted(message: Any) -> None:
        nonlocal sent
        if message["type"] == "http.response.body":
            sent += len(message.get("body", b""))
        await send(message)

    await response(scope, receive, counted)
    return sent


def _path_pattern(path: str) -> re.Pattern[str]:
    """The route path as a regular expression: `{name}` matches one path segment, as in Starlette."""
    parts = re.split(r"\{(\w+)\}", path)
    return re.compile("".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)))



def create_app(
    dataplane: DataPlaneBase,
    settings: Settings,
    *,
    enabled: Sequence[str] | None = None,
    repository: ModelRepository | None = None,
    metrics: Metrics | None = None,
    scrape: Callable[[], Awaitable[list[Metric]]] | None = None,
    tracing: bool = False,
    pipeline: Pipeline | None = None,
) -> OipApp:
    """The REST app: one route per REST operation of the spec, answered by `dataplane`.

    `enabled`: the extensions served (None: every one), whose operations the published document lists;
    `repository`: where the ready models of the document come from, and where an inference route looks its model
    up first; `metrics`: what counts every answer, and `scrape` what answers GET /metrics (both: metrics on);
    `tracing`: inference requests carry the caller's trace context; `pipeline` (the data plane's): the common
    inference request takes the lean way (`rest.lean`).
    """
    lean = LeanInfer(pipeline, settings) if pipeline is not None else None
    app = OipApp(
        title=str(DOCUMENT.get("info", {}).get("title", "Open Inference Protocol")),
        version=str(DOCUMENT.get("info", {}).get("version", "")),
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
        **_NO_FRAMEWORK_TELEMETRY,
    )
    app.state.dataplane = dataplane
    app.state.settings = settings
    app.document = published_document(enabled)

    async def openapi_json(request: Request) -> Response:
        document = await openapi_document(dataplane, app.document, repository)
        return Response(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS), media_type=_JSON)

    async def docs(request: Request) -> Response:
        return get_swagger_ui_html(openapi_url=_OPENAPI_URL, title=f"{app.title} - Swagger UI")

    app.add_route(_OPENAPI_URL, openapi_json, methods=["GET"], include_in_schema=False)
    app.add_route("/docs", docs, methods=["GET"], include_in_schema=False)

    async def http_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, settings)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, http_error)
    app.add_exception_handler(OipError, http_error)
    app.add_exception_handler(Exception, http_error)

    if metrics is not None and scrape is not None:
        families = scrape

        async def serve_metrics(request: Request) -> Response:
            request.scope["oip_operation"] = "metrics"
            return Response(render(await families()), media_type=CONTENT_TYPE)

        app.add_route("/metrics", serve_metrics, methods=["GET"], include_in_schema=False)
        app.count = functools.partial(metrics.count, "rest")
    app.log = _access_log if settings.access_log else None

    every: list[Endpoint | RestOnlyEndpoint] = [*ENDPOINTS, *REST_ONLY_ENDPOINTS]
    for endpoint in sorted(every, key=_route_order):
        if isinstance(endpoint, RestOnlyEndpoint) or endpoint.operation in TENSOR_OPERATIONS:
            # One answer per route, taken both ways: by the HTTP layer without ASGI (a POST's small body), and
            # by the ASGI handler.
            answer = rest_only_answer(dataplane, settings, endpoint) if isinstance(endpoint, RestOnlyEndpoint) \
                else tensor_answer(dataplane, settings, endpoint, repository, tracing, lean)
            handler = answer_handler(endpoint, answer, settings)
            pattern = _path_pattern(endpoint.path)
            app.fast_routes += ((endpoint.method, pattern, handler),)
            if endpoint.method == "POST":
                app.direct_routes += ((pattern, endpoint.operation, tuple(endpoint.params), answer),)
        else:
            handler = message_handler(dataplane, settings, endpoint)
        app.add_route(endpoint.path, handler, methods=[endpoint.method], include_in_schema=False)
    return app


def _access_log(scope: Scope, status: int, sent: int, start: int) -> None:
    """The access log's line of an answered request (`--access-log`)."""
    method, path = scope.get("method", ""), scope.get("path", "")
    received = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"0")
    client = scope.get("client") or ("", 0)
    log_access("rest", scope.get("oip_operation") or "unknown", f"{method} {path}", status, start,
               int(received) if received.isdigit() else 0, sent, method=method, path=path, client=client[0])


def _route_order(endpoint: Endpoint | RestOnlyEndpoint) -> list[tuple[bool, str]]:
    """Literal path segments before templated ones (`/v2/models/stats` before `/v2/models/{model_name}`)."""
    return [(segment.startswith("{"), segment) for segment in endpoint.path.split("/")]



def metrics_app(scrape: Callable[[], Awaitable[list[Metric]]]) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The `--metrics-port` listener: GET /metrics (what `scrape` gives), and 404 for anything else."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            status, body, kind = 200, render(await scrape()), CONTENT_TYPE
        else:
            status, body, kind = 404, b'{"error":"not found: this listener serves GET /metrics"}', _JSON
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app
