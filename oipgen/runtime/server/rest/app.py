"""The REST transport: a FastAPI app whose routes are rendered from the spec's REST operations.

Routes only decode, call the data plane and encode; every rule of the protocol lives in the data plane.
- Ordinary operations: the path fields and the JSON body become the operation's protobuf request through
  `convert.rest_to_proto`; the reply goes back through `convert.proto_to_rest`. A health answer whose flag is
  false gets the not-ready status (`Settings.not_ready_status`) with the same body.
- Inference: a fast path that never builds pydantic models or Python lists of elements on the binary path.
  The JSON header is parsed with orjson, tensor `data` decoded by `codec.from_json`, and binary tensor data
  (`Inference-Header-Content-Length`, `binary_data_size`) is viewed in place with `codec.from_raw`. Outputs
  are written as JSON `data` (orjson writes numpy arrays directly) or as binary data after the JSON header
  (`binary_data` per requested output; `binary_data_output` for the outputs the request does not list, as
  Triton does).
- Operations that only REST has (Triton's generate extension): the JSON body must be an object without repeated
  keys; the data plane gets the path fields and the body and answers plain JSON, or an iterator of JSON answers
  sent as server-sent events (`data: <json>`). An error before the first event is an ordinary error answer; after
  it, a last event `data: {"error": "<message>"}`.
- Every error has one shape, `{"error": "<message>"}`: the data plane's errors by kind, undecodable bodies
  400, unknown paths 404, wrong methods 405, bodies over `Settings.max_request_bytes` 413, anything
  unexpected 500 (logged here, never sent with a traceback).
- Observability: `GET /metrics` (Prometheus, `Settings.metrics`); every answered request is counted by
  operation and status, and logged when `Settings.access_log` is on (logger `oip.access`: method, path, status,
  duration, bytes in and out); an inference request carries the caller's W3C trace context (`traceparent`,
  `tracestate` headers) to the data plane.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import re
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, Final, Literal, overload

import numpy as np
import numpy.typing as npt
import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from google.protobuf.message import Message
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ... import bodies, codec, convert, datatypes, extensions, framing
from ..core.dataplane_base import TENSOR_OPERATIONS, DataPlaneBase
from ..core.repository import ModelRepository
from ..errors import HTTP_STATUS, ErrorKind, InvalidRequest, ModelFailure, OipError, TooLarge, Unimplemented, bounded
from ..observe.metrics import CONTENT_TYPE, Metric, render
from ..observe.tracing import carrier
from ..settings import Settings
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .endpoints import ENDPOINTS, REST_ONLY_ENDPOINTS, Endpoint, RestOnlyEndpoint
from .http import BUFFER_BODIES
from .model_openapi import model_document
from .openapi import DOCUMENT

__all__ = [
    "ENDPOINTS", "REST_ONLY_ENDPOINTS", "Endpoint", "OipApp", "RestOnlyEndpoint", "create_app", "openapi_document",
]

log = logging.getLogger(__name__)
access_log = logging.getLogger("oip.access")

_JSON: Final = framing.JSON_TYPE
_OPENAPI_URL: Final = "/openapi.json"
# The requests the OpenAPI document asks the data plane (the ready models, their metadata), when the spec has them.
_REPOSITORY_INDEX_REQUEST: Final = next((e.request for e in ENDPOINTS if e.operation == "repository_index"), None)
_MODEL_METADATA_REQUEST: Final = next((e.request for e in ENDPOINTS if e.operation == "model_metadata"), None)
_EVENTS: Final = "text/event-stream; charset=utf-8"
# Keys of the binary tensor data extension (`framing`): REST encoding only, so the data plane never sees them.
_BINARY_OUTPUT: Final = framing.BINARY_DATA_OUTPUT  # request parameters: default for outputs not listed
_BINARY_SIZE: Final = framing.BINARY_DATA_SIZE  # input and output parameters: bytes in the binary part
_BINARY_DATA: Final = framing.BINARY_DATA  # requested-output parameters: this output as binary
_SHARED_MEMORY: Final = extensions.SHARED_MEMORY_REGION  # tensor parameters: data held by the shared memory extension
_INT_RANGE: Final = (-(2**63), 2**64 - 1)  # parameter integers: int64, or uint64 above int64's range


def _fields(schema: str) -> tuple[str, ...]:
    return tuple(f.prop for f in bodies.BINDINGS[schema].fields)


def _item_schema(schema: str, prop: str) -> str:
    return next(f.schema or "" for f in bodies.BINDINGS[schema].fields if f.prop == prop)


# The fields of an inference request, of its inputs and of its requested outputs, from the spec (none of them
# takes null).
_INFER_BODY: Final = next(e.body for e in ENDPOINTS if e.operation in TENSOR_OPERATIONS and e.body)
_REQUEST_FIELDS: Final = _fields(_INFER_BODY)
_INPUT_FIELDS: Final = _fields(_item_schema(_INFER_BODY, "inputs"))
_OUTPUT_FIELDS: Final = _fields(_item_schema(_INFER_BODY, "outputs"))
# The reserved parameters whose values are integers: JSON has one number type, so 16.0 is read as 16 for these
# (a free-form parameter keeps the number as it came: a double over gRPC).
_INTEGER_PARAMETERS: Final = frozenset({
    extensions.BINARY_DATA_SIZE, extensions.CLASSIFICATION, extensions.SHARED_MEMORY_BYTE_SIZE,
    extensions.SHARED_MEMORY_OFFSET,
})
_BINARY_EXTENSION: Final = extensions.PARAMETERS[_BINARY_SIZE]
_NO_BINARY: Final = (
    f"the {_BINARY_EXTENSION} extension is not enabled on this server: send and ask for tensor data as JSON "
    f"'data' (no Inference-Header-Content-Length header or '{_BINARY_SIZE}', '{_BINARY_OUTPUT}' and "
    f"'{_BINARY_DATA}' false)"
)


Handler = Callable[[Request], Awaitable[Response]]


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

    Inference requests (the tensor operations' routes, `fast_routes`) skip FastAPI's middleware and router:
    their handler answers every error itself, and the framework's layers (exception and telemetry middleware,
    the route table) cost a fifth of the CPU of a small inference. Anything else, and a wrong method on an
    inference path, goes through FastAPI as usual.
    """

    fast_routes: tuple[tuple[str, re.Pattern[str], Handler], ...] = ()
    # Told about every answered request: `count` (metrics) its operation and status; `log` (the access log) its
    # scope, status, bytes sent and start (perf_counter_ns).
    count: Callable[[str, int], None] | None = None
    log: Callable[[Scope, int, int, int], None] | None = None
    document: dict[str, Any] = DOCUMENT

    def openapi(self) -> dict[str, Any]:
        return self.document

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


