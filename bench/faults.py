"""Load and fault drivers against a running OIP server, shared by the fault suite
(tests/server/process/test_faults.py) and the load/faults view of `make bench-scale`: each runs bounded in time and
returns what it measured.

- `mixed_load`: `clients` concurrent clients for `duration` seconds on `simple`, a third each over REST JSON, REST
  binary (the binary tensor data extension: JSON header + raw tensors both ways) and gRPC (raw contents). Every
  request carries fresh random INT32 inputs and its own id; every answer is checked number by number (OUTPUT0 =
  a + b, OUTPUT1 = a - b with int32 wrap-around, the id echoed, names, shapes, datatypes). One keep-alive
  connection per REST client, one channel per gRPC client.
- `slow_clients`: `slow` connections sending a request header one byte a second (re-opened when the server closes
  them), while `probes` clients run REST JSON inferences on `simple`: the probes' latency (p99), and what the
  server did with the slow connections (how many it closed, after how long, with which status).

REST through aiohttp, gRPC through grpc.aio with tritonclient's stubs: clients nobody here wrote.

    python bench/faults.py mixed --rest 127.0.0.1:8000 --grpc 127.0.0.1:8001 [-c 64] [-d 20]   # one JSON object
    python bench/faults.py slow --rest 127.0.0.1:8000 [--slow 200] [--probes 8] [-d 12]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

KINDS = ("rest_json", "rest_binary", "grpc")
SHAPE = [1, 16]


@dataclass
class Tally:
    """What one kind of request saw: counts and latencies (seconds)."""

    requests: int = 0
    errors: int = 0
    wrong: int = 0
    samples: list[str] = field(default_factory=list)  # the first few errors and wrong answers, for the report
    latencies: list[float] = field(default_factory=list)

    def note(self, what: str) -> None:
        if len(self.samples) < 5:
            self.samples.append(what[:300])

    def figures(self, window: float) -> dict[str, Any]:
        lat = np.sort(np.asarray(self.latencies)) * 1000.0 if self.latencies else np.asarray([np.nan])
        return {
            "requests": self.requests,
            "errors": self.errors,
            "wrong": self.wrong,
            "samples": self.samples,
            "per_s": self.requests / window if window > 0 else 0.0,
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(np.max(lat)),
        }


def _expected(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.add(a, b, dtype=np.int32), np.subtract(a, b, dtype=np.int32)


def _check_json_outputs(body: dict[str, Any], request_id: str, a: np.ndarray, b: np.ndarray) -> str | None:
    """None when the REST answer is exactly right; else what is wrong."""
    if body.get("id") != request_id:
        return f"id {body.get('id')!r}, sent {request_id!r}"
    outputs = {o.get("name"): o for o in body.get("outputs", [])}
    for name, want in zip(("OUTPUT0", "OUTPUT1"), _expected(a, b), strict=True):
        out = outputs.get(name)
        if out is None or out.get("shape") != SHAPE or out.get("datatype") != "INT32":
            return f"{name}: {out!r}"
        if out.get("data") != want.ravel().tolist():
            return f"{name}: data {out.get('data')} != {want.ravel().tolist()}"
    return None


async def _rest_json(session: Any, url: str, request_id: str, a: np.ndarray, b: np.ndarray) -> str | None:
    body = {"id": request_id, "inputs": [
        {"name": "INPUT0", "shape": SHAPE, "datatype": "INT32", "data": a.ravel().tolist()},
        {"name": "INPUT1", "shape": SHAPE, "datatype": "INT32", "data": b.ravel().tolist()},
    ]}
    async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as response:
        raw = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:200]!r}")
    return _check_json_outputs(orjson.loads(raw), request_id, a, b)


async def _rest_binary(session: Any, url: str, request_id: str, a: np.ndarray, b: np.ndarray) -> str | None:
    header = orjson.dumps({
        "id": request_id,
        "inputs": [{"name": name, "shape": SHAPE, "datatype": "INT32", "parameters": {"binary_data_size": 64}}
                   for name in ("INPUT0", "INPUT1")],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in ("OUTPUT0", "OUTPUT1")],
    })
    body = header + a.astype("<i4").tobytes() + b.astype("<i4").tobytes()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    async with session.post(url, data=body, headers=headers) as response:
        raw = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:200]!r}")
        length = response.headers.get("Inference-Header-Content-Length")
    if length is None:
        return "no Inference-Header-Content-Length in the answer"
    answer = orjson.loads(raw[:int(length)])
    if answer.get("id") != request_id:
        return f"id {answer.get('id')!r}, sent {request_id!r}"
    at = int(length)
    got: dict[str, np.ndarray] = {}
    for out in answer.get("outputs", []):
        size = int(out.get("parameters", {}).get("binary_data_size", -1))
        if out.get("shape") != SHAPE or out.get("datatype") != "INT32" or size != 64:
            return f"{out.get('name')}: {out!r}"
        got[out["name"]] = np.frombuffer(raw[at:at + size], dtype="<i4")
        at += size
    if at != len(raw):
        return f"{len(raw) - at} bytes after the outputs"
    for name, want in zip(("OUTPUT0", "OUTPUT1"), _expected(a, b), strict=True):
        if name not in got or not np.array_equal(got[name], want.ravel()):
            return f"{name}: {got.get(name)} != {want.ravel()}"
    return None


def _grpc_caller(channel: Any) -> Callable[[str, np.ndarray, np.ndarray], Awaitable[str | None]]:
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    stub = pb_grpc.GRPCInferenceServiceStub(channel)

    async def call(request_id: str, a: np.ndarray, b: np.ndarray) -> str | None:
        request = pb.ModelInferRequest(model_name="simple", id=request_id)
        for name, array in (("INPUT0", a), ("INPUT1", b)):
            request.inputs.add(name=name, datatype="INT32", shape=SHAPE)
            request.raw_input_contents.append(array.astype("<i4").tobytes())
        reply = await stub.ModelInfer(request, timeout=30)
        if reply.id != request_id:
            return f"id {reply.id!r}, sent {request_id!r}"
        names = [o.name for o in reply.outputs]
        if names != ["OUTPUT0", "OUTPUT1"] or any(list(o.shape) != SHAPE or o.datatype != "INT32"
                                                  for o in reply.outputs):
            return f"outputs {reply.outputs}"
        for raw, want in zip(reply.raw_output_contents, _expected(a, b), strict=True):
            if not np.array_equal(np.frombuffer(raw, dtype="<i4"), want.ravel()):
                return f"{np.frombuffer(raw, dtype='<i4')} != {want.ravel()}"
        return None

    return call


async def _mixed(rest: str, grpc_target: str, clients: int, duration: float, seed: int) -> dict[str, Any]:
    import aiohttp
    import grpc.aio

    url = f"http://{rest}/v2/models/simple/infer"
    tallies = {kind: Tally() for kind in KINDS}
    loop = asyncio.get_running_loop()
    end = loop.time() + duration

    async def client(index: int) -> None:
        kind = KINDS[index % len(KINDS)]
        tally = tallies[kind]
        rng = np.random.default_rng(seed + index)
        session = channel = None
        try:
            if kind == "grpc":
                channel = grpc.aio.insecure_channel(grpc_target)
                grpc_call = _grpc_caller(channel)
            else:
                session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                                timeout=aiohttp.ClientTimeout(total=30))
            n = 0
            while loop.time() < end:
                n += 1
                request_id = f"{kind}-{index}-{n}"
                a = rng.integers(-(2**31), 2**31, size=SHAPE, dtype=np.int64).astype(np.int32)
                b = rng.integers(-(2**31), 2**31, size=SHAPE, dtype=np.int64).astype(np.int32)
                t0 = time.perf_counter()
                tally.requests += 1
                try:
                    if kind == "grpc":
                        wrong = await grpc_call(request_id, a, b)
                    elif kind == "rest_json":
                        wrong = await _rest_json(session, url, request_id, a, b)
                    else:
                        wrong = await _rest_binary(session, url, request_id, a, b)
                except Exception as exc:  # counted; the client goes on
                    tally.errors += 1
                    tally.note(f"{request_id}: {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.01)
                    continue
                tally.latencies.append(time.perf_counter() - t0)
                if wrong is not None:
                    tally.wrong += 1
                    tally.note(f"{request_id}: {wrong}")
        finally:
            if session is not None:
                await session.close()
            if channel is not None:
                await channel.close()

    began = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(clients))), timeout=duration + 60)
    window = time.perf_counter() - began
    per_kind = {kind: tally.figures(window) for kind, tally in tallies.items()}
    every = Tally(latencies=[x for t in tallies.values() for x in t.latencies])
    every.requests = sum(t.requests for t in tallies.values())
    every.errors = sum(t.errors for t in tallies.values())
    every.wrong = sum(t.wrong for t in tallies.values())
    every.samples = [s for t in tallies.values() for s in t.samples][:5]
    return {"clients": clients, "duration_s": duration, "window_s": window, **every.figures(window),
            "kinds": per_kind}


def mixed_load(rest: str, grpc_target: str, clients: int = 64, duration: float = 20.0, seed: int = 0) -> dict[str, Any]:
    """The mixed load above, in a fresh event loop: figures over all requests and per kind (requests, errors,
    wrong answers, per second, p50/p99/max in ms)."""
    return asyncio.run(_mixed(rest, grpc_target, clients, duration, seed))


# --- slow clients -------------------------------------------------------------------------------------------------


async def _slow(rest: str, slow: int, probes: int, duration: float) -> dict[str, Any]:
    import aiohttp

    host, port = rest.rsplit(":", 1)
    header = f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: {rest}\r\nContent-Type: application/json\r\n".encode()
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    closed: list[float] = []  # seconds from the connection's start until the server closed it
    statuses: dict[str, int] = {}
    opened = [0]
    sent_bytes = [0]

    async def slow_client() -> None:
        while loop.time() < end:
            start = loop.time()  # before the connection: the server's clock for it starts later, never earlier
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                statuses["connect failed"] = statuses.get("connect failed", 0) + 1
                await asyncio.sleep(1.0)
                continue
            opened[0] += 1
            answer = b""
            try:
                for byte in header:
                    if loop.time() >= end:
                        return
                    writer.write(bytes([byte]))
                    await writer.drain()
                    sent_bytes[0] += 1
                    with contextlib.suppress(TimeoutError):
                        answer = await asyncio.wait_for(reader.read(4096), timeout=1.0)
                        if not answer:  # the server closed the connection
                            break
                        answer += await asyncio.wait_for(reader.read(4096), timeout=1.0)
                        break
                else:
                    continue  # the whole header went out (a byte a second): cannot happen within the timeout
            except (OSError, TimeoutError):
                pass
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            closed.append(loop.time() - start)
            status = answer.split(b"\r\n", 1)[0].decode(errors="replace") if answer else "closed, no answer"
            statuses[status] = statuses.get(status, 0) + 1

    body = orjson.dumps({"inputs": [
        {"name": "INPUT0", "shape": SHAPE, "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": SHAPE, "datatype": "INT32", "data": [1] * 16},
    ]})
    want = [i + 1 for i in range(16)]
    probe = Tally()

    async def probe_client() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                         timeout=aiohttp.ClientTimeout(total=30)) as session:
            await asyncio.sleep(1.0)  # the slow connections are open first
            while loop.time() < end:
                t0 = time.perf_counter()
                probe.requests += 1
                try:
                    async with session.post(f"http://{rest}/v2/models/simple/infer", data=body,
                                            headers={"Content-Type": "application/json"}) as response:
                        raw = await response.read()
                        ok = response.status == 200 and orjson.loads(raw)["outputs"][0]["data"] == want
                except Exception as exc:
                    probe.errors += 1
                    probe.note(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.01)
                    continue
                probe.latencies.append(time.perf_counter() - t0)
                if not ok:
                    probe.wrong += 1
                    probe.note(f"HTTP {response.status}: {raw[:200]!r}")
                await asyncio.sleep(0.005)

    began = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(slow_client() for _ in range(slow)),
                                          *(probe_client() for _ in range(probes))), timeout=duration + 60)
    window = time.perf_counter() - began
    after = np.asarray(closed) if closed else np.asarray([np.nan])
    return {
        "slow_clients": slow,
        "probes": probes,
        "duration_s": duration,
        "slow_connections_opened": opened[0],
        "slow_bytes_sent": sent_bytes[0],
        "slow_closed_by_server": len(closed),
        "slow_closed_after_s": {"min": float(np.min(after)), "median": float(np.median(after)),
                                "max": float(np.max(after))},
        "slow_answers": statuses,
        "probe": probe.figures(window),
    }


def slow_clients(rest: str, slow: int = 200, probes: int = 8, duration: float = 8.0) -> dict[str, Any]:
    """The slow-client phase above, in a fresh event loop."""
    return asyncio.run(_slow(rest, slow, probes, duration))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=("mixed", "slow"))
    p.add_argument("--rest", default="127.0.0.1:8000", help="REST host:port (loopback only)")
    p.add_argument("--grpc", default="127.0.0.1:8001", help="gRPC host:port (loopback only)")
    p.add_argument("-c", "--clients", type=int, default=64, help="mixed: concurrent clients")
    p.add_argument("-d", "--duration", type=float, default=20.0, help="seconds")
    p.add_argument("--seed", type=int, default=0, help="mixed: seed of the random inputs")
    p.add_argument("--slow", type=int, default=200, help="slow: connections sending a header byte a second")
    p.add_argument("--probes", type=int, default=8, help="slow: clients served meanwhile")
    args = p.parse_args(argv)
    for host in (args.rest, args.grpc):
        if not host.startswith(("127.", "localhost:")):
            p.error(f"{host}: only loopback addresses")
    if args.phase == "mixed":
        result = mixed_load(args.rest, args.grpc, args.clients, args.duration, args.seed)
    else:
        result = slow_clients(args.rest, args.slow, args.probes, args.duration)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
