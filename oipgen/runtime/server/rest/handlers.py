"""The REST routes' handlers, one kind per kind of operation, and the one shape of a REST error.

Handlers only decode, call the data plane and encode; every rule of the protocol lives in the data plane.
- Ordinary operations: the path fields and the JSON body become the operation's protobuf request through
  `convert.request_to_proto`; the reply goes back through `convert.proto_to_rest`. A health answer whose flag is
  false gets the not-ready status (`Settings.not_ready_status`) with the same body.
- Inference (`infer_codec`): the body decoded to the data plane's tensors, its answer encoded back; the caller's
  W3C trace context (`traceparent`, `tracestate` headers) travels with the request when tracing is on. The common
  request (JSON, or a JSON header and binary data) takes the lean way first (`lean`), which leaves any other to
  this one untouched.
- Operations that only REST has (Triton's generate extension): the JSON body must be an object without repeated
  keys; the data plane gets the path fields and the body and answers plain JSON, or an iterator of JSON answers
  sent as server-sent events (`data: <json>`). An error before the first event is an ordinary error answer; after
  it, a last event `data: {"error": "<message>"}`.
- Every error has one shape, `{"error": "<message>"}`: the data plane's errors by kind (`HTTP_STATUS`), undecodable
  bodies 400, bodies over `Settings.max_request_bytes` 413, anything unexpected 500 (`errors.failure`: logged,
  never sent with a traceback).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import orjson
from fastapi.exceptions import RequestValidationError
from google.protobuf.message import Message
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ... import bodies, convert, framing
from ..core.dataplane_base import DataPlaneBase
from ..core.repository import ModelRepository
from ..errors import ErrorKind, InvalidRequest, Unimplemented, bounded, failure
from ..observe.tracing import carrier
from ..settings import Settings
from ..types import InferRequest, InferResponse
from .body import HEADER_LENGTH, header_value, json_kind, parse_json, read_body
from .endpoints import Endpoint, RestOnlyEndpoint
from .http import BUFFER_BODIES, Answer
from .infer_codec import NO_BINARY, binary_enabled, decode_infer_request, encode_infer_response, parse_infer_body
from .lean import LeanInfer

__all__ = ["HTTP_STATUS", "Handler", "answer_handler", "error_response", "message_handler", "rest_only_answer",
           "tensor_answer"]

Handler = Callable[[Request], Awaitable[Response]]

HTTP_STATUS: Final[dict[ErrorKind, int]] = {
    ErrorKind.INVALID_ARGUMENT: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.NOT_READY: 503,  # Settings.not_ready_status may make it 400, as Triton and MLServer answer
    ErrorKind.UNIMPLEMENTED: 501,
    ErrorKind.MODEL_FAILURE: 500,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.ALREADY_EXISTS: 400,  # as Triton (a shared memory region registered twice)
    ErrorKind.CANCELLED: 499,  # the caller went away; recorded, never sent
    ErrorKind.EXHAUSTED: 429,
}
_JSON: Final = framing.JSON_TYPE
_EVENTS: Final = "text/event-stream; charset=utf-8"


# --- errors ---------------------------------------------------------------------------------------------------


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """An error answer: `{"error": message}` (bounded) with `status`."""
    return Response(orjson.dumps({"error": bounded(message)}), status_code=status, media_type=_JSON, headers=headers)


def error_response(exc: BaseException, settings: Settings) -> Response:
    """The error answer to anything a route raised: the framework's own HTTP errors keep their status."""
    if isinstance(exc, HTTPException):
        return error(exc.status_code, str(exc.detail), exc.headers)
    if isinstance(exc, RequestValidationError):
        exc = InvalidRequest(str(exc))
    reason = failure(exc, "answering a REST request")
    kind = reason.kind
    return error(settings.not_ready_status if kind is ErrorKind.NOT_READY else HTTP_STATUS[kind], reason.message)


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type=_JSON)


# --- ordinary operations --------------------------------------------------------------------------------------


def message_handler(dataplane: DataPlaneBase, settings: Settings, endpoint: Endpoint) -> Handler:
    call: Callable[[Message], Awaitable[Message]] = getattr(dataplane, endpoint.operation)

    async def handle(request: Request) -> Response:
        request.scope["oip_operation"] = endpoint.operation
        try:
            fields = {field: request.path_params[name] for name, field in endpoint.params}
            body: Any = None
            if endpoint.body is not None:
                raw = await read_body(request, settings.max_request_bytes)
                if not raw.strip():
                    if endpoint.body_required:
                        raise InvalidRequest("the request body is empty; this operation needs a JSON body")
                    body = {}
                else:
                    body = parse_json(raw, "the request body")
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
            return error_response(exc, settings)

    return handle


# --- operations that only REST has -----------------------------------------------------------------------------