def _path_pattern(path: str) -> re.Pattern[str]:
    """The route path as a regular expression: `{name}` matches one path segment, as in Starlette."""
    parts = re.split(r"\{(\w+)\}", path)
    return re.compile("".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)))


def create_app(dataplane: DataPlaneBase, settings: Settings) -> OipApp:
    """The REST app: one route per REST operation of the spec, answered by `dataplane`.

    The app's OpenAPI document (/openapi.json, /docs) is the spec's own with each ready model's inference
    (`openapi_document`). A path the spec does not have is a 404 and a method it does not allow a 405, both with
    an error body; `/v2/` is not `/v2` (no redirects).
    """
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
    app.document = published_document(settings.extensions)

    async def openapi_json(request: Request) -> Response:
        document = await openapi_document(dataplane, app.document)
        return Response(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS), media_type=_JSON)

    async def docs(request: Request) -> Response:
        return get_swagger_ui_html(openapi_url=_OPENAPI_URL, title=f"{app.title} - Swagger UI")

    app.add_route(_OPENAPI_URL, openapi_json, methods=["GET"], include_in_schema=False)
    app.add_route("/docs", docs, methods=["GET"], include_in_schema=False)

    async def http_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return _error(exc.status_code, str(exc.detail), exc.headers)
        return _error_response(exc, settings)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, http_error)
    app.add_exception_handler(OipError, http_error)
    app.add_exception_handler(Exception, http_error)

    metrics = getattr(dataplane, "metrics", None)
    if settings.metrics and metrics is not None:
        # The data plane's (a worker's answers the sum over the workers); DataPlaneBase has no metrics.
        families: Callable[[], Awaitable[list[Metric]]] = getattr(dataplane, "metric_families")  # noqa: B009

        async def serve_metrics(request: Request) -> Response:
            request.scope["oip_operation"] = "metrics"
            return Response(render(await families()), media_type=CONTENT_TYPE)

        app.add_route("/metrics", serve_metrics, methods=["GET"], include_in_schema=False)
        app.count = functools.partial(metrics.count, "rest")
    app.log = _access_log if settings.access_log else None

    every: list[Endpoint | RestOnlyEndpoint] = [*ENDPOINTS, *REST_ONLY_ENDPOINTS]
    for endpoint in sorted(every, key=_route_order):
        if isinstance(endpoint, RestOnlyEndpoint):
            handler = _json_handler(dataplane, settings, endpoint)
        elif endpoint.operation in TENSOR_OPERATIONS:
            handler = _tensor_handler(dataplane, settings, endpoint)
            app.fast_routes += ((endpoint.method, _path_pattern(endpoint.path), handler),)
        else:
            handler = _message_handler(dataplane, settings, endpoint)
        app.add_route(endpoint.path, handler, methods=[endpoint.method], include_in_schema=False)
    return app


