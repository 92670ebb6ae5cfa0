"""The benchmark's own load generator: a closed loop at a fixed concurrency against any OIP server.

`concurrency` asyncio workers each send the next request as soon as the previous one is answered. The first
`warmup` seconds are not counted; then the requests that *complete* within the next `duration` seconds are
(infer/s = count / window, p50/p99 over them). Every request body is built once; every response body is read in
full and its status checked; the first response is decoded and its values checked, and every later one must
have the same size. REST goes through aiohttp (one keep-alive connection per worker, `Accept-Encoding:
identity`: servers that gzip would otherwise pay for it), gRPC through grpc.aio with tritonclient's stubs and
tensors in `raw_input_contents`, as perf_analyzer sends them.

Given the server's pid, it also measures what the server spent over the window: user+system CPU of its whole
process tree (/proc/<pid>/stat), and its peak resident memory (VmHWM, reset through /proc/<pid>/clear_refs at the
start of the warm-up; sampled VmRSS where that is refused).

    python bench/loadgen.py --rest 127.0.0.1:8000 --grpc 127.0.0.1:8001 --workload simple_rest -c 8 \
        [-d 10] [-w 2] [--elements 1000000] [--server-pid PID]     # prints one JSON object

Bounded: each phase by its time, each request by --timeout, the whole run by --max-requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

WORKLOADS = ("simple_rest", "simple_grpc", "identity_rest_json", "identity_rest_binary", "identity_grpc_raw")
SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)
GRPC_LIMIT = 1 << 30  # message size limit of the client channel, each way


class LoadError(Exception):
    """The server answered wrongly (status, body or values): the workload is not supported there."""


# --- the server's process tree: CPU and memory ------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (servers may fork workers or stubs)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, ()))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process tree of `pid` (the living processes)."""
    ticks = 0
    for p in _tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, key: str) -> int:
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def reset_peak(pid: int) -> bool:
    """Reset the peak RSS (VmHWM) of the tree to its current RSS; False where the kernel refuses."""
    ok = True
    for p in _tree(pid):
        try:
            Path(f"/proc/{p}/clear_refs").write_text("5")
        except OSError:
            ok = False
    return ok


def cpu0_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of CPU 0, where the servers run."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu0 "):
            values = [int(v) for v in line.split()[1:]]
            idle = values[3] + values[4]
            return sum(values) - idle, sum(values)
    return 0, 0


