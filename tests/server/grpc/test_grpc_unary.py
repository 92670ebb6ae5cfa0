"""The lean way of unary ModelInfer in the gRPC thread (`oip.server.grpc.in_thread.UnaryInfer`, over
`oip.server.core.lean`), in process.

Every request it takes must get exactly the answer the general way gives (`Pipeline.infer_in_thread` and the
transport's encoder: compared as parsed messages), be counted exactly as the general way counts it (statistics
extension, metrics), and fail with the same error; every request it does not take must be left untouched (None,
nothing counted) for the general way to answer or refuse. It takes raw and typed contents of every datatype (BYTES
and BOOL too), request parameters, rows of a model that batches, and requests to a model under dynamic batching
(joining the event loop's batches). Over real sockets the suite's gRPC tests (golden cases, bad input,
tritonclient, statistics, metrics) run through it too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from lean_models import GOOD_ANSWERS, WRONG_ANSWERS, Answers, Arrays, Async, Batching, Flags, Rows, Simple, Texts
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.server import DataPlane, Model, ModelFailure, ModelRepository, OipError, Settings
from oip.server.grpc import INFER, decode_infer_request, encode_infer_response
from oip.server.grpc.in_thread import UnaryInfer
from oip.server.model import DynamicBatching, TensorSpec
from oip.server.observe.events import ExecutionRecord, InferenceRecord, Observer

TIMEOUT = 30.0
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def plane(*models: Model, settings: Settings | None = None) -> DataPlane:
    repository = ModelRepository()
    for model in (Simple(), Async(), Batching(), Flags(), Texts(), Rows(), *models):
        repository.add(model)
    run(repository.load_all())
    return DataPlane(repository, settings)


def request(model: str = "simple", arrays: dict[str, Any] | None = None, **fields: Any) -> Any:
    message = pb.ModelInferRequest(model_name=model, **fields)
    for name, array in (arrays if arrays is not None else {"INPUT0": A, "INPUT1": B}).items():
        array = np.asarray(array)
        datatype = {"int32": "INT32", "float32": "FP32", "bool": "BOOL", "object": "BYTES"}[array.dtype.name]
        message.inputs.add(name=name, datatype=datatype, shape=array.shape)
        message.raw_input_contents.append(codec.to_raw(array, datatype) if datatype == "BYTES" else array.tobytes())
    return message


def general(dp: DataPlane, message: Any) -> Any:
    """The general way's answer (a message), or the error it raises."""
    try:
        return encode_infer_response(dp.pipeline.infer_in_thread(decode_infer_request(message, dp.settings)))
    except OipError as exc:
        return exc


def lean_way(dp: DataPlane) -> UnaryInfer:
    return UnaryInfer(dp.pipeline, dp.settings, INFER)


def parsed(reply: Any) -> Any:
    return pb.ModelInferResponse.FromString(reply) if isinstance(reply, bytes) else reply


def counts(dp: DataPlane, name: str) -> dict[str, Any]:
    return dp.statistics.snapshot().get((name, "1"), {})


