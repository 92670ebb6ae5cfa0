"""A unary call is handed to a thread of the pool once its request has arrived (`defer`).

grpcio's synchronous server hands a unary call to its pool as soon as the call's headers are in; the pool's thread
then asks for the request message and sleeps until the polling thread, having received it, wakes it up again. So
every unary call costs two wake-ups of a pool thread, and a call whose request is slow to arrive (a large tensor on
a slow link, a client that sends its headers and nothing more) holds a thread all that time: as many such calls as
the pool has threads, and the port serves no one. Here the polling thread asks for the request when the call
starts and hands the call to the pool once it is in: one wake-up per call, and no thread before there is work.

A call handed on so may be answered by a behaviour that needs no servicer context (`answer`): its reply is sent as
grpcio sends it, without the context grpcio makes and finalizes for every call. Nor does it hand the call's trace
context to grpcio's observability plugin when none is registered (grpcio-observability, CSM: `_traced`): grpcio
looks for one through a generator context manager and a lock on every call, about 4% of a small call's CPU.

This reaches into grpcio's server module (a call's state, its receive callback, the token that counts it, how it
sends a status) as grpcio 1.76 to 1.85 have them. `SUPPORTED` checks that shape at import; where it differs, every
call takes grpcio's own way, unchanged. `streams` tells a call whose responses stream by the function grpcio runs
it with, and `method` the method a call is to (the pool gives each kind threads of its own); where grpcio differs,
no call is a stream, and none has a method.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Final

from grpc import _observability  # private: see the module's description
from grpc import _server as _grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]  # grpcio ships no types for its core

__all__ = ["SUPPORTED", "answer", "defer", "method", "streams"]

log = logging.getLogger(__name__)

_RESPOND: Final = getattr(_grpc, "_unary_response_in_pool", None)
_NO_PLUGIN: Final = object()
_STREAM_RESPONSES: Final = getattr(_grpc, "_stream_response_in_pool", None)
_RESPOND_PARAMETERS: Final = (
    "rpc_event", "state", "behavior", "argument_thunk", "request_deserializer", "response_serializer",
)


def _supported() -> bool:
    """Whether grpcio's server module has the shape `defer` relies on."""
    names = ("_receive_message", "_is_rpc_state_active", "_abort", "_status", "_CLOSED", "_RECEIVE_MESSAGE_TOKEN")
    if _RESPOND is None or not all(hasattr(_grpc, name) for name in names):
        return False
    core = ("ReceiveMessageOperation", "install_context_from_request_call_event", "uninstall_context")
    if not all(hasattr(cygrpc, name) for name in core):
        return False
    try:
        respond = tuple(inspect.signature(_RESPOND).parameters)
        receive = tuple(inspect.signature(_grpc._receive_message).parameters)
        status = tuple(inspect.signature(_grpc._status).parameters)
    except (TypeError, ValueError):
        return False
    return (respond == _RESPOND_PARAMETERS and receive == ("state", "call", "request_deserializer")
            and status == ("rpc_event", "state", "serialized_response"))


SUPPORTED: Final = _supported()


def streams(args: tuple[Any, ...]) -> bool:
    """Whether `args`, those grpcio submits a call with, are a call whose responses stream (it holds its thread as
    long as it is open); False for any other call, and for every call where grpcio's server module differs."""
    return _STREAM_RESPONSES is not None and bool(args) and args[0] is _STREAM_RESPONSES


def method(args: tuple[Any, ...]) -> str | None:
    """The method (`/service/method`) of the call grpcio submits with `args`; None where they hold none."""
    event = args[1] if len(args) > 1 else None
    name = getattr(getattr(event, "call_details", None), "method", None)
    if name:  # a call found by a generic handler: the method as the client named it
        return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    tag = getattr(event, "tag", None)  # a registered method's call: grpcio asked for it by the method's name
    return tag if isinstance(tag, str) else None


def defer(args: tuple[Any, ...], hand: Callable[[tuple[Any, ...], Any], None]) -> bool:
    """If `args` are those grpcio submits a unary call with (`_unary_response_in_pool` and its arguments, run
    through the call's context), ask for the call's request now and `hand` on, once it has arrived, the same
    arguments but a request thunk that takes it without waiting; True. False for any other call, or when the call
    is over already: the caller submits it as given. Runs in grpcio's polling thread, as `submit` does; `hand`
    runs there too, given the arguments and the request (deserialized; None when the client sent none), and may
    raise RuntimeError (the pool is shut down): the call is then refused as UNAVAILABLE."""
    if not SUPPORTED or len(args) != 7 or args[0] is not _RESPOND:
        return False
    respond, event, state, behavior, _, deserializer, serializer = args
    call = event.call
    receive = _grpc._receive_message(state, call, deserializer)

    def take() -> Any:
        """The request, as grpcio's own thunk returns it after its wait: None when there is none to answer."""
        with state.condition:
            request, state.request = state.request, None
            if request is None and state.client is _grpc._CLOSED and _grpc._is_rpc_state_active(state):
                method = event.call_details.method
                _grpc._abort(state, call, cygrpc.StatusCode.unimplemented,
                             b'"%s" requires exactly one request message.' % method)
            return request

    def arrived(received: Any) -> Any:
        outcome = receive(received)  # grpcio's: the request (or the client's end) recorded, its token counted off
        try:
            hand((respond, event, state, behavior, take, deserializer, serializer), state.request)
        except RuntimeError:
            with state.condition:
                if _grpc._is_rpc_state_active(state):
                    _grpc._abort(state, call, cygrpc.StatusCode.unavailable, b"the server is stopping")
        return outcome

    with state.condition:
        if not _grpc._is_rpc_state_active(state):
            return False
        try:
            call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), arrived)
        except Exception:  # the call broke: grpcio's own way reports it
            return False
        state.due.add(_grpc._RECEIVE_MESSAGE_TOKEN)
    return True


def _traced() -> bool:
    """Whether grpcio's observability plugin may trace calls: one is registered, or grpcio keeps it elsewhere than
    this module knows (then it is asked, as grpcio asks)."""
    return getattr(_observability, "_OBSERVABILITY_PLUGIN", _NO_PLUGIN) is not None


def answer(args: tuple[Any, ...]) -> None:
    """Answer a call `defer` handed on, given the arguments it handed on with a behaviour (`args[3]`) that uses no
    context (it is given None) and fails only by a fault of its own: the reply is what it returns. What grpcio's
    `_unary_response_in_pool` does, less what only other behaviours need: a servicer context made and finalized
    for each call. Runs where that would (the call's context entered)."""
    _, event, state, behavior, take, _, serializer = args
    if _traced():
        cygrpc.install_context_from_request_call_event(event)
    try:
        request = take()
        if request is not None:
            reply = behavior(request, None)
            _grpc._status(event, state, serializer(reply) if serializer is not None else reply)
    except Exception:  # a fault of the behaviour's: the call fails as grpcio fails it, and the thread goes on
        log.exception("answering a gRPC call failed")
        with state.condition:
            if _grpc._is_rpc_state_active(state):
                _grpc._abort(state, event.call, cygrpc.StatusCode.unknown, b"Exception calling application")
    finally:
        cygrpc.uninstall_context()
