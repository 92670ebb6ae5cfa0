"""The benchmark's own load generator: a closed loop at a fixed concurrency against any OIP server.

`concurrency` asyncio workers each send the next request as soon as the previous one is answered. The first
`warmup` seconds are not counted; then the requests that *complete* within the next `duration` seconds are
(infer/s = count / window, p50/p99 over them). Every request body is built once; every response body is read in
full and its status checked; the first response is decoded and its values checked, and every later one must
have the same size. REST goes through aiohttp (one keep-alive connection per worker, `Accept-Encoding:
identity`: servers that gzip would otherwise pay for it), gRPC through grpc.aio with tritonclient's stubs and
tensors in `raw_input_contents`, as perf_analyzer sends them.

The workloads (`WORKLOADS`), each one model's request in one form:
- `simple_*` and `identity_*`: INT32 [1, 16] x2 (`simple`) over REST JSON and gRPC; FP32 [N] (`identity_fp32`) over
  REST JSON, REST binary and gRPC raw;
- `text_*`: 8 strings of 64 bytes (`text`, BYTES) over REST JSON, REST binary and gRPC, the binary bodies and the
  gRPC message as tritonclient writes them;
- `batched_*`: `simple`'s request to `batched`, a model under dynamic batching, over REST JSON and gRPC;
- `decoupled_grpc`: one request for 100 responses of `decoupled` over ModelStreamInfer, each worker on its own
  stream, the request asking for the empty final response; a request completes with that final response;
- `generate`, `generate_stream`: Triton's generate extension (`text_generate`, one answer; `text_tokens`, one
  server-sent event per word of a 16-word prompt); perf_analyzer has no mode for it;
- `simple_contents_grpc`: `simple` as KServe's client sends a request whose inputs are lists (typed `contents`,
  `InferRequest.to_grpc`); `simple_params_grpc` and `simple_params_rest`: `simple` with three request parameters
  as tritonclient sends them (over REST its default: binary inputs and `binary_data_output`).

Given the server's pid, it also measures what the server spent over the window: user+system CPU of its whole
process tree (/proc/<pid>/stat), and its peak resident memory (VmHWM, reset through /proc/<pid>/clear_refs at the
start of the warm-up; sampled VmRSS where that is refused).

    python bench/loadgen.py --rest 127.0.0.1:8000 --grpc 127.0.0.1:8001 --workload simple_rest -c 8 \
        [-d 10] [-w 2] [--elements 1000000] [--server-pid PID]     # prints one JSON object
    python bench/loadgen.py ... --workload text_grpc --record FILE  # one answer, recorded for a floor server

Bounded: each phase by its time, each request by --timeout, the whole run by --max-requests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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

WORKLOADS = (
    "simple_rest", "simple_grpc", "identity_rest_json", "identity_rest_binary", "identity_grpc_raw",
    "text_rest_json", "text_rest_binary", "text_grpc", "batched_rest", "batched_grpc", "decoupled_grpc",
    "generate", "generate_stream", "simple_contents_grpc", "simple_params_grpc", "simple_params_rest",
)
SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)
# The text model's request: 8 strings of 64 bytes.
TEXT = np.array([f"text {i}: the quick brown fox jumps over the lazy dog, again and again".encode()[:64]
                 for i in range(8)], dtype=object)
DECOUPLED_RESPONSES = 100
DECOUPLED_IN = 7
PROMPT = "the quick brown fox jumps over the lazy dog and the dog sleeps in the sun"  # 16 words
# Request parameters as a client application sets them (tritonclient: `parameters=`; perf_analyzer:
# --request-parameter name:value:type).
PARAMETERS = {"request_tag": "bench", "max_tokens": 16, "stream": False}
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
    """One kind of request: how to send it once (returns the response size), how to check the first answer, and how
    to record one answer (`record`: for a floor server that replays it, see `record`)."""

    name: str
    payload_bytes: int  # tensor bytes each way
    send: Callable[[Any], Awaitable[int]] = field(repr=False)  # (worker state) -> response size
    open: Callable[[], Awaitable[Any]] = field(repr=False)  # one worker's state (session / stub)
    close: Callable[[Any], Awaitable[None]] = field(repr=False)
    first: Callable[[Any], Awaitable[int]] = field(repr=False)  # send once, check every value; response size
    record: Callable[[Any], Awaitable[dict[str, Any]]] = field(repr=False)  # one answer as a floor server gives it
    responses: int = 1  # responses per request (a stream's)
    json_answers: bool = False  # answers whose size may vary (JSON with ids...): not checked by size


def _identity_data(elements: int) -> np.ndarray:
    return np.random.default_rng(0).random(elements, dtype=np.float32)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _simple_check(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """The outputs of `simple` (and `batched`) are the sum and the difference of its inputs."""
    if not (np.array_equal(a.reshape(-1), (SIMPLE_A + SIMPLE_B).ravel())
            and np.array_equal(b.reshape(-1), (SIMPLE_A - SIMPLE_B).ravel())):
        raise LoadError(f"wrong simple outputs: {what[:300]}")


def _text_check(strings: Any, what: str) -> None:
    got = [s.encode() if isinstance(s, str) else bytes(s) for s in np.asarray(strings, dtype=object).reshape(-1)]
    if got != [s.upper() for s in TEXT]:
        raise LoadError(f"wrong text output: {what[:300]}")


def _binary_outputs(raw: bytes, length: str | None, datatypes: dict[str, str]) -> dict[str, Any]:
    """The outputs of a binary REST answer (JSON header, then each output's bytes), by name."""
    from tritonclient.utils import deserialize_bytes_tensor

    if length is None:
        raise LoadError(f"no binary output (no Inference-Header-Content-Length): {raw[:300]!r}")
    head = orjson.loads(raw[: int(length)])
    out, pos = {}, int(length)
    for tensor in head["outputs"]:
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            raise LoadError(f"output {tensor['name']} is not binary: {raw[:300]!r}")
        chunk = raw[pos: pos + size]
        pos += size
        kind = datatypes.get(tensor["name"], tensor["datatype"])
        out[tensor["name"]] = deserialize_bytes_tensor(chunk) if kind == "BYTES" else np.frombuffer(chunk, "<i4")
    return out


def _rest_json_simple(model: str, extra: dict[str, Any] | None = None) -> bytes:
    return orjson.dumps(
        {
            **(extra or {}),
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": SIMPLE_A.ravel().tolist()},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": SIMPLE_B.ravel().tolist()},
            ],
        }
    )