async def openapi_document(dataplane: DataPlaneBase, base: dict[str, Any] = DOCUMENT) -> dict[str, Any]:
    """The OpenAPI document of this moment: `base` (the spec's document as this server publishes it,
    `published_document`), with the inference of every ready model version (and of each ready model at the version
    the server picks) from its metadata (`model_openapi.model_document`). The ready models come from the data
    plane's repository (with the model repository extension off too), else from its repository index; a data plane
    with neither publishes `base` alone."""
    repository = getattr(dataplane, "repository", None)
    if _MODEL_METADATA_REQUEST is None:
        return base
    if isinstance(repository, ModelRepository):
        ready = [(status.name, status.version) for status in repository.index(ready_only=True)]
    elif _REPOSITORY_INDEX_REQUEST is None:
        return base
    else:
        index_request: Any = _REPOSITORY_INDEX_REQUEST(ready=True)
        try:
            index = await dataplane.repository_index(index_request)
        except OipError:
            return base
        ready = [(entry.name, entry.version) for entry in index.models]
    versions: dict[str, list[str]] = {}
    for name, version in ready:
        versions.setdefault(name, []).extend([version] if version else [])
    models = []
    for name, ready_versions in versions.items():
        for version in ["", *ready_versions]:
            request: Any = _MODEL_METADATA_REQUEST(name=name, version=version)
            try:
                models.append((version, await dataplane.model_metadata(request)))
            except OipError:  # unloaded meanwhile
                continue
    # Made in a worker thread: a first document over many models takes a while, and inference must not wait.
    return await asyncio.to_thread(model_document, models, base)


def _access_log(scope: Scope, status: int, sent: int, start: int) -> None:
    """The access log's line of an answered request (`--access-log`)."""
    duration_ms = (time.perf_counter_ns() - start) / 1e6
    received = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"0").decode()
    client = scope.get("client") or ("", 0)
    path = scope.get("path", "")
    operation = scope.get("oip_operation") or "unknown"
    access_log.info(
        '%s "%s %s" %d %.3f ms %s bytes in, %d bytes out', client[0], scope.get("method"), path, status,
        duration_ms, received, sent,
        extra={"access": {
            "transport": "rest", "operation": operation, "method": scope.get("method"), "path": path,
            "status": status, "duration_ms": round(duration_ms, 3), "request_bytes": int(received or 0),
            "response_bytes": sent, "client": client[0],
        }},
    )


def published_document(extensions: list[str] | None) -> dict[str, Any]:
    """The spec's document as this server serves it: without the operations (and tags) of the extensions that
    are not enabled (tags with `x-oip-extension: true`, named as the extension), which answer 501."""
    if extensions is None:  # every extension
        return DOCUMENT
    off = {tag["name"] for tag in DOCUMENT.get("tags", [])
           if tag.get("x-oip-extension") and tag["name"] not in extensions}
    if not off:
        return DOCUMENT
    paths: dict[str, Any] = {}
    for path, item in DOCUMENT.get("paths", {}).items():
        kept = {key: op for key, op in item.items()
                if not (isinstance(op, dict) and off.intersection(op.get("tags", ())))}
        if any(isinstance(op, dict) and "responses" in op for op in kept.values()):
            paths[path] = kept
    tags = [tag for tag in DOCUMENT.get("tags", []) if tag["name"] not in off]
    return {**DOCUMENT, "tags": tags, "paths": paths}


