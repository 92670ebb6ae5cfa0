"""The lean way of a REST inference request (`oip.server.rest.lean.LeanInfer`), in process: JSON, and a JSON
header followed by binary data.

Every request it takes must get exactly the answer the general way gives (the route's answer without it: status,
headers and body byte for byte), be counted as the general way counts it, and fail with the same error; every
request it does not take must be left untouched (None, nothing counted) and then answered or refused by the general
way as before. The server's app takes it for the common request only (the general decoder never called), and the
suite's REST tests over real sockets (golden cases, bad input, tritonclient, statistics) run through it too.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from lean_models import GOOD_ANSWERS, WRONG_ANSWERS, Answers, Async, Batching, Flags, Rows, Simple, Texts
from oip.server import Assembly, DataPlane, Model, ModelFailure, ModelRepository, Settings
from oip.server.rest import handlers
from oip.server.rest.endpoints import ENDPOINTS
from oip.server.rest.handlers import tensor_answer
from oip.server.rest.infer_codec import BinaryParts
from oip.server.rest.lean import LeanInfer

A = list(range(16))
B = [3] * 16
INFER = next(e for e in ENDPOINTS if e.operation == "model_infer" and "model_version" not in e.path)


def plane(*models: Model, **settings: Any) -> DataPlane:
    repository = ModelRepository()
    for model in (Simple(), Async(), Rows(), Batching(), Texts(), Flags(), *models):
        repository.add(model)
    asyncio.run(repository.load_all())
    return DataPlane(repository, Settings(**{"max_tensor_elements": 1000, **settings}))


def tensor(name: str, datatype: str, shape: list[Any], data: Any, **more: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data, **more}


def simple(**fields: Any) -> dict[str, Any]:
    return {"inputs": [tensor("INPUT0", "INT32", [1, 16], A), tensor("INPUT1", "INT32", [1, 16], B)], **fields}


@dataclass(frozen=True)
class Framed:
    """A body of a JSON header followed by binary data (`Inference-Header-Content-Length`)."""

    header: dict[str, Any]
    data: bytes

    def raw(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        head = json.dumps(self.header).encode()
        return head + self.data, [(b"inference-header-content-length", str(len(head)).encode())]


def raw_tensor(name: str, datatype: str, shape: list[int], data: bytes) -> tuple[dict[str, Any], bytes]:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(data)}}, data


def framed(*inputs: tuple[dict[str, Any], bytes] | dict[str, Any], **fields: Any) -> Framed:
    """A body whose inputs are JSON (a dict) or binary (`raw_tensor`), in order."""
    items = [item if isinstance(item, dict) else item[0] for item in inputs]
    data = b"".join(item[1] for item in inputs if not isinstance(item, dict))
    return Framed({"inputs": items, **fields}, data)


def binary_simple(**fields: Any) -> Framed:
    return framed(raw_tensor("INPUT0", "INT32", [1, 16], np.array(A, np.int32).tobytes()),
                  raw_tensor("INPUT1", "INT32", [1, 16], np.array(B, np.int32).tobytes()), **fields)


def answer(dp: DataPlane, body: Any, model: str = "simple", lean: bool = True, parts: bool = False,
           **path: str) -> tuple[Any, ...]:
    """The route's answer to `body` (a JSON value, a `Framed` body, or bytes as they are): status, headers and body
    (`parts`: a `BinaryParts` answer's parts joined)."""
    route = tensor_answer(dp, dp.settings, INFER, dp.repository, False,
                          LeanInfer(dp.pipeline, dp.settings) if lean else None)
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(body, Framed):
        raw, headers = body.raw()
    else:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = asyncio.run(route({"model_name": model, **path}, raw, headers, parts))
    sent = b"".join(bytes(part) for part in response.parts) if hasattr(response, "parts") else bytes(response.body)
    return response.status_code, response.raw_headers, sent


def lean_way(dp: DataPlane, body: Any, model: str = "simple", **path: str) -> Any:
    """What the lean way itself makes of `body`: an answer, or None."""
    doc, binary = (body.header, memoryview(body.data)) if isinstance(body, Framed) else (body, None)
    return asyncio.run(LeanInfer(dp.pipeline, dp.settings)({"model_name": model, **path}, doc, binary, None))


def counts(dp: DataPlane, name: str) -> dict[str, Any]:
    return dp.statistics.snapshot().get((name, "1"), {})


# Requests the lean way takes: (model, body, path fields).
TAKEN: dict[str, tuple[str, Any, dict[str, str]]] = {
    "simple": ("simple", simple(), {}),
    "an id": ("simple", simple(id="r-7"), {}),
    "an empty id": ("simple", simple(id=""), {}),
    "one output": ("simple", simple(outputs=[{"name": "OUTPUT1"}]), {}),
    "outputs reordered": ("simple", simple(outputs=[{"name": "OUTPUT1"}, {"name": "OUTPUT0"}]), {"model_version": "1"}),
    "no outputs listed": ("simple", simple(outputs=[]), {}),
    "nested data": ("simple", {"inputs": [tensor("INPUT1", "INT32", [1, 16], [B]),
                                          tensor("INPUT0", "INT32", [1, 16], [A])]}, {}),
    "an async model": ("async_simple", simple(), {}),
    "rows": ("rows", {"inputs": [tensor("INPUT0", "INT32", [3, 16], A * 3),
                                 tensor("INPUT1", "INT32", [3, 16], B * 3)]}, {}),
    "dynamic batching": ("batching", {"inputs": [tensor("INPUT0", "INT32", [1, 16], A),
                                                 tensor("INPUT1", "INT32", [1, 16], B)]}, {}),
    "BYTES": ("texts", {"id": "t", "inputs": [tensor("IN", "BYTES", [3], ["ab c", "d\u00e9f", ""])]}, {}),
    "BOOL": ("flags", {"inputs": [tensor("IN", "BOOL", [2], [True, False])]}, {}),
    "empty request parameters": ("simple", simple(parameters={}), {}),
    "request parameters": ("simple", simple(parameters={"k": "v", "n": 2, "f": 0.5, "b": True}), {}),
    "request parameters the model answers with": ("texts", {"inputs": [tensor("IN", "BYTES", [1], ["a"])],
                                                            "parameters": {"k": "v"}}, {}),
    "empty output parameters": ("simple", simple(outputs=[{"name": "OUTPUT0", "parameters": {}}]), {}),
    "an output asked for as JSON": ("simple", simple(outputs=[{"name": "OUTPUT0",
                                                               "parameters": {"binary_data": False}}]), {}),
    "binary inputs": ("simple", binary_simple(), {}),
    "binary and JSON inputs": ("simple", framed(
        tensor("INPUT0", "INT32", [1, 16], A), raw_tensor("INPUT1", "INT32", [1, 16], np.array(B, np.int32).tobytes())),
        {}),
    "binary outputs (tritonclient's default)": ("simple", binary_simple(outputs=[
        {"name": "OUTPUT0", "parameters": {"binary_data": True}},
        {"name": "OUTPUT1", "parameters": {"binary_data": True}}]), {}),
    "a binary and a JSON output": ("simple", simple(outputs=[{"name": "OUTPUT1", "parameters": {"binary_data": True}},
                                                             {"name": "OUTPUT0"}]), {}),
    "binary_data_output": ("simple", binary_simple(id="b", parameters={"binary_data_output": True}), {}),
    "binary_data_output false": ("simple", simple(parameters={"binary_data_output": False}), {}),
    "binary_data_output, outputs listed": ("simple", simple(parameters={"binary_data_output": True},
                                                            outputs=[{"name": "OUTPUT0"}]), {}),
    "BYTES binary": ("texts", framed(raw_tensor("IN", "BYTES", [2], b"\x02\x00\x00\x00ab\x00\x00\x00\x00"),
                                     parameters={"binary_data_output": True}), {}),
    "BOOL binary": ("flags", framed(raw_tensor("IN", "BOOL", [2], b"\x01\x00"),
                                    outputs=[{"name": "OUT", "parameters": {"binary_data": True}}]), {}),
    "rows, binary": ("rows", framed(raw_tensor("INPUT0", "INT32", [2, 16], np.array(A * 2, np.int32).tobytes()),
                                    raw_tensor("INPUT1", "INT32", [2, 16], np.array(B * 2, np.int32).tobytes()),
                                    parameters={"binary_data_output": True}), {}),
    "empty binary input": ("texts", framed(raw_tensor("IN", "BYTES", [0], b"")), {}),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_what_the_lean_way_takes_is_answered_as_the_general_way_does(case: str) -> None:
    model, body, path = TAKEN[case]
    dp = plane()
    assert lean_way(dp, body, model, **path) is not None  # the lean way answered it
    lean = answer(dp, body, model, **path)
    assert lean == answer(dp, body, model, lean=False, **path)
    assert lean[0] == 200
    counted = counts(dp, model)
    rows = {"rows": 3, "rows, binary": 2}.get(case, 1)
    assert counted["success"][0] == 3 and counted["inference_count"] == 3 * rows


def test_the_answer_holds_what_the_model_returned() -> None:
    status, _, body = answer(plane(), simple(id="x"))
    a, b = np.array(A), np.array(B)
    assert status == 200 and json.loads(body) == {"model_name": "simple", "model_version": "1", "id": "x", "outputs": [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": (a + b).tolist()},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": (a - b).tolist()}]}


@pytest.mark.parametrize("binary", [False, True], ids=["JSON", "binary"])
@pytest.mark.parametrize("result", GOOD_ANSWERS + WRONG_ANSWERS)
def test_every_answer_a_model_may_give_is_answered_and_counted_as_on_the_general_way(result: Any,
                                                                                      binary: bool) -> None:
    dp = plane(Answers("answers", result))
    body: Any = {"id": "x", "inputs": [tensor("IN", "FP32", [2], [1.5, -2.0])]}
    if binary:  # a binary input, every output asked for as binary data
        body = framed(raw_tensor("IN", "FP32", [2], np.array([1.5, -2.0], np.float32).tobytes()), id="x",
                      parameters={"binary_data_output": True})
    try:
        assert lean_way(dp, body, "answers") is not None  # the lean way answered it (through `finish` or not)
    except ModelFailure:  # or failed it, as the data plane's error
        assert counts(dp, "answers")["fail"][0] == 1
    dp = plane(Answers("answers", result))
    lean = answer(dp, body, "answers")
    after_lean = counts(dp, "answers")
    assert lean == answer(dp, body, "answers", lean=False)
    after_both = counts(dp, "answers")
    outcome = "success" if lean[0] == 200 else "fail"
    assert after_lean[outcome][0] == 1 and after_both[outcome][0] == 2
    assert dp.metrics is not None and not any(dp.metrics.pending.values())


def test_a_large_binary_answer_is_sent_in_parts_as_on_the_general_way() -> None:
    """Binary outputs of 64 KB or more are sent from the model's arrays (`BinaryParts`) on both ways."""
    values = np.arange(20_000, dtype=np.float32)
    body = framed(raw_tensor("IN", "FP32", [20_000], values.tobytes()), parameters={"binary_data_output": True})
    dp = plane(Answers("answers", lambda i: {"OUT": i["IN"] * 2}), max_tensor_elements=20_000)
    assert lean_way(dp, body, "answers") is not None
    lean = answer(dp, body, "answers", parts=True)
    assert lean == answer(dp, body, "answers", lean=False, parts=True) and lean[0] == 200
    assert np.array_equal(np.frombuffer(lean[2][-80_000:], np.float32), values * 2)
    route = tensor_answer(dp, dp.settings, INFER, dp.repository, False, LeanInfer(dp.pipeline, dp.settings))
    raw, headers = body.raw()
    assert isinstance(asyncio.run(route({"model_name": "answers"}, raw, headers, True)), BinaryParts)


def _swap(body: dict[str, Any], **item: Any) -> dict[str, Any]:
    body["inputs"][1] = {**body["inputs"][1], **item}
    return body


# Requests the lean way does not take: each is left to the general way, whose answer (or error) it keeps.
def _raw_swap(body: Framed, **item: Any) -> Framed:
    inputs = [dict(i) for i in body.header["inputs"]]
    inputs[1].update(item)
    return Framed({**body.header, "inputs": inputs}, body.data)


DECLINED: dict[str, tuple[str, Any]] = {
    "request parameters not an object": ("simple", simple(parameters=[])),
    "a request parameter the general way refuses": ("simple", simple(parameters={"triton_x": 1})),
    "a request parameter that is an object": ("simple", simple(parameters={"k": {}})),
    "binary_data_output not a boolean": ("simple", simple(parameters={"binary_data_output": 1})),
    "input parameters": ("simple", _swap(simple(), parameters={})),
    "input parameters beside data": ("simple", _swap(simple(), parameters={"binary_data_size": 64})),
    "binary input with its data null": ("simple", _swap(simple(), parameters={"binary_data_size": 64}, data=None)),
    "binary input without a binary part": ("simple", {"inputs": [simple()["inputs"][0], raw_tensor(
        "INPUT1", "INT32", [1, 16], np.array(B, np.int32).tobytes())[0]]}),
    "binary input short of bytes": ("simple", _raw_swap(binary_simple(), parameters={"binary_data_size": 65})),
    "bytes left after the last input": ("simple", Framed(binary_simple().header, binary_simple().data + b"\x00")),
    "binary_data_size a float": ("simple", _raw_swap(binary_simple(), parameters={"binary_data_size": 64.0})),
    "binary_data_size a boolean": ("simple", _raw_swap(binary_simple(), parameters={"binary_data_size": True})),
    "binary_data_size negative": ("simple", _raw_swap(binary_simple(), parameters={"binary_data_size": -1})),
    "binary input and shared memory": ("simple", _raw_swap(binary_simple(), parameters={
        "binary_data_size": 64, "shared_memory_region": "r"})),
    "binary data of the wrong size": ("simple", framed(simple()["inputs"][0], raw_tensor("INPUT1", "INT32", [1, 16],
                                                                                         b"\x00" * 60))),
    "BYTES binary data that does not decode": ("texts", framed(raw_tensor("IN", "BYTES", [1], b"\x09\x00\x00\x00a"))),
    "BOOL binary data that does not decode": ("flags", framed(raw_tensor("IN", "BOOL", [2], b"\x07\x00"))),
    "binary_data not a boolean": ("simple", simple(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": 1}}])),
    "other output parameters": ("simple", simple(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2}}])),
    "output parameters null": ("simple", simple(outputs=[{"name": "OUTPUT0", "parameters": None}])),
    "an output with another key": ("simple", simple(outputs=[{"name": "OUTPUT0", "x": 1}])),
    "shared memory": ("simple", _swap(simple(), parameters={"shared_memory_region": "r"})),
    "an id that is null": ("simple", simple(id=None)),
    "an id that is a number": ("simple", simple(id=5)),
    "another key": ("simple", simple(extra=1)),
    "outputs null": ("simple", simple(outputs=None)),
    "an output that is a name": ("simple", simple(outputs=["OUTPUT0"])),
    "unknown output": ("simple", simple(outputs=[{"name": "NO"}])),
    "repeated output": ("simple", simple(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}])),
    "unknown model": ("nothing", simple()),
    "wrong datatype": ("simple", _swap(simple(), datatype="FP32")),
    "wrong shape": ("simple", _swap(simple(), shape=[16, 1])),
    "a shape of floats": ("simple", _swap(simple(), shape=[1.0, 16.0])),
    "a shape of booleans": ("simple", _swap(simple(), shape=[True, 16])),
    "over the element limit": ("texts", {"inputs": [tensor("IN", "BYTES", [1001], ["a"] * 1001)]}),
    "data null": ("simple", _swap(simple(), data=None)),
    "no data": ("simple", {"inputs": [simple()["inputs"][0], {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
                                                              "parameters": {}}]}),
    "data of strings": ("simple", _swap(simple(), data=["a"] * 16)),
    "too little data": ("simple", _swap(simple(), data=B[:15])),
    "missing input": ("simple", {"inputs": simple()["inputs"][:1]}),
    "repeated input": ("simple", {"inputs": simple()["inputs"][:1] * 2}),
    "unknown input": ("simple", _swap(simple(), name="INPUTX")),
    "an input that is a list": ("simple", {"inputs": [simple()["inputs"][0], ["INPUT1"]]}),
    "inputs not a list": ("simple", {"inputs": {}}),
    "a body that is a list": ("simple", [simple()]),
    "rows over max_batch_size": ("rows", {"inputs": [tensor("INPUT0", "INT32", [5, 16], A * 5),
                                                     tensor("INPUT1", "INT32", [5, 16], B * 5)]}),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_what_the_lean_way_does_not_take_is_left_to_the_general_way(case: str) -> None:
    model, body = DECLINED[case]
    dp = plane()
    before = dp.statistics.snapshot()
    assert lean_way(dp, body, model) is None
    assert dp.statistics.snapshot() == before
    assert dp.metrics is not None and not any(dp.metrics.pending.values())
    assert answer(dp, body, model) == answer(dp, body, model, lean=False)


