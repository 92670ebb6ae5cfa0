"""The floors of Python gRPC servers: what grpcio itself costs per ModelInfer call, before any work of ours.

Each variant is a bare grpcio server on CPU 0 answering `/inference.GRPCInferenceService/ModelInfer` with the
same pre-serialized `simple` response (a generic handler: no protobuf parsing, no data plane, no model). The load
is bench/loadgen.py's `simple_grpc` workload on CPU 1, exactly as `make bench` drives the real servers, and the
server's CPU per call comes from /proc. Every variant runs under grpcio's settings as our server makes them
(`servers.tuned_grpc_io`: the polling thread does the socket work). Variants:

- `aio`: `grpc.aio.server()` on asyncio's default loop;
- `aio_uvloop`: the same on uvloop;
- `sync_N`: the synchronous `grpc.server()` with a pool of N threads.

Our own server (`python -m oip serve`) is measured in the same run, over the same load, so the report shows the
floor of the transport it uses beside what it spends.

With `--answer FILE` (bench/run.py's floor of a scenario), the variant `replay`: the synchronous server with our
server's thread pool (`oip.server.grpc.pool.WarmPool` of `Settings.grpc_threads` threads, which hands a unary call to a
thread once its request is in, or answers it in the polling thread where our server does: a call to an inline
model, `servers.answered_in_polling_thread`) answering the method of an answer recorded from a real
server (`bench/loadgen.py --record`) with it, unary or, for ModelStreamInfer, the recorded responses to each request
of the stream; the harness drives it with the scenario's own load, so our server's CPU per request over this one's
is what our server adds to grpcio.

With `--memory`, the floor of the memory a large tensor costs instead: the synchronous server with 8 threads
answers `identity_fp32` requests of `--elements` FP32 elements (bench/loadgen.py's `identity_grpc_raw` workload,
c=1) with the identity's reply serialized once up front (the handler allocates nothing per call), under the glibc
malloc settings our server gives itself (`oip.server.process.allocator.tune_allocator`: one arena, buffers up to
32 MiB on the heap); then our server on the same load. Each from a fresh start: its RSS at rest, and its peak (VmHWM
during the warm-up and window) and growth over that. Outputs grpc_memory.{md,json}.

    python bench/grpc_floor.py [--duration 8] [--concurrency 8] [--out bench/results]
    python bench/grpc_floor.py --memory [--elements 1000000] [--duration 5] [--out bench/results]
    python bench/grpc_floor.py --serve replay --answer ANSWER.json --port N     # serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers
from servers import BENCH, ROOT, SERVER_CPU

VARIANTS = ("aio", "aio_uvloop", "sync_4", "sync_8")
REPLAY = "replay"
METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _response() -> bytes:
    sys.path.insert(0, str(ROOT / "generated"))
    import numpy as np
    from oip.grpc import grpc_service_pb2 as pb

    a, b = np.arange(16, dtype="<i4"), np.ones(16, dtype="<i4")
    reply = pb.ModelInferResponse(model_name="simple", model_version="1")
    for name, values in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        reply.outputs.add(name=name, datatype="INT32", shape=[1, 16])
        reply.raw_output_contents.append(values.tobytes())
    return reply.SerializeToString()


def _identity_response(elements: int) -> bytes:
    """The reply of `identity_fp32` to loadgen's identity request of `elements` elements."""
    sys.path.insert(0, str(ROOT / "generated"))
    from loadgen import _identity_data
    from oip.grpc import grpc_service_pb2 as pb

    reply = pb.ModelInferResponse(model_name="identity_fp32", model_version="1")
    reply.outputs.add(name="OUTPUT0", datatype="FP32", shape=[elements])
    reply.raw_output_contents.append(_identity_data(elements).tobytes())
    return reply.SerializeToString()