@dataclass
class RestRequest:
    """A REST workload's request (built once), and how to check its answer (raw body, response with `headers`)."""

    path: str
    body: bytes
    headers: dict[str, str]
    check: Callable[[bytes, Any], None] = field(repr=False)
    payload: int
    responses: int = 1
    json_answers: bool = False
    events: bool = False  # a stream of server-sent events


def rest_request(name: str, elements: int) -> RestRequest:
    """The request of REST workload `name` (see the module's description)."""
    headers = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
    payload = 2 * SIMPLE_A.nbytes
    json_answers = name in ("simple_rest", "identity_rest_json", "batched_rest", "text_rest_json", "generate")
    events = name == "generate_stream"
    responses = 1
    if name in ("simple_rest", "batched_rest"):
        model = "simple" if name == "simple_rest" else "batched"
        url = f"/v2/models/{model}/infer"
        body = _rest_json_simple(model)

        def check(raw: bytes, response: Any) -> None:
            outputs = {o["name"]: o for o in orjson.loads(raw)["outputs"]}
            _simple_check(np.asarray(outputs["OUTPUT0"]["data"]), np.asarray(outputs["OUTPUT1"]["data"]), repr(raw))
    elif name == "simple_params_rest":
        # tritonclient.http's own body: binary inputs, `binary_data_output` (no outputs listed), the parameters
        import tritonclient.http as httpclient
        from tritonclient.http._utils import _get_inference_request

        url = "/v2/models/simple/infer"
        inputs = []
        for tensor_name, array in (("INPUT0", SIMPLE_A), ("INPUT1", SIMPLE_B)):
            item = httpclient.InferInput(tensor_name, list(array.shape), "INT32")
            item.set_data_from_numpy(array)
            inputs.append(item)
        body, length = _tritonclient_body(_get_inference_request(inputs, "", None, 0, False, False, 0, None,
                                                                 PARAMETERS))
        headers = {**headers, "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": length}

        def check(raw: bytes, response: Any) -> None:
            out = _binary_outputs(raw, response.headers.get("Inference-Header-Content-Length"), {})
            _simple_check(out["OUTPUT0"], out["OUTPUT1"], repr(raw))
    elif name == "text_rest_json":
        url = "/v2/models/text/infer"
        payload = sum(len(s) for s in TEXT)
        body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [len(TEXT)],
                                         "data": [s.decode() for s in TEXT]}]})

        def check(raw: bytes, response: Any) -> None:
            _text_check(orjson.loads(raw)["outputs"][0]["data"], repr(raw))
    elif name == "text_rest_binary":
        import tritonclient.http as httpclient
        from tritonclient.http._utils import _get_inference_request

        url = "/v2/models/text/infer"
        payload = sum(len(s) for s in TEXT)
        item = httpclient.InferInput("INPUT0", [len(TEXT)], "BYTES")
        item.set_data_from_numpy(TEXT)
        body, length = _tritonclient_body(_get_inference_request([item], "", None, 0, False, False, 0, None, None))
        headers = {**headers, "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": length}

        def check(raw: bytes, response: Any) -> None:
            out = _binary_outputs(raw, response.headers.get("Inference-Header-Content-Length"), {"OUTPUT0": "BYTES"})
            _text_check(out["OUTPUT0"], repr(raw))
    elif name == "generate":
        url = "/v2/models/text_generate/generate"
        payload = len(PROMPT)
        body = orjson.dumps({"text_input": PROMPT, "parameters": {"max_tokens": 16}})

        def check(raw: bytes, response: Any) -> None:
            if orjson.loads(raw).get("text_output") != PROMPT.upper():
                raise LoadError(f"wrong generate answer: {raw[:300]!r}")
    elif name == "generate_stream":
        url = "/v2/models/text_tokens/generate_stream"
        payload = len(PROMPT)
        responses = len(PROMPT.split())
        body = orjson.dumps({"text_input": PROMPT, "parameters": {"max_tokens": 16}})

        def check(raw: bytes, response: Any) -> None:
            words = [orjson.loads(event[len(b"data:"):]).get("text_output") for event in _events(raw)]
            if words != PROMPT.split():
                raise LoadError(f"wrong generate_stream events: {raw[:300]!r}")
    else:
        url = "/v2/models/identity_fp32/infer"
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

    return RestRequest(url, body, headers, check, payload, responses, json_answers, events)


