"""grpc"""

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

__all__ = ["INFER", "RPCS", "SERVICE", "Servicer", "create_grpc_server", "decode_infer_request",
           "encode_infer_response", "method_handlers"]