def rest_only_answer(dataplane: DataPlaneBase, settings: Settings, endpoint: RestOnlyEndpoint) -> Answer:
    """A REST-only route's answer (`Answer`, which the HTTP layer also calls without ASGI): the body as a JSON
    object (none: `{}`) to the data plane with the path fields; its answer as JSON, or its answers as server-sent
    events (a `StreamingResponse`, once the first is known: an error before it is an ordinary error answer)."""
    call: Callable[[dict[str, str], dict[str, Any]], Any] = getattr(dataplane, endpoint.operation)
    events = endpoint.events

    async def answer(fields: dict[str, Any], raw: bytes | memoryview, headers: Sequence[tuple[bytes, bytes]],
                     parts: bool) -> Response:
        try:
            data = bytes(raw)
            body = _json_object(data) if data.strip() else {}
            if not events:
                return _json(await call(fields, body))
            answers: AsyncIterator[dict[str, Any]] = call(fields, body)
            try:
                first = await anext(answers)
            except StopAsyncIteration:
                return Response(b"", media_type=_EVENTS)
            except BaseException:
                await _close(answers)
                raise
            return StreamingResponse(_events(first, answers), media_type=_EVENTS)
        except Exception as exc:
            return error_response(exc, settings)

    return answer


def _json_object(raw: bytes) -> dict[str, Any]:
    """The request body: a JSON object in which no key appears twice (the generate extension reads every key)."""
    doc = parse_json(raw, "the request body", unique_keys=True)
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {json_kind(doc)}")
    return doc


async def _events(
    first: dict[str, Any], answers: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[bytes]:
    """Server-sent events: one `data:` event per answer; an error ends the stream with an `error` event."""
    try:
        yield _event(first)
        try:
            async for answer in answers:
                yield _event(answer)
        except Exception as exc:
            yield _event({"error": failure(exc, "streaming a REST answer").message})
    finally:
        await _close(answers)


def _event(answer: dict[str, Any]) -> bytes:
    try:
        data = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        data = orjson.dumps({"error": f"the model's response cannot be written as JSON: {exc}"})
    return b"data: " + data + b"\n\n"


async def _close(answers: AsyncIterator[Any]) -> None:
    aclose = getattr(answers, "aclose", None)
    if aclose is not None:
        await aclose()


# --- inference ------------------------------------------------------------------------------------------------


def tensor_answer(dataplane: DataPlaneBase, settings: Settings, endpoint: Endpoint,
                  repository: ModelRepository | None, tracing: bool, lean: LeanInfer | None = None) -> Answer:
    """An inference route's answer (`Answer`): with `repository`, an unknown model is refused before a body that
    does not decode; with `tracing`, the caller's trace context goes with the request; with `lean`, a body tries
    the lean way first (`rest.lean`)."""
    call: Callable[[InferRequest], Awaitable[InferResponse]] = getattr(dataplane, endpoint.operation)

    def model_first(fields: dict[str, Any]) -> None:
        """The model the path names first (404 unknown, 503 not ready), when the body does not decode: its meaning
        depends on the model. A body that decodes goes on to the data plane, which looks the model up before
        anything else."""
        if repository is not None:
            repository.get(fields.get("model_name", ""), fields.get("model_version", ""))

    async def answer(fields: dict[str, Any], raw: bytes | memoryview, headers: Sequence[tuple[bytes, bytes]],
                     parts: bool) -> Response:
        try:
            header_length = header_value(headers, HEADER_LENGTH)
            trace = carrier(lambda name: header_value(headers, name.encode("latin-1"))) if tracing else None
            infer_request: InferRequest | None = None
            try:
                if header_length is not None and not binary_enabled(settings):
                    raise Unimplemented(NO_BINARY)
                if header_length is not None and header_length.strip() == "0":
                    # The whole body is the data of the model's single input (the data plane gives it the
                    # input's declared shape); every output comes back binary.
                    infer_request = InferRequest(**fields, raw_input=raw)
                    listed: dict[str, bool] = {}
                    default_binary = True
                else:
                    parsed = parse_infer_body(raw, header_length)
            except Exception:
                model_first(fields)
                raise
            if infer_request is None:
                if lean is not None:
                    quick = await lean(fields, parsed[0], parsed[1], trace, parts)
                    if quick is not None:
                        return quick
                try:
                    infer_request, listed, default_binary = decode_infer_request(raw, header_length, settings, parsed)
                except Exception:
                    model_first(fields)
                    raise
            for field, value in fields.items():
                setattr(infer_request, field, value)
            infer_request.transport = "rest"
            infer_request.trace = trace
            response = await call(infer_request)
            return encode_infer_response(response, listed, default_binary, parts=parts)
        except Exception as exc:
            return error_response(exc, settings)

    return answer


# --- the ASGI way ------------------------------------------------------------------------------------------------


def answer_handler(endpoint: Endpoint | RestOnlyEndpoint, answer: Answer, settings: Settings) -> Handler:
    """A route's handler over ASGI: the body read whole, then `answer`, the route's answer that the HTTP layer also
    calls without ASGI (`tensor_answer`, `rest_only_answer`)."""

    async def handle(request: Request) -> Response:
        scope = request.scope
        scope["oip_operation"] = endpoint.operation
        try:
            raw = await read_body(request, settings.max_request_bytes, view=True)
        except Exception as exc:
            return error_response(exc, settings)
        fields = {field: request.path_params[name] for name, field in endpoint.params}
        extensions = scope.get("extensions") or {}
        return await answer(fields, raw, scope["headers"], BUFFER_BODIES in extensions)

    return handle
