"""What each workload costs our server per request, in process: no sockets and no HTTP/2 framing (REST requests are
parsed as the server parses them), so that a change to the inference path shows in microseconds rather than in the
noise of a loaded machine.

A workload of bench/loadgen.py (its very request: body and headers, or gRPC message) goes to what answers it in
the server, built as `serve` builds it over bench/servers/oipgen_repo (`Assembly`): a REST request as its bytes
through the server's HTTP layer (bench/http_in_process.py: httptools' parser, then the direct or the ASGI way, as
the server takes it), a unary gRPC request as grpcio's polling thread and the pool's threads take it: answered
where it arrives when the server does so (`InThread.answers_here`: an inline model's, at once or once its
dynamic batch has run), else through the gRPC thread's handler (`in_thread`; where that hands the call to the
event loop, the servicer's coroutine, as the server does), a stream through the servicer's stream method. Every
answer is checked as the load generator checks it. Per workload: CPU per request (the whole process), Python calls
per request (counted by a profile hook), and with `--profile` cProfile's functions with the most own time.
Requests run one at a time, except the dynamically batched model's: `--batch N` at once (default 8), so that
batches form. Run pinned to one CPU for steady figures: `taskset -c 0 python bench/cost.py ...`.

On a shared host even that moves by half between runs. `--instructions` counts instead the machine instructions a
request takes, which no neighbour changes: each workload runs twice under valgrind's cachegrind (`apt-get install
valgrind`), with `--requests` and with three times as many, and the difference is divided by the difference in
requests, so start-up and loading cancel out. Repeated, a count moves by 1-2% (the interpreter's allocator, threads
that wake at their own times; the dynamically batched workload more, its batches forming as threads run), against
the tens of percent of the CPU time; fewer instructions is not always less time (caches), so a change still goes
through `bench/ab.py` too. `--package DIR` measures the generated package in DIR (another build's `generated/`)
instead of this checkout's.

    python bench/cost.py [--workloads simple_rest,text_grpc,...] [--requests 5000] [--profile] [--top 25]
    python bench/cost.py --instructions [--workloads ...] [--requests 1000] [--package /tmp/base/generated]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# bench/profile.py is not the standard library's `profile`, which cProfile imports: this folder comes after it.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
import cProfile  # noqa: E402
import pstats  # noqa: E402

sys.path.insert(0, str(BENCH))

import http_in_process  # noqa: E402
import loadgen  # noqa: E402

MODELS = BENCH / "servers" / "oipgen_repo"
SMALL = tuple(w for w in loadgen.WORKLOADS if not w.startswith("identity"))


class _Context:
    """What the gRPC handlers see of a call."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "bench"),)

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")

    def code(self) -> None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def time_remaining(self) -> None:
        return None

    def add_callback(self, callback: Any) -> bool:
        return True


def _rest(app: Any, settings: Any, name: str) -> Callable[[], Awaitable[None]]:
    request = loadgen.rest_request(name, 1000)
    lines = [f"POST {request.path} HTTP/1.1", "host: bench", *(f"{k}: {v}" for k, v in request.headers.items()),
             f"content-length: {len(request.body)}"]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body
    idle: list[http_in_process.Connection] = []  # keep-alive connections, one per request at once

    class Headers(dict[str, str]):
        def get(self, key: str, default: Any = None) -> Any:
            return super().get(key.lower(), default)

    async def one(check: bool = False) -> None:
        connection = idle.pop() if idle else http_in_process.Connection(app, settings)
        try:
            answer = await connection.request(raw)
        finally:
            idle.append(connection)
        if not answer.startswith(b"HTTP/1.1 200 ") or check:
            status, headers, body = http_in_process.parse(answer)
            if status != 200:
                raise RuntimeError(f"{name}: HTTP {status}: {body[:200]!r}")

            class Response:
                pass

            Response.headers = Headers(headers)  # type: ignore[attr-defined]
            request.check(body, Response)

    return one


def _grpc(handler: Any, servicer: Any, name: str) -> Callable[[], Awaitable[None]]:
    from oip.grpc import grpc_service_pb2 as pb
    from oip.server.grpc.in_thread import NOT_HERE

    message, expected, _ = loadgen.grpc_request(name, 1000)
    context = _Context()
    parse = servicer.infer.parser(pb.ModelInferRequest)
    wire = message.SerializeToString()
    if name == "decoupled_grpc":
        async def stream(check: bool = False) -> None:
            async def requests() -> Any:
                yield parse(wire)

            replies = [reply if isinstance(reply, bytes) else reply.SerializeToString()
                       async for reply in servicer.ModelStreamInfer(requests(), context)]
            if check:
                loadgen._stream_check(replies, pb)

        return stream

    threaded = name.startswith("batched")  # a model batched by the threads waiting for it: called from threads here
    pool = concurrent.futures.ThreadPoolExecutor(16) if threaded else None
    loop_thread = threading.get_ident()

    async def one(check: bool = False) -> None:
        request = parse(wire)  # as grpcio hands it over: parsed by the handler's deserializer
        # First as grpcio's polling thread does (`WarmPool._arrived`): answered where it arrived, at once or, under
        # dynamic batching, once its batch has run (by the arrival that fills it here, or the batcher's timer).
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def respond(behavior: Any = None, plain: bool = False) -> None:
            reply = (handler if behavior is None else behavior)(request, None if plain else context)
            if threading.get_ident() == loop_thread:
                answered.set_result(reply)
            else:
                answered.get_loop().call_soon_threadsafe(answered.set_result, reply)

        if handler.answers_here(request, [], respond):
            reply = await answered
        elif pool is not None:
            reply = await asyncio.get_running_loop().run_in_executor(pool, handler, request, context)
        else:
            reply = handler(request, context)
        if reply is NOT_HERE:
            reply = await servicer.ModelInfer(request, context)
        if check:
            raw = reply if isinstance(reply, bytes) else reply.SerializeToString()
            if list(pb.ModelInferResponse.FromString(raw).raw_output_contents) != expected:
                raise RuntimeError(f"{name}: wrong answer")

    return one