def rest_workload(name: str, address: str, elements: int, timeout: float) -> Workload:
    import aiohttp

    request = rest_request(name, elements)
    url, body, headers, check = f"http://{address}{request.path}", request.body, request.headers, request.check
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

    async def record(session: Any) -> dict[str, Any]:
        async with session.post(url, data=body, headers=headers) as response:
            raw = await response.read()
            check(raw, response)
            kept = {k: v for k, v in response.headers.items()
                    if k.lower() in ("content-type", "inference-header-content-length")}
            # A stream's events, recorded one by one (the floor writes them together, bench/floor.py).
            chunks = [event + b"\n\n" for event in _events(raw)] if request.events else [raw]
        return {"transport": "rest", "path": request.path, "status": response.status,
                "headers": sorted(kept.items()), "chunks": [_b64(c) for c in chunks]}

    return Workload(name, request.payload, send, open_, close, first, record, request.responses,
                    request.json_answers)


def _tritonclient_body(made: tuple[bytes, int | None]) -> tuple[bytes, str]:
    """tritonclient.http's request body and the header length it sends (`_get_inference_request`'s answer)."""
    body, length = made
    return body, str(length if length is not None else len(body))


def _events(raw: bytes) -> list[bytes]:
    """The `data:` lines of a server-sent event stream."""
    return [line for line in raw.split(b"\n") if line.startswith(b"data:")]


