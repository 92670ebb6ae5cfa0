"""The REST transport: the FastAPI app (`app`), its handlers (`handlers`), the REST form of inference
(`infer_codec`), request bodies (`body`), the published OpenAPI document (`document`, `openapi`, `model_openapi`)
and the HTTP layer under the app (`http`, uvicorn's httptools protocol with the server's error bodies and timeouts).

It decodes requests, calls the data plane (`core`) and encodes its answers; every rule of the protocol lives in
the data plane. It imports `core`, `observe` and the server's vocabulary (`errors`, `types`, `settings`).

Rendered from the spec: `endpoints` (one `Endpoint` per REST operation and path, `REST_ONLY_ENDPOINTS` for the
operations that only REST has); `document` reads the spec's OpenAPI document, shipped as `openapi.json`.
"""

from .app import OipApp, create_app, metrics_app
from .endpoints import ENDPOINTS, REST_ONLY_ENDPOINTS, Endpoint, RestOnlyEndpoint
from .infer_codec import BinaryParts, decode_infer_request, encode_infer_response
from .openapi import openapi_document, published_document

__all__ = [
    "ENDPOINTS", "REST_ONLY_ENDPOINTS", "BinaryParts", "Endpoint", "OipApp", "RestOnlyEndpoint", "create_app",
    "decode_infer_request", "encode_infer_response", "metrics_app", "openapi_document", "published_document",
]