def _route_order(endpoint: Endpoint | RestOnlyEndpoint) -> list[tuple[bool, str]]:
    """Literal path segments before templated ones (`/v2/models/stats` before `/v2/models/{model_name}`)."""
    return [(segment.startswith("{"), segment) for segment in endpoint.path.split("/")]


# --- errors ---------------------------------------------------------------------------------------------------


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps({"error": bounded(message)}), status_code=status, media_type=_JSON, headers=headers)


def _error_response(exc: BaseException, settings: Settings) -> Response:
    """The error body and status for anything a route raised."""
    if isinstance(exc, OipError):
        status = settings.not_ready_status if exc.kind is ErrorKind.NOT_READY else HTTP_STATUS[exc.kind]
        return _error(status, exc.message)
    if isinstance(exc, HTTPException):
        return _error(exc.status_code, str(exc.detail), exc.headers)
    if isinstance(exc, convert.ConvertError | codec.CodecError | RequestValidationError):
        return _error(HTTP_STATUS[ErrorKind.INVALID_ARGUMENT], str(exc))
    log.error("unexpected error answering a REST request", exc_info=exc)
    return _error(HTTP_STATUS[ErrorKind.MODEL_FAILURE], f"internal server error ({type(exc).__name__})")


# --- bodies ---------------------------------------------------------------------------------------------------


@overload
async def _read_body(request: Request, limit: int) -> bytes: ...
@overload
async def _read_body(request: Request, limit: int, *, view: Literal[True]) -> bytes | memoryview: ...
async def _read_body(request: Request, limit: int, *, view: bool = False) -> bytes | memoryview:
    """The whole request body, refused (413) as soon as it is known to exceed `limit` bytes. With `view`, a large
    uncompressed body of a declared size is received into one buffer of that size as it arrives, and returned as a
    read-only view of it: the body is held once, never as its pieces and their concatenation at the same time."""
    declared = _header(request, b"content-length")
    size = None
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest(f"invalid Content-Length {declared!r}") from None
        if size > limit:
            raise TooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    encoding = (_header(request, b"content-encoding") or "").strip().lower()
    identity = encoding in ("", "identity")
    buffer = bytearray(size) if view and identity and size is not None and size >= _ONE_BUFFER_FROM else None
    chunks: list[bytes] = []
    total = 0
    receive = request.receive  # the ASGI messages themselves: Request.stream's generator costs more per request
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # Gone, or closed by the HTTP layer for pausing too long: nobody reads the answer.
            raise InvalidRequest("the connection closed before the request body arrived")
        chunk = message.get("body", b"")
        if chunk:
            end = total + len(chunk)
            if end > limit or (buffer is not None and end > len(buffer)):
                raise TooLarge(f"request body exceeds the limit of {limit} bytes")
            if buffer is not None:
                buffer[total:end] = chunk
            else:
                chunks.append(chunk)
            total = end
        if not message.get("more_body", False):
            break
    if buffer is not None:
        return memoryview(buffer).toreadonly()[:total]
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if identity:
        return body
    if encoding in ("gzip", "deflate"):
        return await asyncio.to_thread(_inflate, body, encoding, limit)  # off the loop: it can take a while
    raise InvalidRequest(f"unsupported Content-Encoding {encoding!r}; send gzip, deflate or identity")


_ONE_BUFFER_FROM: Final = 1 << 16  # declared body bytes from which `_read_body(view=True)` fills one buffer
_HEADER_LENGTH: Final = framing.HEADER_LENGTH.lower().encode("latin-1")


