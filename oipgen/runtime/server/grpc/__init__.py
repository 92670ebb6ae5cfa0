"""The gRPC transport: grpcio's thread pool server (`server`), the servicer's machinery (`servicer`), the gRPC
form of inference (`infer_codec`), unary inference wholly in the gRPC thread (`in_thread`: the general way, and
the lean way of the common request), and the standard gRPC health service beside the protocol's (`health`).

It decodes requests, calls the data plane (`core`) and encodes its answers; every rule of the protocol lives in
the data plane. It imports `core`, `observe` and the server's vocabulary (`errors`, `types`, `settings`).

Rendered from the spec: `service` (`SERVICE`, the RPC table `RPCS`, the inference messages `INFER`, and the
`Servicer` with one method per RPC, each calling one of `servicer.ServicerBase`'s ways). The package is named as
the transport; the protocol's messages and stubs are the package's own `grpc` (`<package>.grpc`).
"""

from .server import create_server
from .service import (
    INFER,
    RPCS,
    SERVICE,
    Servicer,
    create_grpc_server,
    decode_infer_request,
    encode_infer_response,
    method_handlers,
)

__all__ = ["INFER", "RPCS", "SERVICE", "Servicer", "create_grpc_server", "create_server", "decode_infer_request",
           "encode_infer_response", "method_handlers"]