@pytest.mark.parametrize("body", [
    simple(parameters={"binary_data_output": True}),
    simple(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}]),
])
def test_binary_data_asked_for_without_the_extension_is_left_to_the_general_way(body: dict[str, Any]) -> None:
    dp = plane(extensions=[])  # the binary tensor data extension off: asking for binary data is refused (501)
    assert lean_way(dp, body) is None
    refused = answer(dp, body)
    assert refused == answer(dp, body, lean=False) and refused[0] == 501
    assert lean_way(dp, simple()) is not None  # JSON is still the lean way's


@pytest.mark.parametrize("body", [b"", b"{", b"[1,", b'{"inputs": []} x'])
def test_a_body_that_is_no_json_is_refused_as_before(body: bytes) -> None:
    dp = plane()
    refused = answer(dp, body)
    assert refused == answer(dp, body, lean=False) and refused[0] == 400
    assert answer(dp, body, "nothing")[0] == 404  # the model first, as always


def test_the_servers_app_takes_the_lean_way_for_the_common_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the app `serve` builds: the common request (JSON, and tritonclient's body of binary inputs and
    outputs, made by tritonclient itself) never reaches the general decoder; one with a key the protocol does not
    have does, with the same outputs."""
    import tritonclient.http as httpclient

    decoded = []
    general = handlers.decode_infer_request

    def counting(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return general(*args, **kwargs)

    monkeypatch.setattr(handlers, "decode_infer_request", counting)
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for given, values in zip(inputs, (A, B), strict=True):
        given.set_data_from_numpy(np.array([values], np.int32))  # binary_data=True: tritonclient's default
    outputs = [httpclient.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]  # binary too
    triton_body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs)
    assert header_length is not None and b'"binary_data_size":64' in triton_body

    async def main() -> list[Any]:
        repository = ModelRepository()
        repository.add(Simple())
        await repository.load_all()
        app = Assembly.build(repository, Settings()).rest_app()
        answers = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://oip") as client:
            for body in (simple(), simple(extra=1)):
                reply = await client.post("/v2/models/simple/infer", json=body)
                answers.append((reply.status_code, reply.json()["outputs"], len(decoded)))
            reply = await client.post("/v2/models/simple/infer", content=triton_body,
                                      headers={"Inference-Header-Content-Length": str(header_length)})
            result = httpclient.InferResult.from_response_body(
                reply.content, header_length=int(reply.headers["Inference-Header-Content-Length"]))
            answers.append((reply.status_code, [result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")],
                            len(decoded)))
        await repository.unload_all()
        return answers

    lean, general_way, triton = asyncio.run(main())
    assert lean[2] == 0 and general_way[2] == 1 and triton[2] == 1
    assert lean[:2] == general_way[:2] and lean[0] == 200
    a, b = np.array([A]), np.array([B])
    assert triton[0] == 200 and (triton[1][0] == a + b).all() and (triton[1][1] == a - b).all()


def test_a_data_plane_that_answers_inference_its_own_way_gets_every_request() -> None:
    """A `DataPlane` subclass that overrides `model_infer` is reached by the common request over both transports:
    neither lean way goes around it."""
    import grpc
    from oip.grpc import grpc_service_pb2 as pb
    from oip.grpc import grpc_service_pb2_grpc as rpc

    class Marking(DataPlane):
        async def model_infer(self, request: Any) -> Any:
            response = await super().model_infer(request)
            response.id = "marked"
            return response

    async def main() -> tuple[str, str]:
        repository = ModelRepository()
        repository.add(Simple())
        await repository.load_all()
        assembly = Assembly.build(repository, Settings(), dataplane=Marking)
        assert assembly.lean is None and Assembly.build(repository, Settings()).lean is not None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=assembly.rest_app()),
                                     base_url="http://oip") as client:
            rest = (await client.post("/v2/models/simple/infer", json=simple())).json()["id"]
        server = assembly.grpc_server()
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            message = pb.ModelInferRequest(model_name="simple")
            for name, values in (("INPUT0", A), ("INPUT1", B)):
                message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                message.raw_input_contents.append(np.array(values, np.int32).tobytes())
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await rpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=30)
        finally:
            server.stop(None)
        await repository.unload_all()
        return rest, reply.id

    assert asyncio.run(main()) == ("marked", "marked")