def _header(request: Request, name: bytes) -> str | None:
    """The value of the request's header `name` (lowercase, as ASGI gives header names), None when it has none.
    Read from the ASGI scope: Starlette's `Headers.get` raises and catches a KeyError for each absent header, and the
    inference path asks for three that are mostly absent."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


# Inflating a compressed body: in chunks of _INFLATE_CHUNK, keeping at most _INFLATE_KEEP inflated bytes while the
# size is unknown. A body that inflates beyond that is first only counted (its output dropped chunk by chunk), so a
# body that inflates beyond the limit is refused having held at most _INFLATE_KEEP + _INFLATE_CHUNK bytes; one
# within the limit is inflated again in one call with its exact size as the output buffer's (CPython then hands
# that buffer over as the bytes object: the peak is the body's size, not twice it).
_INFLATE_CHUNK: Final = 1024 * 1024
_INFLATE_KEEP: Final = 16 * 1024 * 1024


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed body, inflated to at most `limit` bytes; memory bounded as said above."""
    wbits = zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS
    kept: list[bytes] | None = []
    size = 0
    for chunk in _inflated_chunks(body, wbits, encoding):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body inflates beyond the limit of {limit} bytes")
        if kept is not None:
            kept.append(chunk)
            if size > _INFLATE_KEEP:
                kept = None  # too large to keep twice: count the rest, then inflate again into one buffer
    if kept is not None:
        return kept[0] if len(kept) == 1 else b"".join(kept)
    return zlib.decompress(body, wbits, size)  # valid and `size` bytes long: the first pass said so


def _inflated_chunks(body: bytes, wbits: int, encoding: str) -> Iterator[bytes]:
    """The inflated body, _INFLATE_CHUNK bytes at a time; 400 if it is not valid or is truncated."""
    inflater = zlib.decompressobj(wbits)
    pending = body
    try:
        while True:
            chunk = inflater.decompress(pending, _INFLATE_CHUNK)
            pending = inflater.unconsumed_tail
            if chunk:
                yield chunk
            if inflater.eof or (not chunk and not pending):
                break
    except zlib.error as exc:
        raise InvalidRequest(f"request body is not valid {encoding} data: {exc}") from None
    if not inflater.eof:
        raise InvalidRequest(f"request body is truncated {encoding} data")


def _parse_json(data: bytes | memoryview, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type=_JSON)


# --- ordinary operations --------------------------------------------------------------------------------------


def _message_handler(dataplane: DataPlaneBase, settings: Settings, endpoint: Endpoint) -> Handler:
    call: Callable[[Message], Awaitable[Message]] = getattr(dataplane, endpoint.operation)

    async def handle(request: Request) -> Response:
        request.scope["oip_operation"] = endpoint.operation
        try:
            fields = {field: request.path_params[name] for name, field in endpoint.params}
            body: Any = None
            if endpoint.body is not None:
                raw = await _read_body(request, settings.max_request_bytes)
                if not raw.strip():
                    if endpoint.body_required:
                        raise InvalidRequest("the request body is empty; this operation needs a JSON body")
                    body = {}
                else:
                    body = _parse_json(raw, "the request body")
                    if body is None:
                        raise InvalidRequest("the request body is null; send a JSON object")
            try:
                message = convert.request_to_proto(endpoint.operation, body, path=fields, strict=True)
            except (ValueError, TypeError, AttributeError, KeyError) as exc:  # the body does not fit the schema
                raise InvalidRequest(f"invalid request body: {exc}") from None
            reply = await call(message)
            if endpoint.response is None:
                return Response(status_code=200)
            out = convert.proto_to_rest(
                endpoint.response, reply, **{p: fields[p] for p in endpoint.rest_only if p in fields}
            )
            if endpoint.print_defaults:
                bodies.complete(endpoint.response, out)
            healthy = endpoint.health is None or bool(getattr(reply, endpoint.health))
            return _json(out, 200 if healthy else settings.not_ready_status)
        except Exception as exc:
            return _error_response(exc, settings)

    return handle


# --- operations that only REST has -----------------------------------------------------------------------------


def _json_handler(dataplane: DataPlaneBase, settings: Settings, endpoint: RestOnlyEndpoint) -> Handler:
    call: Callable[[dict[str, str], dict[str, Any]], Any] = getattr(dataplane, endpoint.operation)

    async def handle(request: Request) -> Response:
        try:
            fields = {field: request.path_params[name] for name, field in endpoint.params}
            raw = await _read_body(request, settings.max_request_bytes)
            body = _json_object(raw) if raw.strip() else {}
            if not endpoint.events:
                return _json(await call(fields, body))
            answers: AsyncIterator[dict[str, Any]] = call(fields, body)
            try:
                first = await anext(answers)
            except StopAsyncIteration:
                return Response(b"", media_type=_EVENTS)
            except BaseException:
                await _close(answers)
                raise
            return StreamingResponse(_events(first, answers, settings), media_type=_EVENTS)
        except Exception as exc:
            return _error_response(exc, settings)

    return handle


