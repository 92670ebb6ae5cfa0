"""Server settings, with safe defaults. Every field can be set from `python -m <package> serve` flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import GENERATOR_VERSION


@dataclass
class Settings:
    host: str = "127.0.0.1"
    http_port: int = 8000  # 0 picks a free port; None serves no REST
    grpc_port: int | None = 8001  # 0 picks a free port; None serves no gRPC
    model_repository: Path | None = None
    server_name: str = "oip"
    server_version: str = GENERATOR_VERSION
    # The REST status of a health answer that says "not ready", and of a NOT_READY error: 503, or 400 as Triton
    # and MLServer answer.
    not_ready_status: int = 503
    max_request_bytes: int = 256 * 1024 * 1024  # REST bodies and gRPC messages, each way
    max_tensor_elements: int = 256 * 1024 * 1024  # per tensor, checked before anything is allocated
    log_level: str = "info"
    access_log: bool = False
    graceful_shutdown_seconds: float = 30.0
    # Share the ports with other processes (SO_REUSEPORT): set for each worker of `serve --workers N`.
    reuse_port: bool = False
    # REST connections: the request line and headers must arrive within this many seconds (408 and closed
    # otherwise); an idle keep-alive connection closes after `http_keep_alive_seconds`.
    http_header_timeout: float = 10.0
    http_keep_alive_seconds: int = 5
    extensions: list[str] = field(default_factory=list)  # filled by the data plane with what is enabled
