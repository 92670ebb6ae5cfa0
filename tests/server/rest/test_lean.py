"""The lean way of a REST JSON inference request (`oip.server.rest.lean.JsonInfer`), in process.

Every request it takes must get exactly the answer the general way gives (the route's answer without it: status,
headers and body byte for byte), be counted as the general way counts it, and fail with the same error; every
request it does not take must be left untouched (None, nothing counted) and then answered or refused by the general
way as before. The server's app takes it for the common request only (the general decoder never called), and the
suite's REST tests over real sockets (golden cases, bad input, tritonclient, statistics) run through it too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest
from lean_models import GOOD_ANSWERS, WRONG_ANSWERS, Answers, Async, Batching, Flags, Rows, Simple, Texts
from oip.server import Assembly, DataPlane, Model, ModelFailure, ModelRepository, Settings
from oip.server.rest import handlers
from oip.server.rest.endpoints import ENDPOINTS
from oip.server.rest.handlers import tensor_answer
from oip.server.rest.lean import JsonInfer

A = list(range(16))
B = [3] * 16
INFER = next(e for e in ENDPOINTS if e.operation == "model_infer" and "model_version" not in e.path)


def plane(*models: Model) -> DataPlane:
    repository = ModelRepository()
    for model in (Simple(), Async(), Rows(), Batching(), Texts(), Flags(), *models):
        repository.add(model)
    asyncio.run(repository.load_all())
    return DataPlane(repository, Settings(max_tensor_elements=1000))


def tensor(name: str, datatype: str, shape: list[Any], data: Any, **more: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data, **more}


def simple(**fields: Any) -> dict[str, Any]:
    return {"inputs": [tensor("INPUT0", "INT32", [1, 16], A), tensor("INPUT1", "INT32", [1, 16], B)], **fields}


def answer(dp: DataPlane, body: Any, model: str = "simple", lean: bool = True, **path: str) -> tuple[Any, ...]:
    """The route's answer to `body` (a JSON value, or bytes as they are): status, headers and body."""
    route = tensor_answer(dp, dp.settings, INFER, dp.repository, False, JsonInfer(dp.pipeline) if lean else None)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = asyncio.run(route({"model_name": model, **path}, raw, [], False))
    return response.status_code, response.raw_headers, bytes(response.body)


def lean_way(dp: DataPlane, body: Any, model: str = "simple", **path: str) -> Any:
    """What the lean way itself makes of `body`: an answer, or None."""
    return asyncio.run(JsonInfer(dp.pipeline)({"model_name": model, **path}, body, None))


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
    assert counted["success"][0] == 3 and counted["inference_count"] == 3 * (3 if case == "rows" else 1)


def test_the_answer_holds_what_the_model_returned() -> None:
    status, _, body = answer(plane(), simple(id="x"))
    a, b = np.array(A), np.array(B)
    assert status == 200 and json.loads(body) == {"model_name": "simple", "model_version": "1", "id": "x", "outputs": [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": (a + b).tolist()},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": (a - b).tolist()}]}


@pytest.mark.parametrize("result", GOOD_ANSWERS + WRONG_ANSWERS)
def test_every_answer_a_model_may_give_is_answered_and_counted_as_on_the_general_way(result: Any) -> None:
    dp = plane(Answers("answers", result))
    body = {"id": "x", "inputs": [tensor("IN", "FP32", [2], [1.5, -2.0])]}
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


def _swap(body: dict[str, Any], **item: Any) -> dict[str, Any]:
    body["inputs"][1] = {**body["inputs"][1], **item}
    return body


# Requests the lean way does not take: each is left to the general way, whose answer (or error) it keeps.
DECLINED: dict[str, tuple[str, Any]] = {
    "request parameters": ("simple", simple(parameters={})),
    "input parameters": ("simple", _swap(simple(), parameters={})),
    "binary output asked for": ("simple", simple(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])),
    "binary input": ("simple", _swap(simple(), parameters={"binary_data_size": 64}, data=None)),
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


@pytest.mark.parametrize("body", [b"", b"{", b"[1,", b'{"inputs": []} x'])
def test_a_body_that_is_no_json_is_refused_as_before(body: bytes) -> None:
    dp = plane()
    refused = answer(dp, body)
    assert refused == answer(dp, body, lean=False) and refused[0] == 400
    assert answer(dp, body, "nothing")[0] == 404  # the model first, as always


def test_the_servers_app_takes_the_lean_way_for_the_common_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the app `serve` builds: the common request never reaches the general decoder; one with request
    parameters does, with the same outputs."""
    decoded = []
    general = handlers.decode_infer_request

    def counting(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return general(*args, **kwargs)

    monkeypatch.setattr(handlers, "decode_infer_request", counting)

    async def main() -> list[Any]:
        repository = ModelRepository()
        repository.add(Simple())
        await repository.load_all()
        app = Assembly.build(repository, Settings()).rest_app()
        answers = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://oip") as client:
            for body in (simple(), simple(parameters={"k": "v"})):
                reply = await client.post("/v2/models/simple/infer", json=body)
                answers.append((reply.status_code, reply.json()["outputs"], len(decoded)))
        await repository.unload_all()
        return answers

    lean, general_way = asyncio.run(main())
    assert lean[2] == 0 and general_way[2] == 1
    assert lean[:2] == general_way[:2] and lean[0] == 200


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
