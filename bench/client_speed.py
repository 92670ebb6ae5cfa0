"""`make bench-client`: the client-side cost of one inference, the generated client beside tritonclient, no server.

Per request, each client does what it does around the network: encode the request into the bytes it sends, then
decode a canned response (the bytes a server answers) into numpy arrays, every output. The canned responses are
written by the generated server's own encoders (`oip.server.rest`, `oip.server.grpc`), so they are what a server
really sends; both clients read the same bytes.

- oipgen: `client.tensors.prepare_inputs` + `encode_rest_request` / `decode_rest_response` (REST) and
  `client.grpc.encode_infer_request_bytes` / `decode_infer_response_bytes` (gRPC: the message bytes grpc sends
  and receives; `GrpcClient.infer` passes bytes through grpc without (de)serializers): the functions
  `RestClient.infer` and `GrpcClient.infer` call.
- tritonclient 2.73: what `InferenceServerClient.infer` calls per request: `InferInput.set_data_from_numpy`,
  `InferRequestedOutput`, `generate_request_body` / `parse_response_body` + `InferResult.as_numpy` (http), and
  `InferInput.set_data_from_numpy`, `_utils._get_inference_request` + `SerializeToString` / `FromString` +
  `InferResult.as_numpy` (grpc).

Scenarios: 1M FP32 elements (identity) over REST JSON, REST binary and gRPC raw; the `simple` model (two INT32
[1, 16] inputs, two outputs) over the same three. Each figure is the median of several timed runs after a warm-up.
Targets: JSON at least 3x faster than tritonclient; binary and raw no slower.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "generated"))

import tritonclient.grpc as triton_grpc  # noqa: E402
import tritonclient.http as triton_http  # noqa: E402
from oip.client import grpc as oip_grpc  # noqa: E402
from oip.client import tensors  # noqa: E402
from oip.server import grpc as server_grpc  # noqa: E402
from oip.server import rest as server_rest  # noqa: E402
from oip.server.types import InferResponse, Tensor  # noqa: E402
from tritonclient.grpc import _utils as triton_grpc_utils  # noqa: E402
from tritonclient.grpc import service_pb2 as triton_pb  # noqa: E402


@dataclass
class Payload:
    model: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    datatype: str


@dataclass
class Canned:
    rest_json: bytes
    rest_binary: bytes
    rest_binary_header: int
    grpc: bytes


def payloads(elements: int) -> dict[str, Payload]:
    rng = np.random.default_rng(0)
    big = rng.standard_normal((1, elements)).astype(np.float32)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    return {
        f"{elements // 1_000_000}M FP32" if elements >= 1_000_000 else f"{elements} FP32": Payload(
            "identity_fp32", {"INPUT0": big}, {"OUTPUT0": big}, "FP32"),
        "simple": Payload("simple", {"INPUT0": a, "INPUT1": b}, {"OUTPUT0": a + b, "OUTPUT1": a - b}, "INT32"),
    }


def canned(payload: Payload) -> Canned:
    """The answers the generated server writes for this payload: REST JSON, REST binary, gRPC raw."""
    response = InferResponse(
        model_name=payload.model, model_version="1",
        outputs=[Tensor(name, payload.datatype, list(array.shape), array) for name, array in payload.outputs.items()],
    )
    json_body = server_rest.encode_infer_response(response, {}, False)
    binary_body = server_rest.encode_infer_response(response, {}, True)
    header = int(binary_body.headers[tensors.HEADER_LENGTH])
    grpc_body = server_grpc.encode_infer_response(response).SerializeToString()
    return Canned(bytes(json_body.body), bytes(binary_body.body), header, grpc_body)


# --- the two clients' per-request work -------------------------------------------------------------------------


def oip_rest(payload: Payload, answer: Canned, binary: bool) -> Callable[[], dict[str, np.ndarray]]:
    def run() -> dict[str, np.ndarray]:
        prepared = tensors.prepare_inputs(payload.inputs)
        body, _ = tensors.encode_rest_request(prepared, [], binary=binary)
        assert body
        if binary:
            result = tensors.decode_rest_response(answer.rest_binary, str(answer.rest_binary_header))
        else:
            result = tensors.decode_rest_response(answer.rest_json, None)
        return {name: result.as_numpy(name) for name in result.names}
    return run


def oip_grpc_raw(payload: Payload, answer: Canned) -> Callable[[], dict[str, np.ndarray]]:
    def run() -> dict[str, np.ndarray]:
        prepared = tensors.prepare_inputs(payload.inputs)
        assert oip_grpc.encode_infer_request_bytes(payload.model, "", prepared, [])
        result = oip_grpc.decode_infer_response_bytes(answer.grpc)
        return {name: result.as_numpy(name) for name in result.names}
    return run


def triton_rest(payload: Payload, answer: Canned, binary: bool) -> Callable[[], dict[str, np.ndarray]]:
    datatype = payload.datatype

    def run() -> dict[str, np.ndarray]:
        inputs = []
        for name, array in payload.inputs.items():
            tensor = triton_http.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array, binary_data=binary)
            inputs.append(tensor)
        # JSON: the outputs are listed with binary_data=False (unlisted outputs would come back binary);
        # binary: none listed, so the client asks for every output as binary data (binary_data_output).
        outputs = None if binary else [triton_http.InferRequestedOutput(n, binary_data=False) for n in payload.outputs]
        body, _ = triton_http.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
        assert body
        if binary:
            result = triton_http.InferenceServerClient.parse_response_body(
                answer.rest_binary, header_length=answer.rest_binary_header)
        else:
            result = triton_http.InferenceServerClient.parse_response_body(answer.rest_json)
        return {name: result.as_numpy(name) for name in payload.outputs}
    return run


def triton_grpc_raw(payload: Payload, answer: Canned) -> Callable[[], dict[str, np.ndarray]]:
    datatype = payload.datatype

    def run() -> dict[str, np.ndarray]:
        inputs = []
        for name, array in payload.inputs.items():
            tensor = triton_grpc.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        request = triton_grpc_utils._get_inference_request(
            model_name=payload.model, inputs=inputs, model_version="", request_id="", outputs=None, sequence_id=0,
            sequence_start=False, sequence_end=False, priority=0, timeout=None, parameters=None)
        assert request.SerializeToString()
        result = triton_grpc.InferResult(triton_pb.ModelInferResponse.FromString(answer.grpc))
        return {name: result.as_numpy(name) for name in payload.outputs}
    return run


# --- timing ----------------------------------------------------------------------------------------------------


def timed(run: Callable[[], Any], budget: float, min_samples: int = 3, max_samples: int = 50) -> tuple[float, int]:
    """Median seconds per call. After a warm-up, each sample times a batch of calls long enough to read the clock
    well (about 20 ms; one call when a call takes longer), with a garbage collection before each sample and none
    inside it; samples go on until `budget` seconds or `max_samples` (at least `min_samples`)."""
    started = time.perf_counter()
    run()
    once = time.perf_counter() - started
    batch = max(1, int(0.02 / max(once, 1e-7)))
    times: list[float] = []
    spent = 0.0
    while len(times) < min_samples or (spent < budget and len(times) < max_samples):
        gc.collect()
        started = time.perf_counter()
        for _ in range(batch):
            run()
        elapsed = time.perf_counter() - started
        times.append(elapsed / batch)
        spent += elapsed
    return statistics.median(times), len(times) * batch


def check(name: str, got: dict[str, np.ndarray], payload: Payload) -> None:
    for output, expected in payload.outputs.items():
        array = got[output]
        if array.shape != expected.shape or not np.array_equal(array, expected):
            raise SystemExit(f"{name}: output {output} differs from the expected data")


def fmt(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f} ms" if ms < 1 else (f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=1_000_000, help="FP32 elements of the large tensor")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timed runs per figure (at most)")
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})

    rows: list[dict[str, Any]] = []
    for label, payload in payloads(args.elements).items():
        answer = canned(payload)
        scenarios = [
            ("REST JSON", oip_rest(payload, answer, False), triton_rest(payload, answer, False)),
            ("REST binary", oip_rest(payload, answer, True), triton_rest(payload, answer, True)),
            ("gRPC raw", oip_grpc_raw(payload, answer), triton_grpc_raw(payload, answer)),
        ]
        for transport, ours, theirs in scenarios:
            check(f"oipgen {label} {transport}", ours(), payload)
            check(f"tritonclient {label} {transport}", theirs(), payload)
            ours_s, ours_n = timed(ours, args.budget)
            theirs_s, theirs_n = timed(theirs, args.budget)
            rows.append({
                "payload": label, "transport": transport, "oipgen_s": ours_s, "tritonclient_s": theirs_s,
                "speedup": theirs_s / ours_s, "runs": [ours_n, theirs_n],
            })
            print(f"  measured {label:>9} {transport:<11} oipgen {fmt(ours_s):>10}  tritonclient {fmt(theirs_s):>10}",
                  file=sys.stderr)

    import tritonclient

    print()
    print(f"Client-side encode + decode per request (median), oipgen client vs tritonclient "
          f"{getattr(tritonclient, '__version__', '2.73')}; no server, same canned responses")
    print()
    ratio = "tritonclient / oipgen"
    print(f"| {'payload':<9} | {'transport':<11} | {'oipgen':>10} | {'tritonclient':>12} | {ratio:>21} |")
    print(f"|{'-' * 11}|{'-' * 13}|{'-' * 12}:|{'-' * 14}:|{'-' * 23}:|")
    for row in rows:
        print(f"| {row['payload']:<9} | {row['transport']:<11} | {fmt(row['oipgen_s']):>10} | "
              f"{fmt(row['tritonclient_s']):>12} | {row['speedup']:>20.2f}x |")
    print()
    targets = []
    for row in rows:
        need = 3.0 if row["transport"] == "REST JSON" else 1.0
        ok = row["speedup"] >= need * (0.97 if need == 1.0 else 1.0)  # "no slower": within 3% noise
        targets.append(ok)
        if not ok:
            print(f"target missed: {row['payload']} {row['transport']}: {row['speedup']:.2f}x (target {need:.0f}x)")
    print("targets (JSON >= 3x, binary and raw no slower):", "met" if all(targets) else "NOT met")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "targets_met": all(targets)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