def _kserve_contents_request(pb: Any) -> Any:
    """`simple` as KServe's client writes it for inputs given as lists: `InferRequest(...).to_grpc()` puts each
    input's data in the typed `contents` field of its datatype (`int_contents` for INT32), no raw contents, no id."""
    request = pb.ModelInferRequest(model_name="simple")
    for tensor_name, array in (("INPUT0", SIMPLE_A), ("INPUT1", SIMPLE_B)):
        tensor = request.inputs.add(name=tensor_name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(array.ravel().tolist())
    return request


def grpc_request(name: str, elements: int) -> tuple[Any, list[bytes], int]:
    """The request message of a gRPC workload, the raw outputs the answer must carry, and the payload's bytes."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc._utils import _get_inference_request
    from tritonclient.utils import serialize_byte_tensor

    simple = [(SIMPLE_A + SIMPLE_B).astype("<i4").tobytes(), (SIMPLE_A - SIMPLE_B).astype("<i4").tobytes()]
    if name in ("simple_grpc", "batched_grpc", "simple_params_grpc"):
        # tritonclient.grpc's own message (raw contents), with the parameters for simple_params_grpc
        inputs = []
        for tensor_name, array in (("INPUT0", SIMPLE_A), ("INPUT1", SIMPLE_B)):
            item = grpcclient.InferInput(tensor_name, list(array.shape), "INT32")
            item.set_data_from_numpy(array)
            inputs.append(item)
        model = "batched" if name == "batched_grpc" else "simple"
        parameters = PARAMETERS if name == "simple_params_grpc" else None
        request = _get_inference_request(model, inputs, "", "", None, 0, False, False, 0, None, parameters)
        return request, simple, 2 * SIMPLE_A.nbytes
    if name == "simple_contents_grpc":
        return _kserve_contents_request(pb), simple, 2 * SIMPLE_A.nbytes
    if name == "text_grpc":
        item = grpcclient.InferInput("INPUT0", [len(TEXT)], "BYTES")
        item.set_data_from_numpy(TEXT)
        request = _get_inference_request("text", [item], "", "", None, 0, False, False, 0, None, None)
        upper = np.array([s.upper() for s in TEXT], dtype=object)
        return request, [serialize_byte_tensor(upper).item()], sum(len(s) for s in TEXT)
    if name == "decoupled_grpc":
        item = grpcclient.InferInput("IN", [1], "INT32")
        item.set_data_from_numpy(np.array([DECOUPLED_IN], dtype=np.int32))
        request = _get_inference_request("decoupled", [item], "", "", None, 0, False, False, 0, None, None)
        # as tritonclient's async_stream_infer(..., enable_empty_final_response=True) sets it
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        return request, [], 4
    data = _identity_data(elements)
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[elements])
    request.raw_input_contents.append(data.tobytes())
    return request, [data.tobytes()], data.nbytes


def _outputs_raw(reply: Any) -> list[bytes]:
    """Each output of a gRPC answer as raw contents: as the server wrote them, or from its typed contents (INT32 and
    BYTES, the outputs of these workloads; a server may answer in either form)."""
    from tritonclient.utils import serialize_byte_tensor

    if reply.raw_output_contents:
        return list(reply.raw_output_contents)
    out = []
    for tensor in reply.outputs:
        if tensor.datatype == "BYTES":
            out.append(serialize_byte_tensor(np.array(list(tensor.contents.bytes_contents), dtype=object)).item())
        else:
            out.append(np.asarray(tensor.contents.int_contents, dtype="<i4").tobytes())
    return out


def _stream_check(replies: list[bytes], pb: Any) -> None:
    """A decoupled request's answers: DECOUPLED_RESPONSES responses, OUT = IN + i, then the empty final one."""
    messages = [pb.ModelStreamInferResponse.FromString(raw) for raw in replies]
    errors = [m.error_message for m in messages if m.error_message]
    if errors:
        raise LoadError(f"stream error: {errors[0][:300]}")
    values = [int(np.frombuffer(m.infer_response.raw_output_contents[0], "<i4")[0])
              for m in messages if m.infer_response.raw_output_contents]
    final = messages[-1].infer_response if messages else None
    if (values != [DECOUPLED_IN + i for i in range(DECOUPLED_RESPONSES)] or final is None or final.outputs
            or not final.parameters["triton_final_response"].bool_param):
        raise LoadError(f"wrong decoupled answers: {len(messages)} responses, values {values[:5]}...")


def _is_final(raw: bytes, pb: Any) -> bool:
    reply = pb.ModelStreamInferResponse.FromString(raw)
    if reply.error_message:
        raise LoadError(f"stream error: {reply.error_message[:300]}")
    return bool(reply.infer_response.parameters["triton_final_response"].bool_param)


def grpc_workload(name: str, target: str, elements: int, timeout: float, shared: dict[str, Any]) -> Workload:
    import grpc.aio
    from tritonclient.grpc import service_pb2 as pb

    request, expected, payload = grpc_request(name, elements)
    wire = request.SerializeToString()
    streaming = name == "decoupled_grpc"
    method = "ModelStreamInfer" if streaming else "ModelInfer"
    path = f"/inference.GRPCInferenceService/{method}"

    async def open_() -> Any:
        # One channel for all workers (HTTP/2 multiplexes them), as a gRPC client application would; a stream of
        # its own for each worker.
        if "channel" not in shared:
            shared["channel"] = grpc.aio.insecure_channel(
                target,
                options=[("grpc.max_send_message_length", GRPC_LIMIT), ("grpc.max_receive_message_length", GRPC_LIMIT)],
            )
            make = shared["channel"].stream_stream if streaming else shared["channel"].unary_unary
            # the request is serialized once, up front; answers are read in full as bytes, the first checked
            shared["call"] = make(path, request_serializer=None, response_deserializer=None)
        return shared["call"]() if streaming else shared["call"]

    async def close(call: Any) -> None:
        if streaming:
            with contextlib.suppress(Exception):
                await call.done_writing()
            call.cancel()
        channel = shared.pop("channel", None)
        if channel is not None:
            await channel.close()

    async def exchange(call: Any) -> list[bytes]:
        """One request's answers: the reply, or a stream's replies up to the final one."""
        try:
            if not streaming:
                return [await call(wire, timeout=timeout)]
            await call.write(wire)
            replies = []
            while True:
                raw = await asyncio.wait_for(call.read(), timeout)
                if raw is grpc.aio.EOF:
                    raise LoadError(f"the stream ended after {len(replies)} responses, before the final one")
                replies.append(raw)
                if _is_final(raw, pb):
                    return replies
        except grpc.aio.AioRpcError as exc:
            raise LoadError(f"gRPC {exc.code().name}: {exc.details()}") from None

    async def send(call: Any) -> int:
        return sum(len(raw) for raw in await exchange(call))

    async def checked(call: Any) -> list[bytes]:
        """One request's answers, every value checked."""
        replies = await exchange(call)
        if streaming:
            _stream_check(replies, pb)
            return replies
        reply = pb.ModelInferResponse.FromString(replies[0])
        if _outputs_raw(reply) != expected:
            contents = [len(c) for c in reply.raw_output_contents]
            raise LoadError(f"wrong gRPC outputs (raw entries of {contents} bytes, {len(reply.outputs)} outputs)")
        return replies

    async def first(call: Any) -> int:
        return sum(len(raw) for raw in await checked(call))

    async def record(call: Any) -> dict[str, Any]:
        replies = await checked(call)
        return {"transport": "grpc", "path": path, "stream": streaming, "chunks": [_b64(r) for r in replies]}

    return Workload(name, payload, send, open_, close, first, record, DECOUPLED_RESPONSES + 1 if streaming else 1)


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
        json_answers = workload.json_answers

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
            responses_per_request=workload.responses,
            responses_per_s=count * workload.responses / window if window > 0 else 0.0,
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
    return _in_loop(run_load(workload, concurrency, duration, warmup, server_pid, max_requests))


async def record_answer(workload: Workload) -> dict[str, Any]:
    """One request of `workload`, its answer checked and recorded as a floor server replays it (bench/floor.py,
    bench/grpc_floor.py): the transport, the path, and the answer's bytes (a stream's messages or events in order;
    REST: with its status and the headers that say what the body is)."""
    state = await workload.open()
    try:
        return {"workload": workload.name, **await workload.record(state)}
    finally:
        await workload.close(state)


def record(workload_name: str, rest: str, grpc_target: str, elements: int = 1_000_000,
           timeout: float = 60.0) -> dict[str, Any]:
    """`record_answer` in a fresh event loop."""
    return _in_loop(record_answer(make_workload(workload_name, rest, grpc_target, elements, timeout)))


def _in_loop(coroutine: Any) -> Any:
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
    p.add_argument("--record", type=Path, help="send one request and write its checked answer to this file (JSON)")
    args = p.parse_args(argv)
    for host in (args.rest, args.grpc):
        if host.split(":")[0] not in ("127.0.0.1", "localhost", "[::1]") and not host.startswith("127."):
            p.error(f"{host}: the benchmark only targets loopback addresses")
    if args.record is not None:
        try:
            answer = record(args.workload, args.rest, args.grpc, args.elements, args.timeout)
        except Exception as exc:  # a wrong answer or none: said in one line, nothing written
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        args.record.write_text(json.dumps(answer))
        return 0
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