def _json_object(raw: bytes) -> dict[str, Any]:
    """The request body: a JSON object in which no key appears twice (the generate extension reads every key)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise InvalidRequest(f"key '{key}' appears more than once in the request body")
            out[key] = value
        return out

    try:
        doc = json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, OipError):
            raise
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {_kind(doc)}")
    return doc


async def _events(
    first: dict[str, Any], answers: AsyncIterator[dict[str, Any]], settings: Settings
) -> AsyncIterator[bytes]:
    """Server-sent events: one `data:` event per answer; an error ends the stream with an `error` event."""
    try:
        yield _event(first)
        try:
            async for answer in answers:
                yield _event(answer)
        except Exception as exc:
            message = _error_message(exc)
            yield _event({"error": message})
    finally:
        await _close(answers)


def _event(answer: dict[str, Any]) -> bytes:
    try:
        data = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        data = orjson.dumps({"error": f"the model's response cannot be written as JSON: {exc}"})
    return b"data: " + data + b"\n\n"


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, OipError):
        return exc.message
    log.error("unexpected error while streaming a REST answer", exc_info=exc)
    return f"internal server error ({type(exc).__name__})"


async def _close(answers: AsyncIterator[Any]) -> None:
    aclose = getattr(answers, "aclose", None)
    if aclose is not None:
        await aclose()


# --- inference ------------------------------------------------------------------------------------------------


def _tensor_handler(dataplane: DataPlaneBase, settings: Settings, endpoint: Endpoint) -> Handler:
    call: Callable[[InferRequest], Awaitable[InferResponse]] = getattr(dataplane, endpoint.operation)
    repository = getattr(dataplane, "repository", None)
    models = repository if isinstance(repository, ModelRepository) else None

    async def handle(request: Request) -> Response:
        request.scope["oip_operation"] = endpoint.operation
        try:
            raw = await _read_body(request, settings.max_request_bytes, view=True)
            fields = {field: request.path_params[name] for name, field in endpoint.params}
            header_length = _header(request, _HEADER_LENGTH)
            try:
                if header_length is not None and not binary_enabled(settings):
                    raise Unimplemented(_NO_BINARY)
                if header_length is not None and header_length.strip() == "0":
                    # The whole body is the data of the model's single input (the data plane gives it the
                    # input's declared shape); every output comes back binary.
                    infer_request = InferRequest(**fields, raw_input=raw)
                    listed: dict[str, bool] = {}
                    default_binary = True
                else:
                    infer_request, listed, default_binary = decode_infer_request(raw, header_length, settings)
            except Exception:
                if models is not None:
                    # The model the path names first (404 unknown, 503 not ready), whatever the body: the
                    # body's meaning depends on the model. A body that decodes goes on to the data plane, which
                    # looks the model up before anything else.
                    models.get(fields.get("model_name", ""), fields.get("model_version", ""))
                raise
            for field, value in fields.items():
                setattr(infer_request, field, value)
            infer_request.transport = "rest"
            if settings.tracing:
                infer_request.trace = carrier(lambda name: _header(request, name.encode("latin-1")))
            response = await call(infer_request)
            extensions = request.scope.get("extensions") or {}
            return encode_infer_response(response, listed, default_binary, parts=BUFFER_BODIES in extensions)
        except Exception as exc:
            return _error_response(exc, settings)

    return handle


def binary_enabled(settings: Settings) -> bool:
    """Whether the binary tensor data extension is on (`Settings.extensions`; None: every extension)."""
    return settings.extensions is None or _BINARY_EXTENSION in settings.extensions


def _parameters(value: Any, where: str) -> dict[str, Any]:
    """A parameters object: a JSON object of booleans, numbers and strings (a fresh dict, safe to change)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} parameters must be a JSON object, got {_kind(value)}")
    for key, item in value.items():
        if isinstance(item, float) and key in _INTEGER_PARAMETERS and item.is_integer():
            value[key] = int(item)
            continue
        if isinstance(item, bool | float | str):
            continue
        if isinstance(item, int) and _INT_RANGE[0] <= item <= _INT_RANGE[1]:
            continue
        raise InvalidRequest(
            f"{where} parameter '{key}' has invalid type: parameter values are booleans, numbers or strings, "
            f"got {_kind(item)}"
        )
    return value


