"""Server settings, with safe defaults. Every field can be set from `python -m <package> serve` flags. Frozen: what the
server works out from them (the extensions it serves, whether tracing is on) lives where it is worked out."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .. import GENERATOR_VERSION

GRPC_THREAD_SCHEDULING: Final = ("batch", "normal")  # `Settings.grpc_thread_scheduling`

# How the gRPC port manages its connections, by Triton's flag for it: the grpc argument each sets, the least value
# it takes (a boolean flag takes true or false), and what it does. Unset, grpc's own default holds (the same as
# Triton's). `Settings.grpc_options` holds those given.
GRPC_CONNECTION: Final = (
    ("grpc-keepalive-time", "grpc.keepalive_time_ms", 1,
     "milliseconds between the keepalive pings the server sends on a connection (grpc: 2 hours)"),
    ("grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", 1,
     "milliseconds the server waits for a keepalive ping's answer before it closes the connection (grpc: 20 s)"),
    ("grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", None,
     "true: keepalive pings go on, and clients' pings are taken, on a connection without calls (grpc: false)"),
    ("grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", 0,
     "pings the server sends while it sends no data; 0: no limit (grpc: 2)"),
    ("grpc-http2-min-recv-ping-interval-without-data", "grpc.http2.min_ping_interval_without_data_ms", 0,
     "milliseconds a client's pings must be apart while no data flows; a closer one is a strike (grpc: 5 minutes)"),
    ("grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", 0,
     "strikes before the server closes the connection (GOAWAY, too_many_pings); 0: no limit (grpc: 2)"),
    ("grpc-max-connection-age", "grpc.max_connection_age_ms", 1,
     "milliseconds after which the server asks a client to reconnect (GOAWAY), so that clients spread over new "
     "replicas (grpc: never)"),
    ("grpc-max-connection-age-grace", "grpc.max_connection_age_grace_ms", 0,
     "milliseconds a connection past its age has for its calls in flight (grpc: for ever)"),
)


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    http_port: int = 8000  # 0 picks a free port; None serves no REST
    grpc_port: int | None = 8001  # 0 picks a free port; None serves no gRPC
    model_repository: Path | None = None
    # Triton's model control (`core.model_control`): "explicit" with `load_model` ("*": every model) is the
    # default: every model loads at start and load and unload requests are served. "none": every model loads at
    # start, load and unload requests are refused. "poll": as "none", and the repository is read again every
    # `repository_poll_secs` seconds: new models load, changed ones reload, removed ones unload. "explicit": the
    # models named in `load_model` load at start, the others on request.
    model_control_mode: str = "explicit"
    load_model: tuple[str, ...] = ("*",)
    repository_poll_secs: float = 15.0
    # Readiness (as Triton's --strict-readiness): the server is ready only when every model asked to load is
    # ready; False: ready whenever it is live. `exit_on_error`: a model that fails to load at start stops the
    # server (exit 1) rather than leaving it serving the others.
    strict_readiness: bool = True
    exit_on_error: bool = False
    server_name: str = "oip"
    server_version: str = GENERATOR_VERSION
    # The REST status of a health answer that says "not ready", and of a NOT_READY error: 503, or 400 as Triton
    # and MLServer answer.
    not_ready_status: int = 503
    max_request_bytes: int = 256 * 1024 * 1024  # REST bodies and gRPC messages, each way
    max_tensor_elements: int = 256 * 1024 * 1024  # per tensor, checked before anything is allocated
    log_level: str = "info"
    access_log: bool = False  # one line per request, over both transports (logger "oip.access")
    metrics: bool = True  # GET /metrics on the REST port (and on metrics_port when set)
    metrics_port: int | None = None  # a separate listener for /metrics; 0 picks a free port
    # Upper bounds, in seconds, of the request duration histogram's buckets (also the first-response histogram's,
    # in milliseconds there).
    metrics_buckets: tuple[float, ...] = (
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
    )
    graceful_shutdown_seconds: float = 30.0
    # After SIGTERM, how long to go on serving while health says not ready, before the drain: the time a load
    # balancer (Kubernetes' endpoints) takes to stop sending new requests, which would otherwise be refused.
    shutdown_delay_seconds: float = 0.0
    # gRPC inference calls served at once, each on a thread of its own; as many streams open at once (a stream holds
    # its thread for its whole life), and as many other calls: each kind has threads of its own, so that none waits
    # behind another (a health check behind calls to a slow model, or behind idle streams).
    grpc_threads: int = 128
    # How the gRPC threads (and the timer of the batches formed where gRPC calls arrive) are scheduled (Linux):
    # "batch" (SCHED_BATCH: a woken thread does not preempt the running one, which in this process mostly holds the
    # interpreter it would wait for) or "normal" (the system's default).
    grpc_thread_scheduling: str = "batch"
    # The gRPC port's connection management (`GRPC_CONNECTION`): (grpc argument, integer value), as the flags give them.
    grpc_options: tuple[tuple[str, int], ...] = ()
    # Share the ports with other processes (SO_REUSEPORT): set for each worker of `serve --workers N`.
    reuse_port: bool = False
    # REST connections: the request line and headers must arrive within this many seconds (408 and closed
    # otherwise); a request body may pause at most `http_body_timeout` seconds between two pieces (408 and closed
    # otherwise); an idle keep-alive connection closes after `http_keep_alive_seconds`.
    http_header_timeout: float = 10.0
    # The request line and headers of a REST request, and the metadata of a gRPC call, at most this many bytes
    # (REST: 431 and closed; gRPC: the call refused with RESOURCE_EXHAUSTED).
    http_max_header_bytes: int = 64 * 1024
    http_body_timeout: float = 30.0
    http_keep_alive_seconds: int = 5
    # System shared memory: "system" (as Triton) or "off"; keys must start with the prefix when one is set; caps
    # on the regions held and the bytes mapped for them.
    shared_memory: str = "system"
    shared_memory_prefix: str = ""
    shared_memory_max_regions: int = 1024
    shared_memory_max_bytes: int = 16 * 1024**3
    # The extensions to serve, by Triton's names (`extensions.EXTENSIONS`); None: every one this server can. An
    # extension left out is not listed in server metadata, its operations answer 501 / UNIMPLEMENTED, and a
    # request that uses it is refused (see the README). The data plane works out what it serves (`DataPlane.enabled`).
    extensions: list[str] | None = None
    # Worker threads that run the models' plain (non-async) `infer` and hooks: the event loop's default executor
    # while serving. The model configuration extension reports it as the instance count of such models.
    model_threads: int = min(32, (os.cpu_count() or 1) + 4)