def serve_replay(answer_file: Path, port: int) -> None:
    """Serve a recorded answer (see the module's description) until killed."""
    import base64

    import grpc
    from oip.server import Settings
    from oip.server.grpc.pool import WarmPool

    answer = json.loads(answer_file.read_text())
    replies = [base64.b64decode(chunk) for chunk in answer["chunks"]]
    service, method = answer["path"].strip("/").split("/")
    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    if answer.get("stream"):
        def stream(requests: Any, context: Any) -> Any:
            for _ in requests:
                yield from replies

        handler = grpc.stream_stream_rpc_method_handler(stream)
    else:
        reply = replies[0]
        handler = grpc.unary_unary_rpc_method_handler(lambda request, context: reply)
    # Where our server answers the model's unary calls, the floor answers them too: in the polling thread for an
    # inline model (`servers.answered_in_polling_thread`), else in a pool thread.
    here = not answer.get("stream") and servers.answered_in_polling_thread(servers.WORKLOAD_MODEL[answer["workload"]])

    def answers_here(behavior: Any, request: Any, metadata: Any, respond: Callable[..., None]) -> bool:
        if here:
            respond(behavior, plain=True)  # as our server sends such an answer: no servicer context made for it
        return here

    pool = WarmPool(Settings().grpc_threads, "floor", answers_here=answers_here)
    server = grpc.server(pool, options=options)  # type: ignore[arg-type]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def serve(variant: str, port: int, elements: int = 0) -> None:
    """Serve the fixed answer until killed (the server side of one variant; the identity's with `elements`)."""
    import grpc

    answer = _identity_response(elements) if elements else _response()
    if elements:  # give the heap that building the answer used back to the system: the RSS at rest is what is live
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]

    def handler() -> grpc.RpcMethodHandler[bytes, bytes]:
        if variant.startswith("sync"):
            return grpc.unary_unary_rpc_method_handler(lambda request, context: answer)

        async def infer(request: bytes, context: Any) -> bytes:
            return answer

        return grpc.unary_unary_rpc_method_handler(infer)

    generic = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler()}
    )
    if variant.startswith("sync"):
        threads = int(variant.split("_")[1])
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=options)
        server.add_generic_rpc_handlers((generic,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((generic,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    if variant == "aio_uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def _start_floor(variant: str, workdir: Path, elements: int = 0) -> servers.Running:
    port = servers.free_port()
    log = workdir / f"floor_{variant}.log"
    argv = ["taskset", "-c", SERVER_CPU, sys.executable, __file__, "--serve", variant, "--port", str(port)]
    env = {**os.environ, **servers.tuned_grpc_io(), **(servers.tuned_malloc() if elements else {})}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*argv, "--elements", str(elements)] if elements else argv,
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
        )
    deadline = time.monotonic() + 30
    while b"ready" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"floor server {variant} did not start; see {log}")
        time.sleep(0.05)
    # REST is not served: the simple_grpc workload never uses it.
    return servers.Running(f"floor_{variant}", process, servers.free_port(), port, log)


def measure(running: servers.Running, args: argparse.Namespace) -> dict[str, Any]:
    result = servers.run_loadgen(
        running, "simple_grpc", concurrency=args.concurrency, duration=args.duration, warmup=args.warmup,
        elements=16, request_timeout=30,
    )
    return {"server": running.name, **result}


def memory(args: argparse.Namespace, workdir: Path) -> int:
    """The memory floor of a large tensor over grpcio, beside our server's (see the module's description)."""
    import grpc

    rows = []
    for name in ("grpcio sync_8, reply serialized up front", "oipgen (python -m oip serve)"):
        if name.startswith("grpcio"):
            running = _start_floor("sync_8", workdir, args.elements)
            time.sleep(servers.IDLE_SETTLE_S)
            rest = servers.rss_kib(running.pid) / 1024
        else:
            running = servers.start("oipgen", BENCH / ".cache", workdir)
            rest = running.idle_rss_mib
        try:
            result = servers.run_loadgen(
                running, "identity_grpc_raw", concurrency=1, duration=args.duration, warmup=args.warmup,
                elements=args.elements, request_timeout=60,
            )
        finally:
            servers.stop(running)
        rows.append({"server": name, "rest_rss_mib": rest, **result})
    meta = {"grpcio": grpc.__version__, "python": platform.python_version(), "load_average": os.getloadavg(),
            "elements": args.elements, "duration_s": args.duration}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpc_memory.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    payload = args.elements * 4 / 2**20
    lines = [
        f"# gRPC memory floor: identity of {args.elements:,} FP32 ({payload:.1f} MiB) over gRPC raw, c=1",
        "",
        f"grpcio {meta['grpcio']}, Python {meta['python']}, load average at the end "
        f"{', '.join(f'{x:.2f}' for x in meta['load_average'])}.",
        "",
        "| server | infer/s | RSS at rest (MiB) | peak (MiB) | growth (MiB) | growth / payload |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['server']} | error: {row['error']} | | | | |")
            continue
        growth = row["peak_rss_mib"] - row["rest_rss_mib"]
        lines.append(f"| {row['server']} | {row['infer_per_s']:,.1f} | {row['rest_rss_mib']:.1f} | "
                     f"{row['peak_rss_mib']:.1f} | {growth:.1f} | {growth / payload:.1f}x |")
    (args.out / "grpc_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=(*VARIANTS, REPLAY), help=argparse.SUPPRESS)
    parser.add_argument("--answer", type=Path, help="with --serve replay: the recorded answer to serve")
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--memory", action="store_true", help="the memory floor of a large tensor instead")
    parser.add_argument("--elements", type=int, help="FP32 elements of --memory's tensor (default 1,000,000)")
    args = parser.parse_args()
    if args.serve == REPLAY:
        sys.path.insert(0, str(ROOT / "generated"))
        serve_replay(args.answer, args.port)
        return 0
    if args.serve:
        serve(args.serve, args.port, args.elements or 0)
        return 0

    import grpc

    workdir = BENCH / ".cache" / "grpc_floor"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.memory:
        args.elements = args.elements or 1_000_000
        return memory(args, workdir)
    rows = []
    for variant in VARIANTS:
        floor = _start_floor(variant, workdir)
        try:
            rows.append({"variant": variant, **measure(floor, args)})
        finally:
            servers.stop(floor)
    with servers.running("oipgen", BENCH / ".cache", workdir) as ours:
        rows.append({"variant": "oipgen (python -m oip serve)", **measure(ours, args)})
    meta = {
        "grpcio": grpc.__version__, "python": platform.python_version(), "load_average": os.getloadavg(),
        "concurrency": args.concurrency, "duration_s": args.duration,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpc_floor.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        f"# gRPC floors: simple ModelInfer, c={args.concurrency}, server on CPU {SERVER_CPU}",
        "",
        f"grpcio {meta['grpcio']}, Python {meta['python']}, load average at the end "
        f"{', '.join(f'{x:.2f}' for x in meta['load_average'])}.",
        "",
        "| server | infer/s | server CPU per call (us) | p50 (ms) |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['variant']} | error: {row['error']} | | |")
            continue
        lines.append(
            f"| {row['variant']} | {row['infer_per_s']:,.0f} | {row.get('server_cpu_us_per_infer', 0):.0f} | "
            f"{row['p50_ms']:.2f} |"
        )
    (args.out / "grpc_floor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
