"""The spec's own OpenAPI document, as data: the REST app serves it at /openapi.json (and /docs), so the
published description is the one the server was generated from, bodies and x-oip ties included. It ships as
package data (`openapi.json` beside this module), read once at import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

DOCUMENT: Final[dict[str, Any]] = json.loads(
    Path(__file__).with_name("openapi.json").read_text(encoding="utf-8")
)["document"]
