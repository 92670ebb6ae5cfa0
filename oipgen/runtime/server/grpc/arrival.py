"""A unary call is handed to a thread of the pool once its request has arrived (`defer`).

grpcio's synchronous server hands a unary call to its pool as soon as the call's headers are in; the pool's thread
then asks for the request message and sleeps until the polling thread, having received it, wakes it up again. So
every unary call costs two wake-ups of a pool thread, and a call whose request is slow to arrive (a large tensor on
a slow link, a client that sends its headers and nothing more) holds a thread all that time: as many such calls as
the pool has threads, and the port serves no one. Here the polling thread asks for the request when the call
starts and hands the call to the pool once it is in: one wake-up per call, and no thread before there is work.

This reaches into grpcio's server module (a call's state, its receive callback and the token that counts it) as
grpcio 1.76 to 1.85 have them. `SUPPORTED` checks that shape at import; where it differs, every call takes grpcio's
own way, unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final

from grpc import _server as _grpc  # private: see the module's description
from grpc._cython import cygrpc  # type: ignore[attr-defined]  # grpcio ships no types for its core

__all__ = ["SUPPORTED", "defer"]

_RESPOND: Final = getattr(_grpc, "_unary_response_in_pool", None)
_RESPOND_PARAMETERS: Final = (
    "rpc_event", "state", "behavior", "argument_thunk", "request_deserializer", "response_serializer",
)


def _supported() -> bool:
    """Whether grpcio's server module has the shape `defer` relies on."""
    names = ("_receive_message", "_is_rpc_state_active", "_abort", "_CLOSED", "_RECEIVE_MESSAGE_TOKEN")
    if _RESPOND is None or not all(hasattr(_grpc, name) for name in names):
        return False
    if not hasattr(cygrpc, "ReceiveMessageOperation"):
        return False
    try:
        respond = tuple(inspect.signature(_RESPOND).parameters)
        receive = tuple(inspect.signature(_grpc._receive_message).parameters)
    except (TypeError, ValueError):
        return False
    return respond == _RESPOND_PARAMETERS and receive == ("state", "call", "request_deserializer")


SUPPORTED: Final = _supported()


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