class _Sampler(threading.Thread):
    """VmRSS of the tree every `interval` seconds: the peak where VmHWM cannot be reset."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.peak = max(self.peak, rss_kib(self.pid))


# --- workloads ------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    """One kind of request: how to send it once (returns the response size) and how to check the first answer."""

    name: str
    payload_bytes: int  # tensor bytes each way
    send: Callable[[Any], Awaitable[int]] = field(repr=False)  # (worker state) -> response size
    open: Callable[[], Awaitable[Any]] = field(repr=False)  # one worker's state (session / stub)
    close: Callable[[Any], Awaitable[None]] = field(repr=False)
    first: Callable[[Any], Awaitable[int]] = field(repr=False)  # send once, check every value; response size


def _identity_data(elements: int) -> np.ndarray:
    return np.random.default_rng(0).random(elements, dtype=np.float32)


def rest_workload(name: str, address: str, elements: int, timeout: float) -> Workload:
    import aiohttp

    headers = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
    if name == "simple_rest":
        url = f"http://{address}/v2/models/simple/infer"
        body = orjson.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": SIMPLE_A.ravel().tolist()},
                    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": SIMPLE_B.ravel().tolist()},
                ]
            }
        )
        payload = 2 * SIMPLE_A.nbytes

        def check(raw: bytes, response: Any) -> None:
            outputs = {o["name"]: o for o in orjson.loads(raw)["outputs"]}
            got0 = np.asarray(outputs["OUTPUT0"]["data"]).reshape(-1)
            got1 = np.asarray(outputs["OUTPUT1"]["data"]).reshape(-1)
            if not (
                np.array_equal(got0, (SIMPLE_A + SIMPLE_B).ravel())
                and np.array_equal(got1, (SIMPLE_A - SIMPLE_B).ravel())
            ):
                raise LoadError(f"wrong simple outputs: {raw[:300]!r}")
    else:
        url = f"http://{address}/v2/models/identity_fp32/infer"
        data = _identity_data(elements)
        payload = data.nbytes
        if name == "identity_rest_json":
            # As a Python client writes it (tritonclient: tolist): every float32 printed as a double.
            body = orjson.dumps(
                {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [elements], "data": data.tolist()}]}
            )

            def check(raw: bytes, response: Any) -> None:
                out = orjson.loads(raw)["outputs"][0]
                got = np.asarray(out["data"], dtype=np.float32).reshape(-1)
                if list(out["shape"]) not in ([elements], [elements, 1]) or not np.array_equal(got, data):
                    raise LoadError(f"wrong identity output (shape {out.get('shape')})")
        else:
            header = orjson.dumps(
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "FP32",
                            "shape": [elements],
                            "parameters": {"binary_data_size": data.nbytes},
                        }
                    ],
                    "parameters": {"binary_data_output": True},
                }
            )
            body = header + data.tobytes()
            headers = {
                **headers,
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(header)),
            }

            def check(raw: bytes, response: Any) -> None:
                length = response.headers.get("Inference-Header-Content-Length")
                if length is None:
                    raise LoadError(f"no binary output (no Inference-Header-Content-Length): {raw[:300]!r}")
                head = orjson.loads(raw[: int(length)])
                got = np.frombuffer(raw[int(length) :], dtype="<f4")
                if head["outputs"][0].get("parameters", {}).get(
                    "binary_data_size"
                ) != data.nbytes or not np.array_equal(got, data):
                    raise LoadError("wrong binary identity output")

    client_timeout = aiohttp.ClientTimeout(total=timeout)

    async def open_() -> Any:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, force_close=False),
            timeout=client_timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(session: Any) -> None:
        await session.close()

    async def send(session: Any) -> int:
        async with session.post(url, data=body, headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise LoadError(f"HTTP {response.status}: {raw[:300].decode(errors='replace')}")
            return len(raw)

    async def first(session: Any) -> int:
        async with session.post(url, data=body, headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise LoadError(f"HTTP {response.status}: {raw[:300].decode(errors='replace')}")
            if response.headers.get("Content-Encoding", "identity") != "identity":
                raise LoadError(f"compressed answer ({response.headers['Content-Encoding']})")
            check(raw, response)
            return len(raw)

    return Workload(name, payload, send, open_, close, first)


def grpc_workload(name: str, target: str, elements: int, timeout: float, shared: dict[str, Any]) -> Workload:
    import grpc.aio
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest()
    if name == "simple_grpc":
        request.model_name = "simple"
        for tensor_name, array in (("INPUT0", SIMPLE_A), ("INPUT1", SIMPLE_B)):
            request.inputs.add(name=tensor_name, datatype="INT32", shape=[1, 16])
            request.raw_input_contents.append(array.astype("<i4").tobytes())
        expected = [(SIMPLE_A + SIMPLE_B).astype("<i4").tobytes(), (SIMPLE_A - SIMPLE_B).astype("<i4").tobytes()]
        payload = 2 * SIMPLE_A.nbytes
    else:
        data = _identity_data(elements)
        request.model_name = "identity_fp32"
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[elements])
        request.raw_input_contents.append(data.tobytes())
        expected = [data.tobytes()]
        payload = data.nbytes
    wire = request.SerializeToString()

    async def open_() -> Any:
        # One channel for all workers (HTTP/2 multiplexes them), as a gRPC client application would.
        if "channel" not in shared:
            shared["channel"] = grpc.aio.insecure_channel(
                target,
                options=[("grpc.max_send_message_length", GRPC_LIMIT), ("grpc.max_receive_message_length", GRPC_LIMIT)],
            )
            shared["call"] = shared["channel"].unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,  # the request is serialized once, up front
                response_deserializer=None,  # read in full as bytes; the first answer is parsed and checked
            )
        return shared["call"]

    async def close(call: Any) -> None:
        channel = shared.pop("channel", None)
        if channel is not None:
            await channel.close()

    async def send(call: Any) -> int:
        try:
            return len(await call(wire, timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise LoadError(f"gRPC {exc.code().name}: {exc.details()}") from None

    async def first(call: Any) -> int:
        try:
            raw = await call(wire, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise LoadError(f"gRPC {exc.code().name}: {exc.details()}") from None
        reply = pb.ModelInferResponse.FromString(raw)
        if list(reply.raw_output_contents) != expected:
            contents = [len(c) for c in reply.raw_output_contents]
            raise LoadError(f"wrong gRPC outputs (raw entries of {contents} bytes, {len(reply.outputs)} outputs)")
        return len(raw)

    _ = pb_grpc  # the stubs module documents the method path used above
    return Workload(name, payload, send, open_, close, first)


def make_workload(name: str, rest: str, grpc_target: str, elements: int, timeout: float) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
    if "grpc" in name:
        return grpc_workload(name, grpc_target, elements, timeout, {})
    return rest_workload(name, rest, elements, timeout)


# --- the closed loop ------------------------------------------------------------------------------------------


async def run_load(
    workload: Workload,
    concurrency: int,
    duration: float,
    warmup: float,
    server_pid: int | None = None,
    max_requests: int = 1_000_000,
) -> dict[str, Any]:
    """Run the closed loop; the figures of the measurement window (see the module doc)."""
    states = [await workload.open() for _ in range(concurrency)]
    result: dict[str, Any] = {
        "workload": workload.name,
        "concurrency": concurrency,
        "payload_bytes": workload.payload_bytes,
        "duration_s": duration,
        "warmup_s": warmup,
    }
    sampler: _Sampler | None = None
    try:
        try:
            response_bytes = await workload.first(states[0])
        except LoadError as exc:
            return {**result, "error": str(exc)}
        except Exception as exc:
            return {**result, "error": f"{type(exc).__name__}: {exc}"}
        idle_kib = peak_reset = None
        if server_pid is not None:
            peak_reset = reset_peak(server_pid)
            idle_kib = rss_kib(server_pid)
            if not peak_reset:
                sampler = _Sampler(server_pid)
                sampler.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        window_start = start + warmup
        window_end = window_start + duration
        latencies: list[float] = []
        errors: list[str] = []
        sent = [0]
        completed = [1]  # every answered request, warm-up included (the first, checked one too)
        marks: dict[str, Any] = {}

        def mark_window() -> None:
            marks["cpu0"] = cpu0_busy_ticks()
            marks["client"] = resource.getrusage(resource.RUSAGE_SELF)
            if server_pid is not None:
                marks["cpu"] = cpu_seconds(server_pid)

        window_handle = loop.call_at(window_start, mark_window)
        json_answers = workload.name in ("simple_rest", "identity_rest_json")  # ids may vary in length

        async def worker(state: Any) -> None:
            while sent[0] < max_requests:
                t0 = time.perf_counter()
                if t0 >= window_end:
                    return
                sent[0] += 1
                try:
                    size = await workload.send(state)
                    if size != response_bytes and not json_answers:
                        raise LoadError(f"response of {size} bytes, the first had {response_bytes}")
                except Exception as exc:  # counted, and the loop goes on
                    errors.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.01)
                    continue
                completed[0] += 1
                t1 = time.perf_counter()
                if window_start <= t0 and t1 <= window_end:
                    latencies.append(t1 - t0)

        await asyncio.wait_for(asyncio.gather(*(worker(s) for s in states)), timeout=warmup + duration + 120)
        window_handle.cancel()
        end = loop.time()
        if "cpu0" not in marks:  # the run ended (max_requests) before the window opened
            mark_window()
        busy0, total0 = marks["cpu0"]
        busy1, total1 = cpu0_busy_ticks()
        client = resource.getrusage(resource.RUSAGE_SELF)
        count = len(latencies)
        window = min(end, window_end) - window_start
        lat = np.sort(np.asarray(latencies)) * 1000.0 if latencies else np.asarray([np.nan])
        client_cpu_s = (client.ru_utime + client.ru_stime) - (marks["client"].ru_utime + marks["client"].ru_stime)
        result.update(
            requests=count,
            completed=completed[0],
            errors=len(errors),
            error_sample=errors[:3],
            window_s=window,
            infer_per_s=count / window if window > 0 else 0.0,
            p50_ms=float(np.percentile(lat, 50)),
            p99_ms=float(np.percentile(lat, 99)),
            mean_ms=float(np.mean(lat)),
            max_ms=float(np.max(lat)),
            response_bytes=response_bytes,
            cpu0_busy=(busy1 - busy0) / (total1 - total0) if total1 > total0 else None,
            client_cpu_s=client_cpu_s,
            client_cpu_us_per_infer=client_cpu_s / count * 1e6 if count else None,
        )
        if server_pid is not None:
            cpu = cpu_seconds(server_pid) - marks["cpu"]
            result["server_cpu_s"] = cpu
            result["server_cpu_us_per_infer"] = cpu / count * 1e6 if count else None
            result["idle_rss_mib"] = idle_kib / 1024 if idle_kib is not None else None
            if sampler is not None:
                sampler.done.set()
                sampler.join(1)
                result["peak_rss_mib"], result["peak_source"] = (
                    max(sampler.peak, rss_kib(server_pid)) / 1024,
                    "sampled VmRSS",
                )
            else:
                result["peak_rss_mib"], result["peak_source"] = _status_kib(server_pid, "VmHWM") / 1024, "VmHWM"
        return result
    finally:
        if sampler is not None:
            sampler.done.set()
        for state in states:
            with contextlib.suppress(Exception):
                await workload.close(state)


def run(
    workload_name: str,
    rest: str,
    grpc_target: str,
    concurrency: int = 1,
    duration: float = 10.0,
    warmup: float = 2.0,
    elements: int = 1_000_000,
    server_pid: int | None = None,
    timeout: float = 60.0,
    max_requests: int = 1_000_000,
) -> dict[str, Any]:
    """One measurement in a fresh event loop (uvloop where installed)."""
    workload = make_workload(workload_name, rest, grpc_target, elements, timeout)
    coroutine = run_load(workload, concurrency, duration, warmup, server_pid, max_requests)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rest", default="127.0.0.1:8000", help="REST host:port")
    p.add_argument("--grpc", default="127.0.0.1:8001", help="gRPC host:port")
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("-d", "--duration", type=float, default=10.0, help="measurement window, seconds")
    p.add_argument("-w", "--warmup", type=float, default=2.0, help="warm-up, seconds")
    p.add_argument("--elements", type=int, default=1_000_000, help="FP32 elements of the identity workloads")
    p.add_argument("--server-pid", type=int, help="measure this process tree's CPU and memory")
    p.add_argument("--timeout", type=float, default=60.0, help="one request, seconds")
    p.add_argument("--max-requests", type=int, default=1_000_000)
    args = p.parse_args(argv)
    for host in (args.rest, args.grpc):
        if host.split(":")[0] not in ("127.0.0.1", "localhost", "[::1]") and not host.startswith("127."):
            p.error(f"{host}: the benchmark only targets loopback addresses")
    result = run(
        args.workload,
        args.rest,
        args.grpc,
        args.concurrency,
        args.duration,
        args.warmup,
        args.elements,
        args.server_pid,
        args.timeout,
        args.max_requests,
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
