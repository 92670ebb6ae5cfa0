"""Every way an inference runs is checked, timed and logged by the same code: one tensor-header check and its limit
on REST, gRPC and the lean gRPC way; the lean way's moments reported as the phases every observer reads; one
access log over both transports. In process, no sockets."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import orjson
import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.server import Assembly, DataPlane, Model, ModelRepository, OipError, Settings, TensorSpec, TooLarge
from oip.server.grpc import INFER, Servicer, decode_infer_request
from oip.server.grpc.in_thread import NOT_HERE, UnaryInfer, in_thread
from oip.server.grpc.servicer import observer
from oip.server.model import DynamicBatching
from oip.server.rest import decode_infer_request as decode_rest
from recorded import Recorder

Arrays = dict[str, npt.NDArray[Any]]


class Echo(Model):
    """FP32 [-1] in and out, after `pause` seconds in the model."""

    name = "echo"
    inputs = (TensorSpec("IN", "FP32", [-1]),)
    outputs = (TensorSpec("OUT", "FP32", [-1]),)
    pause = 0.0

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        time.sleep(self.pause)
        return {"OUT": inputs["IN"]}


class Fixed(Model):
    """INT32 [1, 16] in and out: every request has 16 elements."""

    name = "fixed"
    inputs = (TensorSpec("IN", "INT32", [1, 16]),)
    outputs = (TensorSpec("OUT", "INT32", [1, 16]),)

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return {"OUT": inputs["IN"]}


def plane(settings: Settings) -> DataPlane:
    repository = ModelRepository()
    repository.add(Echo())
    repository.add(Fixed())
    asyncio.run(repository.load_all())
    return DataPlane(repository, settings)


def grpc_request(model: str, array: npt.NDArray[Any], **fields: Any) -> Any:
    message = pb.ModelInferRequest(model_name=model, **fields)
    message.inputs.add(name="IN", datatype="FP32" if array.dtype == np.float32 else "INT32", shape=array.shape)
    message.raw_input_contents.append(array.tobytes())
    return message


def rest_body(shape: list[int]) -> bytes:
    count = int(np.prod(shape))
    return orjson.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": shape, "data": [1.0] * count}]})


def test_one_header_check_holds_at_its_limit_on_every_way() -> None:
    """`max_tensor_elements` elements pass on every way; one more is TOO_LARGE with the same message over REST and
    gRPC, and the lean way leaves it to the general way (which refuses it so). A fixed declared shape over the
    limit is refused too, whichever way the request would take."""
    settings = Settings(max_tensor_elements=4)
    dp = plane(settings)
    lean = UnaryInfer(dp.pipeline, settings, INFER)
    at, over = np.ones(4, dtype=np.float32), np.ones(5, dtype=np.float32)

    assert decode_rest(rest_body([4]), None, settings)[0].inputs[0].shape == [4]
    assert decode_infer_request(grpc_request("echo", at), settings).inputs[0].shape == [4]
    assert lean(grpc_request("echo", at)) is not None
    with pytest.raises(TooLarge) as rest:
        decode_rest(rest_body([5]), None, settings)
    with pytest.raises(TooLarge) as grpc:
        decode_infer_request(grpc_request("echo", over), settings)
    assert rest.value.message == grpc.value.message == (
        "input 'IN': shape [5] has 5 elements, more than the 4 allowed per tensor")
    before = dp.statistics.snapshot()
    assert lean(grpc_request("echo", over)) is None  # the general way's to refuse: nothing happened
    assert dp.statistics.snapshot() == before

    fixed = np.zeros((1, 16), dtype=np.int32)
    assert lean(grpc_request("fixed", fixed)) is None
    with pytest.raises(TooLarge, match="16 elements, more than the 4"):
        decode_infer_request(grpc_request("fixed", fixed), settings)
    roomy = Settings(max_tensor_elements=16)
    assert UnaryInfer(plane(roomy).pipeline, roomy, INFER)(grpc_request("fixed", fixed)) is not None


def test_the_lean_way_reports_its_phases_to_every_observer_alike() -> None:
    """A lean request that waits for the only model slot, then runs the model for a while: its queue and its
    compute_infer say so, and the statistics (which take its moments as they are) count exactly the durations of
    the record any other observer gets from them."""
    settings = Settings(model_threads=1)
    dp = plane(settings)
    seen = Recorder()
    dp.observers.append(seen)
    lean = UnaryInfer(dp.pipeline, settings, INFER)
    Echo.pause = 0.03
    replies: list[Any] = []
    slots = dp.pipeline.model_slots
    try:
        slots.take()  # the only slot, held for a while: the request waits in the queue
        worker = threading.Thread(target=lambda: replies.append(lean(grpc_request("echo", np.ones(2, np.float32)))))
        worker.start()
        deadline = time.monotonic() + 10
        while not dp.repository.inflight().get(("echo", "1")) and time.monotonic() < deadline:
            time.sleep(0.001)  # until the request holds its model: then it waits for the slot
        time.sleep(0.08)
        slots.give(None)
        worker.join(10)
    finally:
        Echo.pause = 0.0
    assert replies and replies[0] is not None
    (record,) = seen.requests
    assert record.ok and record.queue_ns >= 40e6 and record.compute_infer_ns >= 25e6
    assert record.compute_input_ns < record.queue_ns
    assert [span.phase for span in record.spans] == ["compute_input", "queue", "compute_infer", "compute_output"]
    assert record.total_ns == (record.queue_ns + record.compute_input_ns + record.compute_infer_ns
                               + record.compute_output_ns)
    counted = dp.statistics.snapshot()[("echo", "1")]
    assert counted["success"] == (1, record.total_ns)
    assert counted["queue"] == (1, record.queue_ns) and counted["compute_input"] == (1, record.compute_input_ns)
    assert counted["compute_infer"] == (1, record.compute_infer_ns)
    assert counted["compute_output"] == (1, record.compute_output_ns)
    (execution,) = seen.executions
    assert (execution.batch_size, execution.compute_infer_ns) == (1, record.compute_infer_ns)


class Rows(Model):
    """INT32 rows of [16] in and out, batched: a lone request's batch runs once its delay of 30 ms is over."""

    name = "rows"
    inputs = (TensorSpec("IN", "INT32", [16]),)
    outputs = (TensorSpec("OUT", "INT32", [16]),)
    max_batch_size = 4
    dynamic_batching = DynamicBatching(max_queue_delay_microseconds=30_000)

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return {"OUT": inputs["IN"] + 1}


