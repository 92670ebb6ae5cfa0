"""The published OpenAPI document: the spec's own (`document`), without the operations of the extensions that are
off, with each ready model's own inference schemas (`model_openapi`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..core.dataplane_base import DataPlaneBase
from ..core.repository import ModelRepository
from ..errors import OipError
from .document import DOCUMENT
from .endpoints import ENDPOINTS
from .model_openapi import model_document

__all__ = ["DOCUMENT", "openapi_document", "published_document"]

# The requests the OpenAPI document asks the data plane (the ready models, their metadata), when the spec has them.
# Called with their fields as keywords (protobuf's own stubs give `Message.__init__` none).
_REPOSITORY_INDEX_REQUEST: Final[Callable[..., Any] | None] = next(
    (e.request for e in ENDPOINTS if e.operation == "repository_index"), None)
_MODEL_METADATA_REQUEST: Final[Callable[..., Any] | None] = next(
    (e.request for e in ENDPOINTS if e.operation == "model_metadata"), None)


def published_document(extensions: Sequence[str] | None) -> dict[str, Any]:
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



async def openapi_document(dataplane: DataPlaneBase, base: dict[str, Any] = DOCUMENT,
                           repository: ModelRepository | None = None) -> dict[str, Any]:
    """The OpenAPI document of this moment: `base` (the spec's document as this server publishes it,
    `published_document`), with the inference of every ready model version (and of each ready model at the version
    the server picks) from its metadata (`model_openapi.model_document`). The ready models come from `repository`
    (with the model repository extension off too), else from the data plane's repository index; without either
    `base` is published alone."""
    if _MODEL_METADATA_REQUEST is None:
        return base
    if repository is not None:
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
