"""rest"""

from .app import (
    ENDPOINTS,
    REST_ONLY_ENDPOINTS,
    BinaryParts,
    Endpoint,
    OipApp,
    RestOnlyEndpoint,
    create_app,
    decode_infer_request,
    encode_infer_response,
    openapi_document,
)

__all__ = [
    "ENDPOINTS", "REST_ONLY_ENDPOINTS", "BinaryParts", "Endpoint", "OipApp", "RestOnlyEndpoint", "create_app",
    "decode_infer_request", "encode_infer_response", "openapi_document",
]