def _no_null(item: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    """InvalidRequest when one of the `fields` of `item` is JSON null: no field takes null (leave it out instead);
    keys the protocol does not have are ignored, whatever their value."""
    if None in item.values():
        key = next((k for k in fields if k in item and item[k] is None), None)
        if key is not None:
            raise InvalidRequest(f"{where}: '{key}' is null; leave the field out instead")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        missing = f"needs '{key}'" if value is None else f"'{key}' must be a string, got {_kind(value)}"
        raise InvalidRequest(f"{where} {missing}")
    return value


def _flag(params: dict[str, Any], key: str, where: str) -> bool | None:
    value = params.pop(key, None)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"{where} parameter '{key}' must be a boolean, got {_kind(value)}")
    return value


def decode_infer_request(
    raw: bytes | memoryview, header_length: str | None, settings: Settings
) -> tuple[InferRequest, dict[str, bool], bool]:
    """Decode an inference body: JSON, or a JSON header followed by binary tensor data.

    Returns the request (model name and version still empty: they come from the path), whether each listed
    output is wanted as binary data, and the binary default for outputs the request does not list.
    """
    try:
        head, rest = framing.split(raw, header_length)
    except framing.FramingError as exc:
        raise InvalidRequest(str(exc)) from None
    binary = framing.BinaryData(rest)
    if not len(head):
        raise InvalidRequest("the request body is empty; expected a JSON inference request")
    doc = _parse_json(head, "the inference request")
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the inference request must be a JSON object, got {_kind(doc)}")
    _no_null(doc, _REQUEST_FIELDS, "the inference request")

    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a string, got {_kind(request_id)}")
    parameters = _parameters(doc.get("parameters"), "request")
    binary_on = binary_enabled(settings)  # off: asking for binary data (true flags, binary_data_size) is 501
    default_binary = bool(_flag(parameters, _BINARY_OUTPUT, "request"))
    if default_binary and not binary_on:
        raise Unimplemented(_NO_BINARY)

    items = doc.get("inputs")
    if not isinstance(items, list):
        raise InvalidRequest("the inference request needs 'inputs', an array of tensors" if items is None
                             else f"'inputs' must be an array, got {_kind(items)}")
    inputs: list[Tensor] = []
    limit = settings.max_tensor_elements
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input {i} must be a JSON object, got {_kind(item)}")
        where = f"input {i}"
        _no_null(item, _INPUT_FIELDS, where)
        name = _string(item, "name", where)
        where = f"input '{name}'"
        datatype = _string(item, "datatype", where)
        shape = item.get("shape")
        if shape is None:
            raise InvalidRequest(f"{where} needs 'shape'")
        count = codec.element_count(shape, name=name)
        if count > limit:
            raise TooLarge(f"{where}: shape {shape} has {count} elements, more than the {limit} allowed per tensor")
        params = _parameters(item.get("parameters"), where)
        size = params.pop(_BINARY_SIZE, None)
        if size is not None and not binary_on:
            raise Unimplemented(_NO_BINARY)
        data = item.get("data")
        array: npt.NDArray[Any] | None
        if size is not None:
            if data is not None:
                raise InvalidRequest(f"{where} must set only one of 'data' and 'binary_data_size', it sets both")
            try:
                chunk = binary.take(size, where)
            except framing.FramingError as exc:
                raise InvalidRequest(str(exc)) from None
            array = codec.from_raw(chunk, datatype, shape, name=name)
        elif data is not None:
            array = codec.from_json(data, datatype, shape, name=name)
        elif _SHARED_MEMORY in params:
            array = None  # the data plane reads it from the region
        else:
            raise InvalidRequest(f"{where} has no data: set 'data' or binary_data_size")
        inputs.append(Tensor(name, datatype, list(shape), array, params))
    try:
        binary.finish()
    except framing.FramingError as exc:
        raise InvalidRequest(str(exc)) from None

    listed: dict[str, bool] = {}
    outputs: list[RequestedOutput] = []
    wanted = doc.get("outputs")
    if wanted is not None:
        if not isinstance(wanted, list):
            raise InvalidRequest(f"'outputs' must be an array, got {_kind(wanted)}")
        for i, item in enumerate(wanted):
            if not isinstance(item, dict):
                raise InvalidRequest(f"output {i} must be a JSON object, got {_kind(item)}")
            _no_null(item, _OUTPUT_FIELDS, f"output {i}")
            name = _string(item, "name", f"output {i}")
            params = _parameters(item.get("parameters"), f"output '{name}'")
            listed[name] = bool(_flag(params, _BINARY_DATA, f"output '{name}'"))
            if listed[name] and not binary_on:
                raise Unimplemented(_NO_BINARY)
            if listed[name] and _SHARED_MEMORY in params:
                raise InvalidRequest(f"output '{name}' can't set both '{_SHARED_MEMORY}' and '{_BINARY_DATA}'")
            outputs.append(RequestedOutput(name, params))

    infer_request = InferRequest(
        model_name="", id=request_id or "", parameters=parameters, inputs=inputs, outputs=outputs
    )
    return infer_request, listed, default_binary