def _at_once(workload: str, batch: int) -> int:
    """How many requests of `workload` run at once (see the module's description)."""
    return batch if workload.startswith("batched") else 1


def _rounds(requests: int, at_once: int) -> tuple[int, int]:
    """The warm-up's rounds and the measured rounds of `requests` requests, `at_once` a round."""
    rounds = max(1, requests // at_once)
    return min(rounds, 500), rounds


def measure(workloads: list[str], requests: int, batch: int, profile: bool, top: int) -> None:
    from oip.server import Assembly, ModelRepository, Settings
    from oip.server.grpc.in_thread import in_thread

    async def main() -> None:
        settings = Settings()
        repository = ModelRepository(MODELS)
        await repository.load_all()
        assembly = Assembly.build(repository, settings)
        app = assembly.rest_app()
        servicer = assembly.servicer()
        handler = in_thread(assembly.dataplane.pipeline, settings, servicer.infer, "ModelInfer", None, False)
        for name in workloads:
            one = _grpc(handler, servicer, name) if "grpc" in name else _rest(app, settings, name)
            at_once = _at_once(name, batch)

            async def step(one: Any = one, at_once: int = at_once) -> None:
                if at_once == 1:
                    await one()
                else:
                    await asyncio.gather(*(one() for _ in range(at_once)))

            await one(check=True)
            warm, rounds = _rounds(requests, at_once)
            for _ in range(warm):
                await step()
            calls = [0]

            def count(frame: Any, event: str, arg: Any, calls: list[int] = calls) -> None:
                if event == "call":
                    calls[0] += 1

            sys.setprofile(count)
            for _ in range(20):
                await step()
            sys.setprofile(None)
            start = time.process_time()
            for _ in range(rounds):
                await step()
            cpu = (time.process_time() - start) / (rounds * at_once) * 1e6
            print(f"{name:24s} {cpu:8.1f} us/request  {calls[0] / (20 * at_once):6.0f} calls/request", flush=True)
            if profile:
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(rounds):
                    await step()
                profiler.disable()
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
                print(out.getvalue())
        await repository.unload_all()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(SMALL), help="comma-separated workloads of bench/loadgen.py")
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--batch", type=int, default=8, help="requests at once to the dynamically batched model")
    p.add_argument("--profile", action="store_true", help="cProfile's functions with the most own time")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--instructions", action="store_true",
                   help="machine instructions per request, counted by valgrind (see above)")
    p.add_argument("--package", type=Path, help="the generated package's folder to measure (default: generated/)")
    args = p.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    for name in workloads:
        if name not in loadgen.WORKLOADS:
            p.error(f"unknown workload {name!r}")
    if args.package is not None and not (args.package / "oip" / "__init__.py").is_file():
        p.error(f"{args.package} holds no generated package (oip/)")
    if args.instructions or args.package is not None:
        if args.instructions and shutil.which("valgrind") is None:
            p.error("--instructions needs valgrind (apt-get install valgrind)")
        return _in_child(workloads, args)
    measure(workloads, args.requests, args.batch, args.profile, args.top)
    return 0


def _in_child(workloads: list[str], args: argparse.Namespace) -> int:
    """Measure in child processes: over `args.package` (by its path), and with `args.instructions` under valgrind,
    each workload at `args.requests` and three times as many (see the module's description)."""
    # Steadier counts: one hash seed; no OpenBLAS threads (they spin for a while at numpy's import, a varying number
    # of instructions; no workload here calls BLAS); no bytecode written by the counted runs, and before them one
    # run that writes it (where it can), so that both compile, or read, the same modules: otherwise the first run
    # of a fresh checkout compiles them for the second, as may any other process importing them meanwhile.
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    if args.package is not None:
        env["PYTHONPATH"] = str(args.package.resolve())
    compiling = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for name in workloads:
        own = [sys.executable, str(Path(__file__).resolve()), "--workloads", name, "--batch", str(args.batch)]
        if not args.instructions:
            done = subprocess.run([*own, "--requests", str(args.requests)], env=env, check=False)
            if done.returncode:
                return done.returncode
            continue
        warm = subprocess.run([*own, "--requests", "1"], env=compiling, capture_output=True, text=True, check=False)
        if warm.returncode:
            print(warm.stdout + warm.stderr[-2000:], file=sys.stderr)
            return warm.returncode
        counts = []
        for requests in (args.requests, 3 * args.requests):
            with tempfile.TemporaryDirectory() as scratch:
                # Without address randomization (setarch -R) where it can be turned off: dicts keyed by `id()`
                # and the allocator's arenas then lie out the same in every run.
                steady = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
                grind = [*steady, "valgrind", "--tool=cachegrind", "--cache-sim=no",
                         f"--cachegrind-out-file={Path(scratch) / 'out'}"]
                done = subprocess.run([*grind, *own, "--requests", str(requests)], env=env, capture_output=True,
                                      text=True, check=False)
            found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
            if done.returncode or found is None:
                print(done.stdout + done.stderr[-2000:], file=sys.stderr)
                return done.returncode or 1
            counts.append(int(found.group(1).replace(",", "")))
        at_once = _at_once(name, args.batch)
        served = [at_once * sum(_rounds(requests, at_once)) for requests in (args.requests, 3 * args.requests)]
        per_request = (counts[1] - counts[0]) / (served[1] - served[0])
        print(f"{name:24s} {per_request:10,.0f} instructions/request", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
