"""What tracing costs per request, in process: the CPU a simple inference takes with metrics and tracing off,
metrics on, and every request traced (OTLP/HTTP to bench/otlp_sink.py), on each transport's request path.

The REST row drives the ASGI app directly (no sockets, no uvicorn); the gRPC rows call what answers unary ModelInfer
(no grpcio): `grpc` the handler of the gRPC thread with the common request (raw inputs: the lean way),
`grpc_general` the same handler with typed contents (the general way in the thread), `grpc_loop` the servicer's
coroutine on the event loop (the way of every call the thread does not answer). Each measurement runs in a fresh
process pinned to CPU 0 (the sink on CPU 1) and counts the CPU of every thread of it (the request's and the
exporting one, up to the export of the last span) and of the request's thread alone. It also counts the Python
calls a request makes on its thread: all of them, and those into the server's tracing module or OpenTelemetry
(with tracing off: none, and OpenTelemetry's SDK is not even imported). A generated package (default: this
checkout's `generated/`) can be compared with another (`--other DIR`, for instance `git archive <commit> generated
| tar -x -C DIR`). Noise on a shared machine is lower than `make bench`'s (no load generator, CPU time rather than
throughput), but compare only figures of the same run.

    python bench/trace_cost.py [--requests 20000] [--repeats 3] [--other DIR] [--transports rest,grpc,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import asgi  # noqa: E402

VARIANTS = ("bare", "metrics", "traced")
TRANSPORTS = ("rest", "grpc", "grpc_general", "grpc_loop")
# The server's modules of tracing
TRACING = tuple(".server.observe." + name for name in ("tracing", "tracing_setup", "otlp", "otlp_http"))


def _measure(transport: str, variant: str, requests: int) -> dict[str, float]:
    """In this process (started by `run`): CPU per request of `transport` under `variant`."""
    import numpy as np
    from oip.grpc import grpc_service_pb2 as pb
    from oip.server import Assembly, ModelRepository, Settings
    from oip.server.grpc.in_thread import NOT_HERE, in_thread

    sys.path.insert(0, str(ROOT / "examples" / "models" / "simple"))
    from model import Simple  # type: ignore[import-not-found]

    async def main() -> dict[str, float]:
        repository = ModelRepository()
        repository.add(Simple("simple"))
        await repository.load_all()
        settings = Settings(metrics=variant != "bare")
        server = Assembly.build(repository, settings)
        dataplane = server.dataplane
        assert server.tracing == (variant == "traced")
        if transport == "rest":
            app = server.rest_app()
            values = list(range(16))
            body = json.dumps({"inputs": [
                {"name": name, "shape": [1, 16], "datatype": "INT32", "data": values} for name in ("INPUT0", "INPUT1")
            ]}).encode()
            headers = [(b"host", b"bench"), (b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]

            async def one() -> None:
                sent = await asgi.call(app, "POST", "/v2/models/simple/infer", body, headers)
                assert sent[0]["status"] == 200, sent
        else:
            servicer = server.servicer()
            handler = in_thread(dataplane.pipeline, settings, servicer.infer, "ModelInfer", None, server.tracing)
            message = pb.ModelInferRequest(model_name="simple")
            for name in ("INPUT0", "INPUT1"):
                tensor = message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                if transport == "grpc_general":  # typed contents: not the lean way's request
                    tensor.contents.int_contents.extend(range(16))
                else:
                    message.raw_input_contents.append(np.arange(16, dtype="<i4").tobytes())

            class Context:
                def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
                    return (("user-agent", "bench"),)

                def abort(self, code: Any, details: str) -> None:
                    raise RuntimeError(details)

                def code(self) -> None:
                    return None

            context = Context()

            if transport == "grpc_loop":
                async def one() -> None:
                    assert await servicer.ModelInfer(message, context)  # type: ignore[arg-type]
            else:
                async def one() -> None:
                    assert handler(message, context) is not NOT_HERE

        for _ in range(2000):
            await one()
        if dataplane.tracing is not None:
            dataplane.tracing.flush()
        start, start_thread = time.process_time(), time.thread_time()
        for _ in range(requests):
            await one()
        thread, cpu = time.thread_time() - start_thread, time.process_time() - start
        # What tracing does on a request's thread, by count: its calls, and whether OpenTelemetry's SDK is loaded.
        calls = {"all": 0, "tracing": 0}

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls["all"] += 1
                module = frame.f_globals.get("__name__", "")
                if module.endswith(TRACING) or module.startswith("opentelemetry"):
                    calls["tracing"] += 1

        counted = 200
        sys.setprofile(profile)
        for _ in range(counted):
            await one()
        sys.setprofile(None)
        dropped = 0
        if dataplane.tracing is not None:  # what is still queued is exported, and counted
            dropped = dataplane.tracing.dropped
            dataplane.tracing.shutdown()
        return {"cpu_us": cpu / requests * 1e6, "thread_us": thread / requests * 1e6,
                "dropped": dropped, "calls": calls["all"] / counted, "tracing_calls": calls["tracing"] / counted,
                "sdk": "opentelemetry.sdk" in sys.modules}

    return asyncio.run(main())


def run(package: Path, transport: str, variant: str, requests: int, endpoint: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(package)}
    for key in [key for key in env if key.startswith("OTEL_")]:
        del env[key]
    if variant == "traced":
        # A queue that holds every request: a loop that never waits leaves the export thread little time, and
        # what it has not exported when the loop ends is exported then, within the measurement.
        env.update(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                   OTEL_TRACES_SAMPLER="always_on", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
                   OTEL_BSP_MAX_QUEUE_SIZE=str(10 * (requests + 2000)))
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, __file__, "--child", transport, variant, str(requests)],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--other", type=Path, help="another generated package to measure beside this checkout's")
    p.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated, of " + ", ".join(TRANSPORTS))
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        transport, variant, requests = args.child
        print(json.dumps(_measure(transport, variant, int(requests))))
        return 0
    sys.path.insert(0, str(BENCH))
    import run as bench_run

    packages = [ROOT / "generated", *([args.other.resolve()] if args.other else [])]
    sink = bench_run.start_sink(print)
    endpoint = os.environ[bench_run.servers.OTLP_ENV]
    try:
        for repeat in range(args.repeats):
            for transport in args.transports.split(","):
                for package in packages:
                    figures = {v: run(package, transport, v, args.requests, endpoint) for v in args.variants.split(",")}
                    cells = " | ".join(
                        f"{v} {f['cpu_us']:.1f} us (request's thread {f['thread_us']:.1f}; "
                        f"{f['calls']:.0f} calls, {f['tracing_calls']:.0f} of tracing; "
                        f"SDK {'loaded' if f['sdk'] else 'not loaded'})" for v, f in figures.items()
                    )
                    added = note = ""
                    if "traced" in figures and "metrics" in figures:
                        added = f" | tracing adds {figures['traced']['cpu_us'] - figures['metrics']['cpu_us']:.1f} us"
                        note = f"; {figures['traced']['dropped']} dropped" if figures["traced"]["dropped"] else ""
                    print(f"[{repeat + 1}] {transport} {package}: {cells}{added}{note}", flush=True)
    finally:
        print("OTLP sink received:", bench_run.stop_sink(sink))
    return 0


if __name__ == "__main__":
    sys.exit(main())