def encode_infer_response(
    response: InferResponse, listed: Mapping[str, bool], default_binary: bool, *, parts: bool = False
) -> Response:
    """The REST answer: JSON, or a JSON header followed by the outputs asked for as binary data. With `parts` (the
    server writes bytes-like bodies as they are: `http.BUFFER_BODIES`), large binary outputs are sent from the
    model's arrays (`BinaryParts`)."""
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        parameters = dict(tensor.parameters)
        binary = listed.get(tensor.name, default_binary)
        if tensor.data is None:  # written to shared memory: no data here, as Triton answers
            if parameters:
                entry["parameters"] = parameters
        elif binary:
            data = _raw_data(tensor)
            size = parameters[_BINARY_SIZE] = framing.size_of(data)
            if size:
                chunks.append(data)
            entry["parameters"] = parameters
        else:
            if parameters:
                entry["parameters"] = parameters
            entry["data"] = _json_data(tensor)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = response.parameters
    body["outputs"] = outputs
    try:
        header = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise ModelFailure(f"the model's response cannot be written as JSON: {exc}") from None
    if parts and sum(framing.size_of(chunk) for chunk in chunks) >= _PARTS_FROM:
        return BinaryParts(header, chunks)
    content, headers = framing.join(header, chunks)
    return Response(content, headers=headers)


_PARTS_FROM: Final = 1 << 16  # binary output bytes from which an answer is sent as its parts, not one body


class BinaryParts(Response):
    """A binary inference answer written as its parts: the JSON header, then each output's bytes as the data plane
    gave them (views of the model's arrays where possible), so the tensor data is never copied into one body.
    Below _PARTS_FROM bytes, one body costs less than a message per part."""

    def __init__(self, header: bytes, chunks: list[bytes | memoryview]) -> None:
        self.parts = [header, *chunks]
        self.size = sum(framing.size_of(part) for part in self.parts)
        super().__init__(None, headers={**framing.headers(header), "Content-Length": str(self.size)})

    async def send_parts(self, send: Send) -> None:
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await self.send_parts(send)


def _raw_data(tensor: Tensor) -> bytes | memoryview:
    if tensor.data is None:
        return b""
    try:
        return codec.to_raw(tensor.data, tensor.datatype, name=tensor.name)
    except codec.CodecError as exc:
        raise ModelFailure(str(exc)) from None


def _json_data(tensor: Tensor) -> npt.NDArray[Any] | list[Any]:
    """Flat JSON `data` of an output: the array itself where orjson writes it as `to_json` would, else a list."""
    info = datatypes.BY_NAME.get(tensor.datatype)
    if info is not None and not info.json:
        raise InvalidRequest(
            f"output '{tensor.name}': sending {info.name} data via JSON is not supported; ask for it as binary data "
            "(binary_data: true)"
        )
    data = tensor.data
    if data is None:
        return []
    if info is not None and isinstance(data, np.ndarray) and data.dtype == info.dtype and info.dtype.isnative:
        kind = info.dtype.kind
        if kind in "biu" or (kind == "f" and info.dtype.itemsize == 8):
            return np.ascontiguousarray(data).reshape(-1)
        if kind == "f":  # float32: widened, so the numbers read exactly as Python floats print them
            return data.astype(np.float64).reshape(-1)
    try:
        return codec.to_json(data, tensor.datatype, name=tensor.name)
    except codec.CodecError as exc:
        raise ModelFailure(str(exc)) from None
