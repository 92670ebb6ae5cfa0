"""The standard gRPC health checking service (`grpc.health.v1.Health`), served on the protocol's port beside its
service: what Kubernetes' gRPC probes, grpc-health-probe, Envoy and cloud load balancers ask.

`Check` answers from the operation the spec marks `x-oip-grpc-health` (`ServerReady`), as Triton's does: SERVING
when the server is ready, NOT_SERVING when it is not (strict readiness with a model that is not). It knows the
whole server (the empty name), the protocol's service and itself by name; any other name is NOT_FOUND, as the
health protocol asks (Triton answers every name alike).

`Watch` is not served: it answers UNIMPLEMENTED, as Triton's does. Each watch would hold a gRPC stream thread for
as long as its client stays connected, and a few hundred clients' channels could take every one from the inference
streams. A client whose channel asks for health checking (the service config's `healthCheckConfig`) then treats
the server as healthy, as the health protocol asks of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import grpc

from ...grpc import health_pb2
from ..errors import clip
from .servicer import Context, Rpc, ServicerBase

__all__ = ["HEALTH_SERVICE", "HealthServicer"]

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
_SERVING: Final = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(ServicerBase):
    """`Check`, answered from the protocol's servicer (`ServicerBase.serving`)."""

    service = HEALTH_SERVICE
    rpcs = (
        Rpc("Check", health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
        Rpc("Watch", health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse, server_streaming=True),
    )

    def __init__(self, protocol: ServicerBase) -> None:
        super().__init__(protocol.dataplane, protocol.settings)
        self.protocol = protocol
        self.known: Final = ("", protocol.service, HEALTH_SERVICE)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Context) -> Any:
        """SERVING while the server is ready, NOT_SERVING otherwise; NOT_FOUND for a service it does not know."""
        if request.service not in self.known:
            names = ", ".join(repr(name) for name in self.known[1:])
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"unknown service {clip(request.service)!r}: this server knows '' (the whole server), "
                                f"{names}")
        ready = await self.call(lambda _: self.protocol.serving(), None, context)
        return health_pb2.HealthCheckResponse(status=_SERVING if ready else _NOT_SERVING)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Context) -> AsyncIterator[Any]:
        """Not served (the module's docstring says why): UNIMPLEMENTED."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "Watch is not served here: a watch would hold a gRPC thread for as long as it stays "
                            "open; ask Check instead")
        yield  # an async generator, as grpc's server-streaming methods are