@pytest.mark.parametrize("fields", [
    {},
    {"id": "r-7"},
    {"outputs": [pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT1")]},
    {"model_version": "1", "outputs": [pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT1"),
                                       pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0")]},
])
def test_the_lean_answer_is_the_general_answer(fields: dict[str, Any]) -> None:
    dp = plane()
    lean = lean_way(dp)
    reply = lean(request(**fields))
    assert isinstance(reply, bytes)  # the lean way wrote it
    assert parsed(reply) == general(dp, request(**fields))
    out = parsed(reply)
    assert np.array_equal(np.frombuffer(out.raw_output_contents[0], np.int32).reshape(1, 16),
                          A + B if out.outputs[0].name == "OUTPUT0" else A - B)


def test_each_request_gets_the_outputs_it_asks_for_in_its_order_request_after_request() -> None:
    """The lean way keeps the outputs wanted by the names asked for (clients ask for the same ones again and
    again): another order, another set, a name given twice (the general way's to refuse) are each told apart."""
    dp = plane()
    lean = lean_way(dp)
    for names in (["OUTPUT1", "OUTPUT0"], ["OUTPUT0", "OUTPUT1"], ["OUTPUT1"], ["OUTPUT1", "OUTPUT0"],
                  ["OUTPUT0", "OUTPUT0"], ["OUTPUT0"], ["OUTPUT0", "OUTPUT0"]):
        message = request(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=name) for name in names])
        reply = lean(message)
        if len(set(names)) < len(names):
            assert reply is None, names
            continue
        assert isinstance(reply, bytes) and [out.name for out in parsed(reply).outputs] == names
        assert parsed(reply) == general(dp, message)


@pytest.mark.parametrize("answer", GOOD_ANSWERS)
def test_every_answer_a_model_may_give_is_answered_as_the_general_way_does(answer: Any) -> None:
    dp = plane(Answers("answers", answer))
    message = request("answers", {"IN": np.array([1.5, -2.0], np.float32)}, id="x")
    assert parsed(lean_way(dp)(message)) == general(dp, message)


@pytest.mark.parametrize("answer", WRONG_ANSWERS)
def test_a_wrong_answer_fails_as_on_the_general_way_and_is_counted_once(answer: Any) -> None:
    dp = plane(Answers("answers", answer))
    message = request("answers", {"IN": np.array([1.5, -2.0], np.float32)})
    with pytest.raises(ModelFailure) as caught:
        lean_way(dp)(message)
    assert counts(dp, "answers")["fail"][0] == 1
    expected = general(dp, message)
    assert isinstance(expected, ModelFailure) and caught.value.message == expected.message
    assert counts(dp, "answers")["fail"][0] == 2 and counts(dp, "answers")["success"][0] == 0
    assert dp.metrics is not None
    failures = {reason: n for (model, _, reason), n in dp.metrics.failures.items() if model == "answers"}
    assert failures == {"BACKEND": 2}
    assert dp.metrics.pending[(("model", "answers"), ("version", "1"))] == 0


def _params(message: Any, where: Any) -> Any:
    where.parameters["k"].string_param = "v"
    return message


def _contents(message: Any) -> Any:
    del message.raw_input_contents[1]
    message.inputs[1].contents.int_contents.extend(B.ravel().tolist())
    return message


def _shared_memory(message: Any) -> Any:
    message.inputs[1].parameters["shared_memory_region"].string_param = "r"
    del message.raw_input_contents[1]
    return message


def _edit(change: Callable[[Any], Any]) -> Any:
    return change(request())


def _every_contents(message: Any) -> Any:
    del message.raw_input_contents[:]
    message.inputs[0].contents.int_contents.extend(A.ravel().tolist())
    message.inputs[1].contents.int_contents.extend(B.ravel().tolist())
    return message


def _reserved(message: Any) -> Any:
    message.parameters["triton_secret"].bool_param = True
    return message


TEXT = np.array([b"ab c", "d\u00e9f".encode(), b""], dtype=object)


def _texts_with_parameters() -> Any:
    message = request("texts", {"IN": TEXT})
    return _params(message, message)
# Requests the lean way takes: each must get the general way's answer.
TAKEN = {
    "request parameters": lambda: _edit(lambda m: _params(m, m)),
    "typed contents": lambda: _edit(_every_contents),
    "BOOL input": lambda: request("flags", {"IN": np.array([True, False])}),
    "BYTES in and out": lambda: request("texts", {"IN": TEXT}, id="t"),
    "BYTES with parameters": lambda: _texts_with_parameters(),
    "rows of a model that batches": lambda: request("rows", {"INPUT0": np.tile(A, (3, 1)),
                                                             "INPUT1": np.tile(B, (3, 1))}),
    "dynamic batching": lambda: request("batching", {"INPUT0": A, "INPUT1": B}),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_what_the_lean_way_now_takes_is_answered_as_the_general_way_does(case: str) -> None:
    dp = plane()
    message = TAKEN[case]()
    reply = lean_way(dp)(message)
    assert reply is not None, case  # the lean way answered it (response parameters: through the general encoder)
    assert parsed(reply) == general(dp, message)
    counted = counts(dp, message.model_name)
    assert counted["success"][0] == 2 and counted["inference_count"] == 2 * (3 if case.startswith("rows") else 1)


class Names(Simple):
    """`simple`'s inputs; answers the names of the inputs it was given, in the order it was given them."""

    name = "names"
    outputs = (TensorSpec("OUT", "BYTES", [-1]),)

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return {"OUT": np.array([name.encode() for name in inputs], dtype=object)}


@pytest.mark.parametrize("order", [["INPUT0", "INPUT1"], ["INPUT1", "INPUT0"]])
def test_the_model_is_given_its_inputs_in_declared_order_on_either_way(order: list[str]) -> None:
    dp = plane(Names())
    message = request("names", {name: {"INPUT0": A, "INPUT1": B}[name] for name in order})
    lean, general_answer = parsed(lean_way(dp)(message)), general(dp, message)
    assert codec.from_raw(lean.raw_output_contents[0], "BYTES", [2]).tolist() == [b"INPUT0", b"INPUT1"]
    assert lean == general_answer


def test_the_model_sees_the_request_parameters_on_the_lean_way() -> None:
    dp = plane()
    message = request("texts", {"IN": TEXT})
    message.parameters["k"].string_param = "v"
    message.parameters["n"].int64_param = 3
    answer = parsed(lean_way(dp)(message))
    assert {k: v.WhichOneof("parameter_choice") for k, v in answer.parameters.items()} == {
        "k": "string_param", "n": "int64_param"}
    assert (answer.parameters["k"].string_param, answer.parameters["n"].int64_param) == ("v", 3)
    assert codec.from_raw(answer.raw_output_contents[0], "BYTES", [3]).tolist() == [b"AB C", "D\u00e9F".encode(), b""]


def test_parameters_without_the_parameters_extension_are_the_general_ways_to_refuse() -> None:
    settings = Settings(extensions=["binary_tensor_data", "statistics", "model_configuration"])
    dp = plane(settings=settings)
    message = _edit(lambda m: _params(m, m))
    assert lean_way(dp)(message) is None
    assert isinstance(general(dp, message), OipError)


DECLINED = {
    "reserved request parameter": lambda: _edit(_reserved),
    "raw and typed contents": lambda: _edit(_contents),
    "contents in another datatype's field": lambda: _edit(
        lambda m: _every_contents(m).inputs[0].contents.fp32_contents.append(1.0) or m),
    "BOOL byte that is no boolean": lambda: _bool_byte(),
    "BYTES truncated": lambda: _bytes_truncated(),
    "input parameters": lambda: _edit(lambda m: _params(m, m.inputs[0])),
    "output parameters": lambda: _edit(lambda m: _params(m, m.outputs.add(name="OUTPUT0"))),
    "shared memory": lambda: _edit(_shared_memory),
    "unknown model": lambda: request("nothing"),
    "unknown version": lambda: request(model_version="7"),
    "wrong datatype": lambda: request(arrays={"INPUT0": A, "INPUT1": B.astype(np.float32)}),
    "wrong shape": lambda: request(arrays={"INPUT0": A, "INPUT1": B.reshape(16, 1)}),
    "missing input": lambda: request(arrays={"INPUT0": A}),
    "unknown input": lambda: request(arrays={"INPUT0": A, "INPUTX": B}),
    "an input named twice": lambda: _edit(lambda m: setattr(m.inputs[1], "name", "INPUT0") or m),
    "raw entry too short": lambda: _edit(lambda m: m.raw_input_contents.__setitem__(1, b"\0" * 8) or m),
    "one raw entry too many": lambda: _edit(lambda m: m.raw_input_contents.append(b"") or m),
    "unknown output": lambda: request(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="NO")]),
    "repeated output": lambda: request(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT0")] * 2),
    "async model": lambda: request("async_simple"),
    "rows over max_batch_size": lambda: request("rows", {"INPUT0": np.tile(A, (5, 1)), "INPUT1": np.tile(B, (5, 1))}),
    "rows that differ between inputs": lambda: request("rows", {"INPUT0": np.tile(A, (2, 1)),
                                                                "INPUT1": np.tile(B, (3, 1))}),
    "negative dimensions": lambda: request("answers", {"IN": np.zeros(0, np.float32)}),
}


def _bool_byte() -> Any:
    message = request("flags", {"IN": np.array([True, False])})
    message.raw_input_contents[0] = b"\x02\x00"
    return message


def _bytes_truncated() -> Any:
    message = request("texts", {"IN": TEXT})
    message.raw_input_contents[0] = message.raw_input_contents[0][:-1] + b"\xff\xff"
    return message


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_what_the_lean_way_does_not_take_is_left_untouched(case: str) -> None:
    dp = plane(Answers("answers", lambda i: {"OUT": i["IN"]}))
    message = DECLINED[case]()
    if case == "negative dimensions":
        message.inputs[0].shape[:] = [-2]
    before = dp.statistics.snapshot()
    assert lean_way(dp)(message) is None
    assert dp.statistics.snapshot() == before
    assert dp.metrics is not None and not any(dp.metrics.pending.values())


def test_any_observer_is_told_on_the_lean_way_as_on_the_general_way() -> None:
    """An observer of its own (not one the server makes) is told about a request the lean way answers, and one
    it fails, exactly what the general way tells it: the lean way reports through the observers' one interface."""
    dp = plane(Answers("failing", lambda i: 1 / 0))
    lean = lean_way(dp)

    class Seen(Observer):
        def __init__(self) -> None:
            self.told: list[tuple[Any, ...]] = []

        def request_finished(self, record: InferenceRecord) -> None:
            self.told.append(("request", record.model, record.version, record.batch_size, record.error_kind,
                              [span.phase for span in record.spans], record.total_ns > 0))

        def execution_finished(self, record: ExecutionRecord) -> None:
            self.told.append(("execution", record.model, record.version, record.batch_size))

    seen = Seen()
    dp.observers.append(seen)
    assert lean(request(id="lean")) is not None
    lean_told = list(seen.told)
    general(dp, request(id="general"))
    assert lean_told and seen.told[len(lean_told):] == lean_told
    seen.told.clear()
    failing = request("failing", {"IN": np.ones(2, dtype=np.float32)})
    with pytest.raises(ModelFailure):
        lean(failing)
    lean_told = list(seen.told)
    assert isinstance(general(dp, failing), ModelFailure)
    assert lean_told and seen.told[len(lean_told):] == lean_told
    dp.observers.remove(seen)
    assert lean(request()) is not None


class Peeking(Simple):
    """Simple, noting what the OpenTelemetry API and the server's timer see as current while it runs."""

    name = "peeking"

    def load(self) -> None:
        self.seen: list[tuple[Any, Any]] = []

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        from oip.server.observe.events import current
        from opentelemetry import trace

        self.seen.append((trace.get_current_span().get_span_context(), current()))
        return super().infer(inputs, parameters)


def test_tracing_takes_the_lean_way_with_the_general_ways_spans() -> None:
    """A traced request takes the lean way: the same answer, and the same spans as the general way gives it (the
    caller's trace, the request span's attributes and status, one child per phase in the same order, inside the
    request's time); the request's span is OpenTelemetry's current one while the model runs, and not after; a
    failure's span says so and has the phases it reached."""
    import secrets

    from oip.server.observe import otlp, tracing
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    peeking = Peeking()
    dp = plane(peeking, Answers("failing", lambda i: 1 / 0))
    observer = tracing.Tracing(TracerProvider(), None, InstrumentationScope("oip.server"), lambda *sent: True)
    dp.observers.append(observer)
    lean = lean_way(dp)
    try:
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        caller = {"traceparent": f"00-{trace_id}-{parent}-01"}
        reply = lean(request("peeking", id="lean"), caller)
        assert reply is not None  # the lean way answered
        assert trace.get_current_span().get_span_context().is_valid is False  # nothing left current here
        decoded = decode_infer_request(request("peeking", id="lean"), dp.settings)
        decoded.trace, decoded.transport = caller, "grpc"
        assert parsed(reply) == encode_infer_response(dp.pipeline.infer_in_thread(decoded))
        finished = list(observer.queue)
        assert len(finished) == 2
        ids = iter(range(1, 1000))
        lean_spans, general_spans = (otlp.spans_of(f, ids) for f in finished[:2])
        assert [s.name for s in lean_spans] == [s.name for s in general_spans] == [
            "ModelInfer peeking", "compute_input", "queue", "compute_infer", "compute_output"]
        for ours, theirs in zip(lean_spans, general_spans, strict=True):
            assert ours.trace_id == theirs.trace_id == int(trace_id, 16)
            assert (ours.server, ours.status, ours.message, ours.trace_state, ours.remote) == (
                theirs.server, theirs.status, theirs.message, theirs.trace_state, theirs.remote)
            assert ours.start_ns <= ours.end_ns
        request_span = lean_spans[0]
        assert request_span.parent_id == int(parent, 16) and request_span.remote
        assert dict(request_span.attributes) == dict(general_spans[0].attributes) == {
            "model_name": "peeking", "model_version": "1", "request_id": "lean", "transport": "grpc", "status": "OK"}
        for phase in lean_spans[1:]:
            assert phase.parent_id == request_span.span_id
            assert request_span.start_ns <= phase.start_ns <= phase.end_ns <= request_span.end_ns
        assert [b.start_ns for b in lean_spans[2:]] == [a.end_ns for a in lean_spans[1:-1]]  # back to back
        # While the model ran, the request's span and timer were the current ones.
        context, timer = peeking.seen[0]
        assert (context.trace_id, context.span_id) == (request_span.trace_id, request_span.span_id)
        assert timer is not None and timer.request_id == "lean"

        observer.queue.clear()
        with pytest.raises(ModelFailure):
            lean(request("failing", {"IN": np.array([1.5], np.float32)}, id="broken"), None)
        (failed,) = observer.queue
        spans = otlp.spans_of(failed, ids)
        assert [s.name for s in spans] == ["ModelInfer failing", "compute_input", "queue", "compute_infer"]
        assert spans[0].status == 2 and "division by zero" in spans[0].message and spans[0].parent_id == 0
        assert dict(spans[0].attributes)["status"] == "MODEL_FAILURE"
        assert trace.get_current_span().get_span_context().is_valid is False
    finally:
        observer.shutdown()


def test_statistics_and_metrics_count_the_lean_way_as_the_general_way() -> None:
    lean_dp, general_dp = plane(), plane()
    lean = lean_way(lean_dp)
    for _ in range(5):
        lean(request())
        general(general_dp, request())
    a, b = counts(lean_dp, "simple"), counts(general_dp, "simple")
    assert {k: v[0] if isinstance(v, tuple) else v for k, v in a.items()} == {
        k: v[0] if isinstance(v, tuple) else v for k, v in b.items()}
    assert a["success"][0] == 5 and a["execution_count"] == 5 and a["inference_count"] == 5
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert a[phase][1] > 0
    assert a["success"][1] >= a["compute_input"][1] + a["compute_infer"][1] + a["compute_output"][1]
    proto = lean_dp.statistics.to_proto("simple", "1")
    assert [(s.batch_size, s.compute_infer.count) for s in proto.batch_stats] == [(1, 5)]
    assert proto.last_inference > 0
    key = (("model", "simple"), ("version", "1"))
    assert [dp.metrics.pending[key] for dp in (lean_dp, general_dp) if dp.metrics is not None] == [0, 0]


def histogram(dp: DataPlane, model: str) -> tuple[list[float], float]:
    """The latency histogram of `model` as the metrics give it: the cumulative bucket counts (+Inf's last), the sum."""
    assert dp.metrics is not None
    samples = [s for f in dp.metrics.families() for s in f.samples if s.labels.get("model") == model]
    buckets = [s.value for s in samples if s.name == "nv_inference_request_duration_seconds_bucket"]
    (total,) = [s.value for s in samples if s.name == "nv_inference_request_duration_seconds_sum"]
    return buckets, total


def test_the_lean_way_puts_each_request_in_the_latency_bucket_the_general_way_does() -> None:
    """A model that takes 20 ms, histogram bounds of 5 ms and 2 s: each request, either way, is in the middle
    bucket, and the durations the histogram adds up are those the statistics counted, within the time the test
    spent calling."""
    def sleepy() -> Model:
        return Answers("sleepy", lambda inputs: time.sleep(0.02) or {"OUT": inputs["IN"]})

    settings = Settings(metrics_buckets=(0.005, 2.0))
    lean_dp, general_dp = plane(sleepy(), settings=settings), plane(sleepy(), settings=settings)
    lean = lean_way(lean_dp)
    message = request("sleepy", {"IN": np.ones(4, np.float32)})
    walls = []
    for call in (lambda: lean(message), lambda: general(general_dp, message)):
        began = time.perf_counter_ns()
        replies = [call() for _ in range(5)]
        walls.append(time.perf_counter_ns() - began)
        assert all(isinstance(r, (bytes, pb.ModelInferResponse)) for r in replies), replies
    for dp, wall in zip((lean_dp, general_dp), walls, strict=True):
        success = dp.statistics.to_proto("sleepy", "1").inference_stats.success
        assert success.count == 5 and 5 * 20_000_000 <= success.ns <= wall, (success, wall)
        buckets, total = histogram(dp, "sleepy")
        assert buckets == [0, 5, 5], buckets
        assert total == pytest.approx(success.ns / 1e9, rel=1e-9)


def test_the_model_threads_bound_the_lean_way() -> None:
    active, most = 0, 0
    lock = threading.Lock()

    def answer(inputs: Arrays) -> Any:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
        time.sleep(0.02)
        with lock:
            active -= 1
        return {"OUT": inputs["IN"]}

    dp = plane(Answers("answers", answer), settings=Settings(model_threads=1))
    lean = lean_way(dp)
    replies: list[Any] = []
    threads = [threading.Thread(target=lambda: replies.append(
        lean(request("answers", {"IN": np.ones(3, np.float32)})))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(replies) == 4 and all(isinstance(r, bytes) for r in replies)
    assert most == 1
    assert counts(dp, "answers")["queue"][1] > 0  # three of them waited for the slot


def test_a_model_unloaded_meanwhile_is_still_held_while_it_answers() -> None:
    """An unload asked for while the lean way runs the model waits for it: the model's unload() comes after its
    answer, which is the whole answer; a request arriving meanwhile is left to the general way."""
    events: list[str] = []
    started, release = threading.Event(), threading.Event()

    class Held(Simple):
        name = "held"

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            started.set()
            release.wait(TIMEOUT)
            events.append("answered")
            return Simple.infer(self, inputs, parameters)

        def unload(self) -> None:
            events.append("unloaded")

    dp = plane(Held())
    lean = lean_way(dp)
    replies: list[Any] = []
    answering = threading.Thread(target=lambda: replies.append(lean(request("held"))))
    answering.start()
    assert started.wait(TIMEOUT)
    assert dp.repository.inflight()[("held", "1")] == 1  # held while it runs
    unloading = threading.Thread(target=lambda: asyncio.run(dp.repository.unload("held")))
    unloading.start()
    deadline = time.monotonic() + TIMEOUT
    while dp.repository.is_ready("held") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not dp.repository.is_ready("held")  # unloading: no new request takes it
    assert lean(request("held")) is None  # left to the general way (which answers that it is not ready)
    unloading.join(0.3)
    assert unloading.is_alive() and events == []  # the unload waits for the request in flight
    release.set()
    answering.join(TIMEOUT)
    unloading.join(TIMEOUT)
    assert events == ["answered", "unloaded"]
    answer = parsed(replies[0])
    assert (answer.model_name, [o.name for o in answer.outputs]) == ("held", ["OUTPUT0", "OUTPUT1"])
    assert list(answer.raw_output_contents) == [(A + B).tobytes(), (A - B).tobytes()]
    assert ("held", "1") not in dp.repository.inflight()


def test_requests_under_dynamic_batching_are_batched_by_the_threads_waiting_for_them() -> None:
    """From eight gRPC threads at once, requests to a model under dynamic batching (4 rows at most, a window long
    enough for them all) take the lean way: the waiting threads form two batches of 4 and run the model once for
    each, each request gets its own rows back, and the statistics count every request once and each batch as one
    execution of 4; no event loop is involved."""
    calls: list[tuple[int, str]] = []

    class Windowed(Batching):
        name = "windowed"
        dynamic_batching = DynamicBatching(max_queue_delay_microseconds=2_000_000)

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            calls.append((len(inputs["INPUT0"]), threading.current_thread().name))
            return Simple.infer(self, inputs, parameters)

    dp = plane(Windowed())
    lean = lean_way(dp)
    replies: dict[int, Any] = {}
    rows = {n: np.full((1, 16), n, dtype=np.int32) for n in range(8)}

    def send(n: int) -> None:
        replies[n] = lean(request("windowed", {"INPUT0": rows[n], "INPUT1": B}, id=f"r{n}"))

    threads = [threading.Thread(target=send, args=(n,), name=f"sender-{n}") for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert sorted(size for size, _ in calls) == [4, 4]
    assert all(name.startswith("sender-") for _, name in calls)  # run by a waiting thread
    assert sorted(replies) == list(range(8))
    for n, reply in replies.items():
        answer = parsed(reply)
        assert answer.id == f"r{n}"
        assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.int32), (rows[n] + B).ravel())
    counted = counts(dp, "windowed")
    assert (counted["success"][0], counted["inference_count"], counted["execution_count"]) == (8, 8, 2)
    assert counted["queue"][1] > 0  # they waited for their batch


def test_a_batch_that_fails_fails_every_request_of_it_and_hands_the_lead_on() -> None:
    """A model under dynamic batching that raises: every request of the batch gets the model's failure, counted once
    each; the requests that come after are batched and answered as usual (the lead was handed on)."""
    fail = threading.Event()
    fail.set()

    class Flaky(Batching):
        name = "flaky"
        dynamic_batching = DynamicBatching(max_queue_delay_microseconds=500_000)

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            if fail.is_set():
                raise RuntimeError("broken batch")
            return Simple.infer(self, inputs, parameters)

    dp = plane(Flaky())
    lean = lean_way(dp)
    outcomes: list[Any] = []

    def send() -> None:
        try:
            outcomes.append(lean(request("flaky", {"INPUT0": A, "INPUT1": B})))
        except OipError as exc:
            outcomes.append(exc)

    for expect_failure in (True, False):
        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        if expect_failure:
            assert [type(o).__name__ for o in outcomes] == ["ModelFailure"] * 4
            assert all(o.message == "broken batch" for o in outcomes)
            fail.clear()
            outcomes.clear()
    assert len(outcomes) == 4 and all(isinstance(o, bytes) for o in outcomes)
    counted = counts(dp, "flaky")
    assert (counted["fail"][0], counted["success"][0], counted["execution_count"]) == (4, 4, 1)


def test_requests_that_arrive_while_a_batch_runs_form_the_next_batch() -> None:
    """One request's batch runs (the model held) while three more arrive: they wait, and once it is done the lead
    passes to the first of them, which runs the three as the next batch."""
    calls: list[int] = []
    release = threading.Event()

    class Held(Batching):
        name = "held_batch"

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            calls.append(len(inputs["INPUT0"]))
            if len(calls) == 1:
                release.wait(TIMEOUT)
            return Simple.infer(self, inputs, parameters)

    dp = plane(Held())
    lean = lean_way(dp)
    replies: list[Any] = []
    first = threading.Thread(target=lambda: replies.append(lean(request("held_batch", {"INPUT0": A, "INPUT1": B}))))
    first.start()
    deadline = time.monotonic() + TIMEOUT
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    later = [threading.Thread(target=lambda: replies.append(lean(request("held_batch", {"INPUT0": A, "INPUT1": B}))))
             for _ in range(3)]
    for thread in later:
        thread.start()
    time.sleep(0.2)  # they are waiting behind the running batch
    release.set()
    for thread in (first, *later):
        thread.join(5)
    assert calls == [1, 3]
    assert len(replies) == 4 and all(isinstance(reply, bytes) for reply in replies)
    assert counts(dp, "held_batch")["execution_count"] == 2


class IntAnswers(Answers):
    """`Answers` of INT32: an output named and shaped as its, of another datatype."""

    inputs = (TensorSpec("IN", "INT32", [-1]),)
    outputs = (TensorSpec("OUT", "INT32", [-1]),)


def test_a_reply_takes_the_pieces_of_the_model_that_answered() -> None:
    """The serialized model name and output headers are kept by what they are made of (`InferCodec.head`,
    `header`), not by the model: two models with an output of the same name and shape but another datatype, and
    a model reloaded under another version, each get their own in their replies."""
    dp = plane(
        Answers("answers", lambda i: {"OUT": i["IN"]}),
        IntAnswers("ints", lambda i: {"OUT": i["IN"]}),
    )
    lean = lean_way(dp)
    floats = parsed(lean(request("answers", {"IN": np.array([1.5, -2.0], np.float32)})))
    ints = parsed(lean(request("ints", {"IN": np.array([1, -2], np.int32)})))
    assert (floats.model_name, floats.outputs[0].datatype) == ("answers", "FP32")
    assert (ints.model_name, ints.outputs[0].datatype) == ("ints", "INT32")
    assert ints == general(dp, request("ints", {"IN": np.array([1, -2], np.int32)}))


def test_the_polling_thread_hands_its_plan_to_the_call_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`answers_here` looks the request's plan up to see that the model is inline, then answers the call: the
    call's handler takes that plan (one lookup a call, not two), and a handler answering another message (a pool
    thread's, meanwhile) looks its own up: its reply names its own model."""
    dp = plane(Quick())
    looked_up: list[str] = []
    lookup = dp.pipeline.lean.plan

    def counting(name: str, version: str) -> Any:
        looked_up.append(name)
        return lookup(name, version)

    monkeypatch.setattr(dp.pipeline.lean, "plan", counting)
    reply = answer_here(dp, request("quick"), lambda: None)
    assert looked_up == ["quick"]
    assert parsed(reply) == general(dp, request("quick"))

    lean = lean_way(dp)
    other = lookup("quick", "")
    assert other is not None
    lean.here = (request("quick"), other)  # what the polling thread holds for its own call
    reply = parsed(lean(request("simple")))
    assert reply.model_name == "simple" and reply == general(dp, request("simple"))
    assert lean.unrecorded is None and counts(dp, "simple")["success"][0] == 2  # recorded now, not left to the other


class Quick(Simple):
    name = "quick"
    inline = True


def answer_here(dp: DataPlane, message: Any, while_sending: Callable[[], None], observe: Any = None) -> Any:
    """Answer `message` as grpcio's polling thread does (`answers_here`); `while_sending` runs once the reply is
    made, where grpcio sends it. The reply."""
    from oip.server.grpc.in_thread import in_thread
    from oip.server.grpc.service import INFER

    way = in_thread(dp.pipeline, dp.settings, INFER, "ModelInfer", observe, False)
    replies: list[Any] = []

    def respond(behavior: Any = None, plain: bool = False) -> None:
        """As grpcio's thread answers the call: by its handler, or by the behaviour given (with no context when
        `plain`; this one has none to give)."""
        replies.append((way.handle if behavior is None else behavior)(message, None))
        while_sending()

    assert way.answers_here(message, [], respond)
    return replies[0]


def test_the_polling_thread_sends_the_reply_before_it_records_the_request() -> None:
    """An inline model's call answered in the polling thread: its record (statistics, its hold on the model) is
    made once the reply is sent, not before, and then exactly as the general way makes it; its durations end when
    the reply was ready (a slow send is in none of them)."""
    dp, general_dp = plane(Quick(), settings=Settings(metrics=True)), plane(Quick(), settings=Settings(metrics=True))
    observed: list[tuple[str, str]] = []
    seen_while_sending: list[Any] = []

    def sending() -> None:
        seen_while_sending.append((dp.statistics.snapshot().get(("quick", "1")),
                                   dp.repository.inflight()[("quick", "1")], list(observed)))
        time.sleep(0.2)  # a slow send

    reply = answer_here(dp, request("quick"), sending, lambda rpc, code, *rest: observed.append((rpc, code)))
    assert parsed(reply) == general(general_dp, request("quick"))
    assert seen_while_sending == [(None, 1, [("ModelInfer", "OK")])]
    assert observed == [("ModelInfer", "OK")] and dp.repository.inflight()[("quick", "1")] == 0
    a, b = counts(dp, "quick"), counts(general_dp, "quick")
    assert {k: v[0] if isinstance(v, tuple) else v for k, v in a.items()} == {
        k: v[0] if isinstance(v, tuple) else v for k, v in b.items()}
    assert a["success"][0] == 1 and 0 < a["success"][1] < 0.2e9


@pytest.mark.parametrize("reader", ["statistics", "metrics", "pending"])
def test_whoever_reads_the_counts_meanwhile_waits_for_the_record(reader: str) -> None:
    """A read of what the observers counted that begins while the polling thread sends a reply (the statistics
    extension, a metrics scrape, the pending requests) returns once that request is recorded, and counts it."""
    dp = plane(Quick(), settings=Settings(metrics=True))
    assert dp.metrics is not None
    metrics = dp.metrics
    key = (("model", "quick"), ("version", "1"))

    def read() -> Any:
        if reader == "statistics":
            answer = run(dp.model_statistics(pb.ModelStatisticsRequest(name="quick")))
            return answer.model_stats[0].inference_count
        if reader == "metrics":
            return next(s.value for f in metrics.families() for s in f.samples
                        if s.name == "nv_inference_count" and s.labels.get("model") == "quick")
        return metrics.pending[key]

    assert read() == 0
    got: list[Any] = []
    readers: list[threading.Thread] = []

    def sending() -> None:
        thread = threading.Thread(target=lambda: got.append(read()))
        thread.start()
        readers.append(thread)
        time.sleep(0.2)  # the reader would have read by now, were it not held back

    answer_here(dp, request("quick"), sending)
    readers[0].join(TIMEOUT)
    assert got == [1 if reader != "pending" else 0]


@pytest.mark.parametrize("form", ["raw", "contents"])
def test_a_batching_plan_keys_its_requests_as_their_arrays_key_them(form: str) -> None:
    """Under dynamic batching, the plan's batch key (taken for every request without parameters, in place of
    `batch_key` of its arrays) is exactly `batch_key` of the arrays the lean way reads, for inputs of every
    datatype it takes in either form; a model with an input of variable shape after the batch dimension has none
    (each request's arrays are keyed)."""
    from oip.server.core.batching import batch_key

    datatypes = ["BOOL", "UINT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]
    if form == "contents":
        datatypes.remove("FP16")  # raw contents only

    class Many(Model):
        name = "many"
        inputs = tuple(TensorSpec(f"IN_{dt}", dt, [2, 3]) for dt in datatypes)
        outputs = (TensorSpec("OUT", "INT32", [1]),)
        max_batch_size = 4
        dynamic_batching = DynamicBatching()
        inline = True

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            return {"OUT": np.zeros((len(inputs["IN_INT32"]), 1), np.int32)}

    class Wide(Many):
        name = "wide"
        inputs = (TensorSpec("IN", "INT32", [-1]),)

    dp = plane(Many(), Wide())
    lean = lean_way(dp)
    message = pb.ModelInferRequest(model_name="many")
    for dt in datatypes:
        dtype = {"BOOL": bool, "BYTES": object}.get(dt, dt.lower().replace("fp", "float"))
        array = np.ones((2, 2, 3), dtype=dtype) if dt != "BYTES" else np.full((2, 2, 3), b"ab", dtype=object)
        tensor = message.inputs.add(name=f"IN_{dt}", datatype=dt, shape=array.shape)
        if form == "raw":
            message.raw_input_contents.append(bytes(codec.to_raw(array, dt)))
        else:
            field, values = codec.to_contents(array, dt)
            getattr(tensor.contents, field).extend(values)
    plan = lean.plan(message)
    assert plan is not None and plan.batch_key is not None
    read = lean._read(plan, message, None)
    assert read is not None, "the lean way takes the request"
    arrays = read[1]
    assert plan.batch_key == batch_key(arrays, {}) and hash(plan.batch_key) == hash(batch_key(arrays, {}))
    wide = lean.plan(pb.ModelInferRequest(model_name="wide"))
    assert wide is not None and wide.batching and wide.batch_key is None



def test_a_plan_looked_up_across_an_unload_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gRPC thread that found a model just before it was unloaded (or reloaded), and stores its plan only after
    the instance was retired, serves its request with it but does not keep the plan: that would hold the retired
    instance, and everything it holds, until the same name is asked for again."""
    dp = plane(Quick())
    lean = dp.pipeline.lean
    lookup = dp.repository.get
    found: list[Model] = []

    def found_then_unloaded(name: str, version: str = "") -> Model:
        model = lookup(name, version)
        found.append(model)
        run(dp.repository.unload(name))  # retires it: the repository tells the lean way (`Lean.forget`)
        return model

    monkeypatch.setattr(dp.repository, "get", found_then_unloaded)
    assert lean.plan("quick", "") is not None  # this request is served by the instance it found
    monkeypatch.setattr(dp.repository, "get", lookup)
    assert found and not any(model is found[0] for model, _ in lean._plans.values())
    assert lean.plan("quick", "") is None  # unloaded: the general way answers, and refuses
    assert lean.plan("simple", "") is not None and any(model.name == "simple" for model, _ in lean._plans.values())