def test_a_lean_request_of_a_dynamic_batch_reports_its_phases_to_every_observer_alike() -> None:
    """A lean request that waits for its batch to fill until its delay is over: its queue says so, and the
    statistics (which take its moments as they are) count exactly the durations of the record any other observer
    gets from them, the merge of its batch in compute_input."""
    settings = Settings()
    repository = ModelRepository()
    repository.add(Rows())
    asyncio.run(repository.load_all())
    dp = DataPlane(repository, settings)
    seen = Recorder()
    dp.observers.append(seen)
    lean = UnaryInfer(dp.pipeline, settings, INFER)
    message = pb.ModelInferRequest(model_name="rows")
    message.inputs.add(name="IN", datatype="INT32", shape=[2, 16])
    message.raw_input_contents.append(np.arange(32, dtype=np.int32).tobytes())
    reply = pb.ModelInferResponse.FromString(lean(message))
    assert np.frombuffer(reply.raw_output_contents[0], np.int32).tolist() == list(range(1, 33))
    (record,) = seen.requests
    assert record.ok and record.batch_size == 2 and record.queue_ns >= 25e6
    assert [span.phase for span in record.spans] == [
        "compute_input", "queue", "compute_input", "compute_infer", "compute_output"]
    assert record.total_ns == (record.queue_ns + record.compute_input_ns + record.compute_infer_ns
                               + record.compute_output_ns)
    counted = dp.statistics.snapshot()[("rows", "1")]
    assert counted["success"] == (1, record.total_ns) and counted["inference_count"] == 2
    assert counted["queue"] == (1, record.queue_ns) and counted["compute_input"] == (1, record.compute_input_ns)
    assert counted["compute_infer"] == (1, record.compute_infer_ns)
    assert counted["compute_output"] == (1, record.compute_output_ns)
    (execution,) = seen.executions
    assert execution.batch_size == 2


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def test_one_access_log_for_both_transports(caplog: pytest.LogCaptureFixture) -> None:
    """An answered request over REST and one over gRPC each write one line of the access log, with the same
    fields (REST's method, path and client besides), the sizes as received and sent."""
    repository = ModelRepository()
    repository.add(Echo())
    asyncio.run(repository.load_all())
    settings = Settings(access_log=True, metrics=False)
    server = Assembly.build(repository, settings)
    body = rest_body([2])

    async def rest() -> None:
        transport = httpx.ASGITransport(app=server.rest_app(), client=("192.0.2.7", 4711))
        async with httpx.AsyncClient(transport=transport, base_url="http://oip") as client:
            answer = await client.post("/v2/models/echo/infer", content=body)
            assert answer.status_code == 200, answer.text

    service = Servicer.service
    handle = in_thread(server.dataplane.pipeline, settings, Servicer(server.dataplane, settings).infer, "ModelInfer",
                       observer(service, None, settings.access_log), False)
    message = grpc_request("echo", np.ones(2, dtype=np.float32))
    with caplog.at_level(logging.INFO, logger="oip.access"):
        asyncio.run(rest())
        reply = handle(message, _Context())
    assert reply is not NOT_HERE
    lines = [record for record in caplog.records if record.name == "oip.access"]
    assert len(lines) == 2
    rest_line, grpc_line = (record.access for record in lines)
    assert {key: rest_line[key] for key in rest_line if key != "duration_ms"} == {
        "transport": "rest", "operation": "model_infer", "method": "POST", "path": "/v2/models/echo/infer",
        "status": 200, "request_bytes": len(body), "response_bytes": rest_line["response_bytes"],
        "client": "192.0.2.7",
    }
    assert rest_line["response_bytes"] > 0
    assert {key: grpc_line[key] for key in grpc_line if key != "duration_ms"} == {
        "transport": "grpc", "operation": "ModelInfer", "status": "OK", "request_bytes": message.ByteSize(),
        "response_bytes": len(reply) if isinstance(reply, bytes) else reply.ByteSize(),
    }
    assert lines[0].getMessage().startswith('192.0.2.7 "POST /v2/models/echo/infer" 200 ')
    assert lines[1].getMessage().startswith(f'"{service}/ModelInfer" OK ')
    assert all(isinstance(record.access["duration_ms"], float) for record in lines)  # type: ignore[attr-defined]


def test_a_failure_on_the_lean_way_is_the_same_error_and_record_as_on_the_general_way() -> None:
    """A model that raises: the lean way raises the general way's error, and the record every observer gets has
    its kind and the phases it reached (the model's, not the outputs')."""
    class Failing(Echo):
        name = "failing"

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            raise RuntimeError("no")

    repository = ModelRepository()
    repository.add(Failing())
    asyncio.run(repository.load_all())
    settings = Settings()
    dp = DataPlane(repository, settings)
    seen = Recorder()
    dp.observers.append(seen)
    message = grpc_request("failing", np.ones(2, dtype=np.float32))
    with pytest.raises(OipError) as lean:
        UnaryInfer(dp.pipeline, settings, INFER)(message)
    with pytest.raises(OipError) as general:
        dp.pipeline.infer_in_thread(decode_infer_request(message, settings))
    assert (lean.value.kind, lean.value.message) == (general.value.kind, general.value.message)
    assert [(r.error_kind, [s.phase for s in r.spans]) for r in seen.requests] == [
        (general.value.kind, ["compute_input", "queue", "compute_infer"])] * 2
