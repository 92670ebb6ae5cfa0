"""grpcio's socket work, done by the thread that polls the gRPC server (`tune_grpc_io`).

By default grpcio (1.76 to 1.85) reads and writes its sockets on the threads of its EventEngine, which hand every
event on to the thread that polls the server's completion queue (grpcio's `_serve`), which hands each call to a
thread of the pool: a small unary call costs about 23 context switches at c=1 on one core. With the EventEngine's
listener and endpoints switched off (three of grpcio's experiments, `GRPC_EXPERIMENTS`), the polling thread does
the socket work itself: about 15 switches a call, and 12-15% less server CPU per small unary call at c=1 and at c=8
(`bench/ab.py`, paired turns: `simple` and text over gRPC); streams and 4 MB tensors cost the same.

grpcio reads GRPC_EXPERIMENTS once, when it is imported, so the command line does this before anything imports
grpc, and only:
- when the environment has no GRPC_EXPERIMENTS of its own (an operator's wins; set it, even empty, to keep
  grpcio's defaults);
- on the grpcio versions it was measured on (`MEASURED`): experiments are grpcio's to rename or drop, and a newer
  grpcio keeps its own defaults until it is measured (the server says so in its log as it starts).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Final

__all__ = ["GRPC_EXPERIMENTS", "MEASURED", "grpcio_version", "measured", "tune_grpc_io"]

GRPC_EXPERIMENTS: Final = "-event_engine_listener,-event_engine_for_all_other_endpoints,-event_engine_callback_cq"
MEASURED: Final = ((1, 76), (1, 86))  # grpcio versions from the first up to the second (excluded)


def grpcio_version() -> str | None:
    """The installed grpcio's version; None when it has none to read."""
    try:
        return importlib.metadata.version("grpcio")
    except importlib.metadata.PackageNotFoundError:
        return None


def measured(version: str | None) -> bool:
    """Whether the socket work was measured on grpcio `version` (`MEASURED`, by major and minor version)."""
    try:
        major_minor = tuple(int(part) for part in (version or "").split(".")[:2])
    except ValueError:
        return False
    return MEASURED[0] <= major_minor < MEASURED[1]


def tune_grpc_io() -> bool:
    """Have the gRPC server's polling thread do the socket work (see the module's description); whether it was
    done (not when GRPC_EXPERIMENTS is set, grpc is imported already, or grpcio is a version not measured)."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules or not measured(grpcio_version()):
        return False
    os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    return True
