"""The data plane and the model repository, driven directly (no sockets): every rule the transports rely on."""

from __future__ import annotations

import asyncio
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import ROOT
from oip import codec, conformance
from oip.grpc import grpc_service_pb2 as pb
from oip.server import (
    DataPlane,
    InferRequest,
    InferResponse,
    InvalidRequest,
    Model,
    ModelFailure,
    ModelRepository,
    ModelState,
    NotFound,
    NotReady,
    OipError,
    RequestedOutput,
    Settings,
    Tensor,
    TensorSpec,
    Unimplemented,
)
from oip.server.errors import ErrorKind

pytestmark = pytest.mark.anyio

EXAMPLES = ROOT / "examples" / "models"
Arrays = dict[str, npt.NDArray[Any]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- helpers ------------------------------------------------------------------------------------------------


def tensor(name: str, datatype: str, data: Any, shape: list[int] | None = None) -> Tensor:
    array = np.empty(len(data), dtype=object) if datatype == "BYTES" else np.asarray(data, codec.dtype_of(datatype))
    if datatype == "BYTES":
        array[:] = list(data)
    if shape is not None:
        array = array.reshape(shape)
    return Tensor(name, datatype, list(array.shape), array)


def request(model: str, *inputs: Tensor, version: str = "", outputs: tuple[str, ...] = (), **kw: Any) -> InferRequest:
    return InferRequest(model, version, inputs=list(inputs), outputs=[RequestedOutput(n) for n in outputs], **kw)


def simple_inputs(a: Any = None, b: Any = None) -> list[Tensor]:
    a = np.arange(16) if a is None else a
    b = np.ones(16) if b is None else b
    return [tensor("INPUT0", "INT32", a, [1, 16]), tensor("INPUT1", "INT32", b, [1, 16])]


class AddSub(Model):
    name = "simple"
    inputs = (TensorSpec("INPUT0", "INT32", [1, 16]), TensorSpec("INPUT1", "INT32", [1, 16]))
    outputs = (TensorSpec("OUTPUT0", "INT32", [1, 16]), TensorSpec("OUTPUT1", "INT32", [1, 16]))

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}


class Identity(Model):
    """OUTPUT0 = INPUT0, of any datatype given to the constructor."""

    def __init__(self, name: str = "identity", datatype: str = "FP32", shape: tuple[int, ...] = (-1,),
                 **kw: Any) -> None:
        super().__init__(name, inputs=[TensorSpec("INPUT0", datatype, shape)],
                         outputs=[TensorSpec("OUTPUT0", datatype, shape)], **kw)
        self.seen: list[Any] = []

    async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        self.seen.append((inputs, parameters))
        return {"OUTPUT0": inputs["INPUT0"]}


class Returns(Model):
    """Returns whatever the test put in `result` (a fixed output declaration: OUT INT32 [-1, 2])."""

    inputs = (TensorSpec("IN", "INT32", [-1]),)
    outputs = (TensorSpec("OUT", "INT32", [-1, 2]),)

    def __init__(self, result: Any, datatype: str = "INT32", **kw: Any) -> None:
        super().__init__("returns", outputs=[TensorSpec("OUT", datatype, [-1, 2])], **kw)
        self.result = result

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return self.result


async def plane(*models: Model, settings: Settings | None = None) -> DataPlane:
    repository = ModelRepository()
    for model in models:
        repository.add(model)
    await repository.load_all()
    return DataPlane(repository, settings)


async def infer_error(dp: DataPlane, req: InferRequest) -> OipError:
    with pytest.raises(OipError) as caught:
        await dp.model_infer(req)
    return caught.value


def write_model(folder: Path, source: str, toml: str = 'class = "model:M"\n', file: str = "model.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.toml").write_text(toml)
    (folder / file).write_text(textwrap.dedent(source))
    return folder


CONSTANT = """
    import numpy as np
    from oip.server import Model, TensorSpec

    class M(Model):
        inputs = [TensorSpec("IN", "INT32", [-1])]
        outputs = [TensorSpec("OUT", "INT32", [1])]

        def infer(self, inputs, parameters):
            return {{"OUT": np.array([{value}], dtype=np.int32)}}
"""


async def out_value(dp: DataPlane, model: str, version: str = "") -> tuple[str, int]:
    response = await dp.model_infer(request(model, tensor("IN", "INT32", [0]), version=version))
    data = response.outputs[0].data
    assert data is not None
    return response.model_version, int(data[0])


# --- server health and metadata -----------------------------------------------------------------------------


async def test_server_live_ready_and_metadata() -> None:
    dp = await plane()
    assert (await dp.server_live(pb.ServerLiveRequest())).live is True
    assert (await dp.server_ready(pb.ServerReadyRequest())).ready is True  # no models: ready
    meta = await dp.server_metadata(pb.ServerMetadataRequest())
    assert meta.name == "oip" and meta.version == Settings().server_version
    core = ["model_repository", "binary_tensor_data", "parameters", "model_configuration", "statistics",
            "classification"]
    # system_shared_memory too, where the platform has POSIX shared memory; nothing else (CUDA is not served)
    assert list(meta.extensions) in (core, [*core, "system_shared_memory"])


async def test_server_metadata_follows_settings() -> None:
    settings = Settings(server_name="triton", server_version="2.50.0", extensions=["model_repository"])
    dp = await plane(settings=settings)
    meta = await dp.server_metadata(pb.ServerMetadataRequest())
    assert (meta.name, meta.version, list(meta.extensions)) == ("triton", "2.50.0", ["model_repository"])
    served = DataPlane(ModelRepository(), Settings()).enabled  # None: every one it can serve (settings stay as given)
    assert list(served[:6]) == ["model_repository", "binary_tensor_data", "parameters", "model_configuration",
                                "statistics", "classification"]


async def test_model_metadata() -> None:
    dp = await plane(AddSub(), Identity(properties={"origin": "test"}), AddSub("nameless", platform="numpy"))
    meta = await dp.model_metadata(pb.ModelMetadataRequest(name="simple"))
    assert (meta.name, list(meta.versions), meta.platform) == ("simple", ["1"], "python")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])]
    assert [t.name for t in meta.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(meta.properties) == 0  # empty: not sent at all
    identity = await dp.model_metadata(pb.ModelMetadataRequest(name="identity", version="1"))
    assert list(identity.inputs[0].shape) == [-1]  # -1 kept as declared
    assert dict(identity.properties) == {"origin": "test"}
    assert (await dp.model_metadata(pb.ModelMetadataRequest(name="nameless"))).platform == "numpy"
    with pytest.raises(NotFound):
        await dp.model_metadata(pb.ModelMetadataRequest(name="nope"))
    with pytest.raises(NotFound):
        await dp.model_metadata(pb.ModelMetadataRequest(name="simple", version="7"))


async def test_model_ready() -> None:
    class Broken(Identity):
        def load(self) -> None:
            raise RuntimeError("no weights")

    dp = await plane(AddSub(), Broken("broken"))
    assert (await dp.model_ready(pb.ModelReadyRequest(name="simple"))).ready is True
    assert (await dp.model_ready(pb.ModelReadyRequest(name="simple", version="1"))).ready is True
    # A model whose load failed: not ready, and the answer says which model and why (REST 503, gRPC UNAVAILABLE).
    for version in ("", "1"):
        with pytest.raises(NotReady, match=r"model 'broken' .*failed to load: no weights"):
            await dp.model_ready(pb.ModelReadyRequest(name="broken", version=version))
    await dp.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="broken"))
    assert (await dp.model_ready(pb.ModelReadyRequest(name="broken"))).ready is False  # unloaded: no failure
    for name, version in (("nope", ""), ("simple", "7"), ("nope", "1")):
        with pytest.raises(NotFound):
            await dp.model_ready(pb.ModelReadyRequest(name=name, version=version))


# --- inference: validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "outputs", "words"),
    [
        pytest.param([*simple_inputs(), tensor("EXTRA", "INT32", [1])], (), "unexpected inference input 'EXTRA'",
                     id="unknown_input"),
        pytest.param([*simple_inputs(), simple_inputs()[0]], (), "'INPUT0' appears more than once",
                     id="duplicate_input"),
        pytest.param(simple_inputs()[:1], (), "missing input 'INPUT1'", id="missing_input"),
        pytest.param([tensor("INPUT0", "FP32", np.zeros(16), [1, 16]), simple_inputs()[1]], (),
                     "data-type is 'FP32', but model 'simple' expects 'INT32'", id="datatype"),
        pytest.param([tensor("INPUT0", "INT32", np.zeros(16)), simple_inputs()[1]], (), "Expected [1,16], got [16]",
                     id="rank"),
        pytest.param([tensor("INPUT0", "INT32", np.zeros(16), [2, 8]), simple_inputs()[1]], (),
                     "Expected [1,16], got [2,8]", id="dims"),
        pytest.param(simple_inputs(), ("OUTPUT9",), "unexpected inference output 'OUTPUT9'", id="unknown_output"),
        pytest.param(simple_inputs(), ("OUTPUT0", "OUTPUT0"), "'OUTPUT0' appears more than once",
                     id="duplicate_output"),
    ],
)
async def test_invalid_requests(inputs: list[Tensor], outputs: tuple[str, ...], words: str) -> None:
    model = AddSub()
    calls: list[Any] = []
    model.infer = lambda inputs, parameters: calls.append(inputs)  # type: ignore[method-assign]
    dp = await plane(model)
    error = await infer_error(dp, request("simple", *inputs, outputs=outputs))
    assert isinstance(error, InvalidRequest) and error.kind is ErrorKind.INVALID_ARGUMENT
    assert words in error.message
    assert calls == []  # the model never ran


async def test_invalid_tensor_data() -> None:
    dp = await plane(Identity())
    no_data = Tensor("INPUT0", "FP32", [2], None)
    assert "no data" in (await infer_error(dp, request("identity", no_data))).message
    short = Tensor("INPUT0", "FP32", [3], np.zeros(2, np.float32))
    assert "needs 3 elements" in (await infer_error(dp, request("identity", short))).message
    negative = Tensor("INPUT0", "FP32", [-1], np.zeros(0, np.float32))
    assert isinstance(await infer_error(dp, request("identity", negative)), InvalidRequest)
    bad = request("identity", tensor("INPUT0", "FP32", [1.0]), parameters={"nested": {"a": 1}})
    assert "parameter 'nested'" in (await infer_error(dp, bad)).message


async def test_unknown_model_and_version() -> None:
    dp = await plane(AddSub())
    assert isinstance(await infer_error(dp, request("nope", *simple_inputs())), NotFound)
    error = await infer_error(dp, request("simple", *simple_inputs(), version="7"))
    assert isinstance(error, NotFound) and error.kind is ErrorKind.NOT_FOUND


async def test_variable_dimensions_accept_any_size() -> None:
    model = Identity(datatype="INT8", shape=(-1, 2))
    dp = await plane(model)
    for rows in (0, 1, 5):
        response = await dp.model_infer(request("identity", tensor("INPUT0", "INT8", np.zeros(rows * 2), [rows, 2])))
        assert response.outputs[0].shape == [rows, 2]
    error = await infer_error(dp, request("identity", tensor("INPUT0", "INT8", np.zeros(3), [1, 3])))
    assert "Expected [-1,2], got [1,3]" in error.message


async def test_a_shape_that_fitted_before_lets_nothing_else_through() -> None:
    """The lean way keeps the element counts of request shapes that fit a variable declaration, and the output shapes
    that fit; what it kept never lets through a dimension that is no integer or another shape that does not fit, and
    a model's answer of the wrong shape after a right one is still refused."""
    model = Identity(datatype="INT8", shape=(-1, 2))
    dp = await plane(model)
    for _ in range(2):  # the second time from what was kept
        response = await dp.model_infer(request("identity", tensor("INPUT0", "INT8", np.zeros(10), [5, 2])))
        assert response.outputs[0].shape == [5, 2]
    flagged = tensor("INPUT0", "INT8", np.zeros(2), [1, 2])
    await dp.model_infer(request("identity", flagged))
    flagged.shape = [True, 2]  # equal to (1, 2) as a key, but no integer
    assert "INPUT0" in (await infer_error(dp, request("identity", flagged))).message
    error = await infer_error(dp, request("identity", tensor("INPUT0", "INT8", np.zeros(15), [5, 3])))
    assert "Expected [-1,2], got [5,3]" in error.message

    answers = Returns({"OUT": np.zeros((7, 2), np.int32)})
    dp = await plane(answers)
    assert (await dp.model_infer(request("returns", tensor("IN", "INT32", [1])))).outputs[0].shape == [7, 2]
    answers.result = {"OUT": np.zeros((7, 3), np.int32)}
    assert isinstance(await infer_error(dp, request("returns", tensor("IN", "INT32", [1]))), ModelFailure)


async def test_flat_data_is_reshaped_to_the_request_shape() -> None:
    model = Identity(datatype="INT32", shape=(2, 2))
    dp = await plane(model)
    flat = Tensor("INPUT0", "INT32", [2, 2], np.arange(4, dtype=np.int32))
    response = await dp.model_infer(request("identity", flat))
    assert model.seen[0][0]["INPUT0"].shape == (2, 2)
    assert response.outputs[0].shape == [2, 2]


# --- inference: the model call ------------------------------------------------------------------------------


async def test_sync_infer_runs_off_the_loop_and_async_on_it() -> None:
    threads: dict[str, int] = {}

    class Sync(Identity):
        def load(self) -> None:
            threads["sync_load"] = threading.get_ident()

        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:  # type: ignore[override]
            threads["sync"] = threading.get_ident()
            return {"OUTPUT0": inputs["INPUT0"]}

    class Async(Identity):
        async def load(self) -> None:
            threads["async_load"] = threading.get_ident()

        async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            threads["async"] = threading.get_ident()
            return {"OUTPUT0": inputs["INPUT0"]}

    dp = await plane(Sync("sync"), Async("async"))
    for name in ("sync", "async"):
        await dp.model_infer(request(name, tensor("INPUT0", "FP32", [1.5])))
    loop_thread = threading.get_ident()
    assert threads["sync"] != loop_thread and threads["sync_load"] != loop_thread
    assert threads["async"] == loop_thread and threads["async_load"] == loop_thread


async def test_model_exception_is_a_model_failure_with_its_message() -> None:
    class Failing(Identity):
        def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:  # type: ignore[override]
            raise ZeroDivisionError("the model divided by zero")

    class Picky(Identity):
        async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            raise InvalidRequest("values must be positive")

    dp = await plane(Failing("failing"), Picky("picky"))
    error = await infer_error(dp, request("failing", tensor("INPUT0", "FP32", [1.0])))
    assert isinstance(error, ModelFailure) and error.kind is ErrorKind.MODEL_FAILURE
    assert error.message == "the model divided by zero"
    assert "Traceback" not in error.message
    error = await infer_error(dp, request("picky", tensor("INPUT0", "FP32", [1.0])))
    assert isinstance(error, InvalidRequest) and error.message == "values must be positive"
    # the server keeps going
    assert (await dp.server_live(pb.ServerLiveRequest())).live


@pytest.mark.parametrize(
    ("result", "datatype", "words"),
    [
        pytest.param({}, "INT32", "did not return output 'OUT'", id="missing"),
        pytest.param({"OUT": np.full((1, 2), 0.5)}, "INT32", "output 'OUT'", id="fraction_to_int"),
        pytest.param({"OUT": np.full((1, 2), 2**40)}, "INT32", "out of range", id="int_overflow"),
        pytest.param({"OUT": np.full((1, 2), 2.0**63)}, "INT64", "out of range", id="float_past_int64"),
        pytest.param({"OUT": np.full((1, 2), -1)}, "UINT32", "out of range", id="negative_to_unsigned"),
        pytest.param({"OUT": np.zeros((1, 3), np.int32)}, "INT32", "has shape [1,3]", id="shape"),
        pytest.param({"OUT": np.zeros(2, np.int32)}, "INT32", "has shape [2]", id="rank"),
        pytest.param({"OUT": np.array([["a", "b"]])}, "INT32", "cannot be INT32", id="str_to_int"),
        pytest.param({"OUT": np.zeros((1, 2), np.int32)}, "BYTES", "cannot be BYTES", id="int_to_bytes"),
        pytest.param({"OUT": np.array([[b"a", 3]], dtype=object)}, "BYTES", "element 1 must be bytes or str",
                     id="bytes_element"),
        pytest.param({"OUT": np.full((1, 2), 1e300)}, "FP32", "out of range", id="float_overflow"),
        pytest.param({"OUT": np.full((1, 2), 2)}, "BOOL", "cannot be BOOL", id="int_to_bool"),
        pytest.param([np.zeros((1, 2))], "INT32", "not a mapping", id="not_a_mapping"),
        pytest.param(({"OUT": np.zeros((1, 2), np.int32)}, {"p": [1]}), "INT32", "response parameter 'p'",
                     id="bad_parameter"),
    ],
)
async def test_bad_model_outputs_are_model_failures(result: Any, datatype: str, words: str) -> None:
    dp = await plane(Returns(result, datatype))
    error = await infer_error(dp, request("returns", tensor("IN", "INT32", [1])))
    assert isinstance(error, ModelFailure), error
    assert words in error.message


@pytest.mark.parametrize(
    ("value", "datatype", "expected"),
    [
        pytest.param(np.array([[1, 2]], np.int64), "INT32", [[1, 2]], id="int64_fits_int32"),
        pytest.param(np.array([[1.0, -3.0]]), "INT8", [[1, -3]], id="whole_floats_to_int"),
        pytest.param(np.array([[0.25, 1.5]]), "FP32", [[0.25, 1.5]], id="fp64_to_fp32"),
        pytest.param(np.array([[1, 2]]), "FP16", [[1.0, 2.0]], id="int_to_fp16"),
        pytest.param(np.array([[True, False]]), "UINT8", [[1, 0]], id="bool_to_uint8"),
        pytest.param(np.array([[1, 0]]), "BOOL", [[True, False]], id="zero_one_to_bool"),
        pytest.param([[3, 4]], "INT32", [[3, 4]], id="nested_list"),
        pytest.param(np.array([[0.5, 2.0]]), "BF16", [[0.5, 2.0]], id="fp64_to_bf16"),
        pytest.param(np.array([["é", "b"]]), "BYTES", [["é".encode(), b"b"]], id="str_to_bytes"),
        pytest.param(np.array([[b"x", "y"]], dtype=object), "BYTES", [[b"x", b"y"]], id="mixed_objects"),
        pytest.param(np.array([[b"x", b"yz"]]), "BYTES", [[b"x", b"yz"]], id="fixed_bytes"),
    ],
)
async def test_outputs_convert_to_the_declared_datatype_when_exact(value: Any, datatype: str, expected: Any) -> None:
    dp = await plane(Returns({"OUT": value}, datatype))
    response = await dp.model_infer(request("returns", tensor("IN", "INT32", [1])))
    out = response.outputs[0]
    assert out.data is not None and out.datatype == datatype and out.shape == [1, 2]
    assert out.data.dtype == codec.dtype_of(datatype)
    assert out.data.tolist() == expected
    if datatype == "BYTES":
        assert all(type(item) is bytes for item in out.data.reshape(-1))


async def test_output_variable_dimension_takes_any_size() -> None:
    dp = await plane(Returns({"OUT": np.zeros((7, 2), np.int32)}))
    response = await dp.model_infer(request("returns", tensor("IN", "INT32", [1])))
    assert response.outputs[0].shape == [7, 2]


async def test_outputs_filter_and_order() -> None:
    dp = await plane(AddSub())
    default = await dp.model_infer(request("simple", *simple_inputs()))
    assert [o.name for o in default.outputs] == ["OUTPUT0", "OUTPUT1"]  # declared order
    reordered = await dp.model_infer(request("simple", *simple_inputs(), outputs=("OUTPUT1", "OUTPUT0")))
    assert [o.name for o in reordered.outputs] == ["OUTPUT1", "OUTPUT0"]  # request order
    only = await dp.model_infer(request("simple", *simple_inputs(), outputs=("OUTPUT1",)))
    assert [o.name for o in only.outputs] == ["OUTPUT1"]
    data = only.outputs[0].data
    assert data is not None and data.tolist() == [list(range(-1, 15))]


async def test_add_sub_values_and_response_fields() -> None:
    dp = await plane(AddSub())
    response = await dp.model_infer(request("simple", *simple_inputs(), id="req-42"))
    assert isinstance(response, InferResponse)
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "req-42")
    sums = response.outputs[0]
    assert sums.datatype == "INT32" and sums.shape == [1, 16]
    assert sums.data is not None and sums.data.tolist() == [list(range(1, 17))]
    no_id = await dp.model_infer(request("simple", *simple_inputs()))
    assert no_id.id == ""


async def test_parameters_both_ways() -> None:
    class Echo(Identity):
        async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            self.seen.append(parameters)
            return {"OUTPUT0": inputs["INPUT0"]}, {"count": np.int64(3), "ratio": np.float32(0.5), "ok": True,
                                                   "note": "fine"}

    model = Echo("echo")
    dp = await plane(model)
    sent = {"my_int": 42, "my_bool": True, "my_string": "hello", "my_double": 0.5, "binary_data_output": True}
    response = await dp.model_infer(request("echo", tensor("INPUT0", "FP32", [1.0]), parameters=sent))
    assert model.seen == [{"my_int": 42, "my_bool": True, "my_string": "hello", "my_double": 0.5}]
    assert response.parameters == {"count": 3, "ratio": 0.5, "ok": True, "note": "fine"}
    assert type(response.parameters["count"]) is int


async def test_bytes_tensors_are_object_arrays_of_bytes() -> None:
    model = Identity(datatype="BYTES")
    dp = await plane(model)
    response = await dp.model_infer(request("identity", tensor("INPUT0", "BYTES", [b"a", b"", b"\xff\x00"])))
    given = model.seen[0][0]["INPUT0"]
    assert given.dtype == object and [type(x) for x in given] == [bytes, bytes, bytes]
    out = response.outputs[0]
    assert out.datatype == "BYTES" and out.data is not None and out.data.tolist() == [b"a", b"", b"\xff\x00"]


async def test_stream_answers_each_request_and_keeps_going() -> None:
    dp = await plane(AddSub())

    async def requests() -> AsyncIterator[InferRequest]:
        yield request("simple", *simple_inputs(), id="1")
        yield request("nope", *simple_inputs(), id="2")
        yield request("simple", *simple_inputs(), id="3")

    answers = [answer async for answer in dp.model_stream_infer(requests())]
    assert isinstance(answers[0], InferResponse) and answers[0].id == "1"
    assert isinstance(answers[1], OipError) and answers[1].kind is ErrorKind.NOT_FOUND  # a StreamError
    assert isinstance(answers[2], InferResponse) and answers[2].id == "3"


# --- versions -----------------------------------------------------------------------------------------------


class Versioned(Model):
    name = "multi"
    inputs = (TensorSpec("IN", "INT32", [-1]),)
    outputs = (TensorSpec("OUT", "INT32", [1]),)

    def __init__(self, version: str, fail: bool = False) -> None:
        super().__init__(version=version)
        self.fail = fail

    def load(self) -> None:
        if self.fail:
            raise OSError(f"version {self.version} has no weights")

    def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
        return {"OUT": np.array([int(self.version)])}


async def test_highest_ready_version_is_chosen_numerically() -> None:
    dp = await plane(Versioned("2"), Versioned("10"), Versioned("9"))
    assert await out_value(dp, "multi") == ("10", 10)  # numeric order: 10 > 9 > 2
    assert await out_value(dp, "multi", "2") == ("2", 2)
    meta = await dp.model_metadata(pb.ModelMetadataRequest(name="multi"))
    assert list(meta.versions) == ["2", "9", "10"]
    meta = await dp.model_metadata(pb.ModelMetadataRequest(name="multi", version="9"))
    assert list(meta.versions) == ["9"]


async def test_versions_that_fail_are_skipped_by_the_policy() -> None:
    dp = await plane(Versioned("1"), Versioned("2"), Versioned("3", fail=True))
    assert await out_value(dp, "multi") == ("2", 2)
    error = await infer_error(dp, request("multi", tensor("IN", "INT32", [0]), version="3"))
    assert isinstance(error, NotReady) and error.kind is ErrorKind.NOT_READY
    assert "version 3 is not ready: failed to load: version 3 has no weights" in error.message
    with pytest.raises(NotReady, match="version 3 has no weights"):
        await dp.model_ready(pb.ModelReadyRequest(name="multi", version="3"))
    assert (await dp.model_ready(pb.ModelReadyRequest(name="multi"))).ready is True
    index = {(m.version, m.state, m.reason) for m in (await dp.repository_index(pb.RepositoryIndexRequest())).models}
    assert index == {("1", "READY", ""), ("2", "READY", ""), ("3", "UNAVAILABLE", "version 3 has no weights")}


async def test_versions_from_model_toml_and_sub_folders(tmp_path: Path) -> None:
    write_model(tmp_path / "listed", CONSTANT.format(value=7), 'class = "model:M"\nversions = ["1", "3"]\n')
    folder = write_model(tmp_path / "folders", CONSTANT.format(value=1))
    write_model(folder / "2", CONSTANT.format(value=2))  # version 2 has its own model.py
    (folder / "2" / "model.toml").unlink()
    (folder / "11").mkdir()  # version 11 uses the model folder's file
    repository = ModelRepository(tmp_path)
    await repository.load_all()
    dp = DataPlane(repository)
    assert repository.ready_versions("listed") == ["1", "3"]
    assert repository.ready_versions("folders") == ["2", "11"]
    assert await out_value(dp, "folders", "2") == ("2", 2)
    assert await out_value(dp, "folders") == ("11", 1)
    assert await out_value(dp, "listed") == ("3", 7)


# --- repository: folders, failures, load and unload ---------------------------------------------------------


async def test_example_models_load_from_the_examples_folder() -> None:
    repository = ModelRepository(EXAMPLES)
    await repository.load_all()
    dp = DataPlane(repository)
    index = (await dp.repository_index(pb.RepositoryIndexRequest(ready=True))).models
    # every model of spec/examples/models.yaml, so that `make serve` serves what the golden cases need
    assert [(m.name, m.version, m.state, m.reason) for m in index] == [
        (model["name"], "1", "READY", "") for model in sorted(conformance.MODELS, key=lambda m: m["name"])]
    meta = await dp.model_metadata(pb.ModelMetadataRequest(name="simple"))
    assert meta.platform == "oipgen_example"
    response = await dp.model_infer(request("simple", *simple_inputs(np.full(16, 2**31 - 1), np.arange(16))))
    assert response.outputs[0].data is not None and response.outputs[1].data is not None
    assert response.outputs[0].data.tolist() == [[(2**31 - 1 + i + 2**31) % 2**32 - 2**31 for i in range(16)]]
    assert response.outputs[1].data.tolist() == [[2**31 - 1 - i for i in range(16)]]
    fp32 = await dp.model_infer(request("identity_fp32", tensor("INPUT0", "FP32", [0.5, -1.25])))
    assert fp32.outputs[0].data is not None and fp32.outputs[0].data.tolist() == [0.5, -1.25]
    empty = await dp.model_infer(request("identity_fp32", tensor("INPUT0", "FP32", [])))
    assert empty.outputs[0].shape == [0]
    text = await dp.model_infer(request("identity_bytes", tensor("INPUT0", "BYTES", [b"hello", b"\x00"])))
    assert text.outputs[0].data is not None and text.outputs[0].data.tolist() == [b"hello", b"\x00"]
    assert (await dp.server_ready(pb.ServerReadyRequest())).ready
    # Triton's generate extension: text_echo answers once, text_stream once per word.
    echo = await dp.generate({"model_name": "text_echo"}, {"text_input": "hi there", "id": "7", "temperature": 0.5})
    assert echo == {"model_name": "text_echo", "model_version": "1", "id": "7", "text_output": "hi there"}
    words = [a async for a in dp.generate_stream({"model_name": "text_stream"}, {"text_input": "a bc  d"})]
    assert [a["text_output"] for a in words] == ["a", "bc", "d"]


async def test_load_failures_are_reported_and_the_server_stays_live(tmp_path: Path) -> None:
    write_model(tmp_path / "good", CONSTANT.format(value=1))
    write_model(tmp_path / "failing_load", """
        from oip.server import Model

        class M(Model):
            def load(self):
                raise FileNotFoundError("weights.bin is missing")
    """)
    write_model(tmp_path / "syntax", "def broken(:\n")
    write_model(tmp_path / "no_class", "x = 1\n")
    write_model(tmp_path / "not_a_model", "class M:\n    pass\n")
    write_model(tmp_path / "bad_init", """
        from oip.server import Model, TensorSpec

        class M(Model):
            inputs = [TensorSpec("A", "FP32", [1]), TensorSpec("A", "FP32", [1])]
    """)
    write_model(tmp_path / "bad_toml", "", "class = \n")
    write_model(tmp_path / "unknown_key", "", 'class = "model:M"\nflavour = "x"\n')
    (tmp_path / "not_a_model_folder").mkdir()  # no model.toml: ignored
    (tmp_path / "not_a_model_folder" / "model.py").write_text("raise SystemExit('never imported')\n")
    repository = ModelRepository(tmp_path)
    await repository.load_all()
    dp = DataPlane(repository)
    index = {m.name: m for m in (await dp.repository_index(pb.RepositoryIndexRequest())).models}
    assert set(index) == {"good", "failing_load", "syntax", "no_class", "not_a_model", "bad_init", "bad_toml",
                          "unknown_key"}
    assert (index["good"].version, index["good"].state) == ("1", "READY")
    assert (index["failing_load"].state, index["failing_load"].reason) == ("UNAVAILABLE", "weights.bin is missing")
    assert "SyntaxError" in index["syntax"].reason
    assert "has no class 'M'" in index["no_class"].reason
    assert "not a subclass" in index["not_a_model"].reason
    assert "declared twice" in index["bad_init"].reason
    assert index["bad_toml"].version == "" and "cannot read" in index["bad_toml"].reason
    assert "flavour" in index["unknown_key"].reason
    assert all(m.state == "UNAVAILABLE" for name, m in index.items() if name != "good")
    assert [m.name for m in (await dp.repository_index(pb.RepositoryIndexRequest(ready=True))).models] == ["good"]
    assert (await dp.server_live(pb.ServerLiveRequest())).live
    assert not (await dp.server_ready(pb.ServerReadyRequest())).ready  # a model that should serve does not
    assert await out_value(dp, "good") == ("1", 1)
    error = await infer_error(dp, request("failing_load", tensor("IN", "INT32", [0])))
    assert isinstance(error, NotReady)
    with pytest.raises(ModelFailure, match=r"weights\.bin is missing"):
        await dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="failing_load"))


async def test_model_toml_name_platform_and_parameters(tmp_path: Path) -> None:
    write_model(tmp_path / "folder_name", """
        import numpy as np
        from oip.server import Model, TensorSpec

        class M(Model):
            platform = "from_class"
            inputs = [TensorSpec("IN", "INT32", [-1])]
            outputs = [TensorSpec("OUT", "INT32", [1])]

            def infer(self, inputs, parameters):
                return {"OUT": np.array([self.settings["answer"]])}
    """, 'name = "renamed"\nclass = "model:M"\nplatform = "from_toml"\n[parameters]\nanswer = 42\n')
    repository = ModelRepository(tmp_path)
    await repository.load_all()
    dp = DataPlane(repository)
    assert repository.names() == ["renamed"]
    meta = await dp.model_metadata(pb.ModelMetadataRequest(name="renamed"))
    assert (meta.name, meta.platform) == ("renamed", "from_toml")
    assert await out_value(dp, "renamed") == ("1", 42)
    assert repository.get("renamed").path == tmp_path / "folder_name"


async def test_model_file_may_import_its_neighbours(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "helped", """
        import numpy as np
        from oip.server import Model, TensorSpec
        from .helpers import ANSWER

        class M(Model):
            inputs = [TensorSpec("IN", "INT32", [-1])]
            outputs = [TensorSpec("OUT", "INT32", [1])]

            def infer(self, inputs, parameters):
                return {"OUT": np.array([ANSWER])}
    """)
    (folder / "helpers.py").write_text("ANSWER = 5\n")
    repository = ModelRepository(tmp_path)
    await repository.load_all()
    assert await out_value(DataPlane(repository), "helped") == ("1", 5)


async def test_unload_and_load_again() -> None:
    model = AddSub()
    dp = await plane(model)
    await dp.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="simple"))
    assert (await dp.model_ready(pb.ModelReadyRequest(name="simple"))).ready is False
    assert isinstance(await infer_error(dp, request("simple", *simple_inputs())), NotReady)
    [entry] = (await dp.repository_index(pb.RepositoryIndexRequest())).models
    assert (entry.name, entry.version, entry.state, entry.reason) == ("simple", "1", "UNAVAILABLE", "unloaded")
    assert (await dp.server_ready(pb.ServerReadyRequest())).ready  # an unloaded model does not count
    await dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="simple"))
    assert (await dp.model_ready(pb.ModelReadyRequest(name="simple"))).ready is True
    await dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="simple"))  # loaded: still fine
    assert (await dp.model_infer(request("simple", *simple_inputs()))).model_version == "1"
    for call in (dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="nope")),
                 dp.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="nope"))):
        with pytest.raises(NotFound):
            await call


async def test_repository_requests_that_are_not_supported() -> None:
    dp = await plane(AddSub())
    with_params = pb.RepositoryModelLoadRequest(model_name="simple")
    with_params.parameters["config"].string_param = "{}"
    with pytest.raises(Unimplemented):
        await dp.repository_model_load(with_params)
    with pytest.raises(Unimplemented):
        await dp.repository_model_load(pb.RepositoryModelLoadRequest(repository_name="r", model_name="simple"))
    with pytest.raises(InvalidRequest):
        await dp.repository_model_unload(pb.RepositoryModelUnloadRequest())
    unload = pb.RepositoryModelUnloadRequest(model_name="simple")
    unload.parameters["unload_dependents"].bool_param = True
    await dp.repository_model_unload(unload)  # accepted: no model has dependents


async def test_reload_reads_the_model_again_from_disk(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "edited", CONSTANT.format(value=1))
    repository = ModelRepository(tmp_path)
    await repository.load_all()
    dp = DataPlane(repository)
    assert await out_value(dp, "edited") == ("1", 1)
    (folder / "model.py").write_text(textwrap.dedent(CONSTANT.format(value=2)))  # same size, same second
    await dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="edited"))
    assert await out_value(dp, "edited") == ("1", 2)
    (folder / "model.py").write_text("raise RuntimeError('broken edit')\n")
    with pytest.raises(ModelFailure, match="broken edit"):
        await dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="edited"))
    assert await out_value(dp, "edited") == ("1", 2)  # a failed reload keeps the loaded instance
    write_model(tmp_path / "later", CONSTANT.format(value=3))  # appears after the start: load finds it
    await dp.repository_model_load(pb.RepositoryModelLoadRequest(model_name="later"))
    assert await out_value(dp, "later") == ("1", 3)


async def test_a_request_that_found_an_instance_before_a_reload_runs_on_the_new_one(tmp_path: Path) -> None:
    """A gRPC thread may find an instance (`get`), then lease it after a reload retired it: it gets the instance
    that replaced it, never the one being unloaded; an added instance loaded again after an unload leases again."""
    folder = write_model(tmp_path / "edited", CONSTANT.format(value=1))
    repository = ModelRepository(tmp_path)
    await repository.load_all()
    found = repository.get("edited")
    (folder / "model.py").write_text(textwrap.dedent(CONSTANT.format(value=2)))
    await repository.load("edited")
    leased = repository.acquire(found)
    try:
        assert leased is not found and leased is repository.get("edited")
        assert repository.inflight() == {("edited", "1"): 1}
    finally:
        repository.release(leased)
    model = AddSub()
    added = ModelRepository()
    added.add(model)
    await added.load("simple")
    await added.unload("simple")
    with pytest.raises(NotReady, match="'simple' version 1 is not ready: unloaded"):
        added.acquire(model)
    await added.load("simple")
    assert added.acquire(model) is model
    added.release(model)


async def test_concurrent_load_and_unload_of_one_model_do_not_race() -> None:
    events: list[str] = []
    active = 0

    async def hook(event: str) -> None:
        nonlocal active
        active += 1
        assert active == 1, "two hooks ran at once"
        events.append(event)
        await asyncio.sleep(0.01)
        active -= 1

    class Slow(Identity):
        async def load(self) -> None:
            await hook("load")

        async def unload(self) -> None:
            await hook("unload")

    model = Slow("slow")
    repository = ModelRepository()
    repository.add(model)
    await asyncio.gather(repository.load("slow"), repository.unload("slow"), repository.load("slow"),
                         repository.unload("slow"), repository.load("slow"))
    assert events == ["load", "unload", "load", "unload", "load"]
    assert repository.is_ready("slow")


async def test_unload_waits_for_requests_in_flight() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    unloaded: list[bool] = []

    class Blocking(Identity):
        async def infer(self, inputs: Arrays, parameters: dict[str, Any]) -> Any:
            started.set()
            await release.wait()
            return {"OUTPUT0": inputs["INPUT0"]}

        def unload(self) -> None:
            unloaded.append(True)

    dp = await plane(Blocking("blocking"))
    running = asyncio.create_task(dp.model_infer(request("blocking", tensor("INPUT0", "FP32", [1.0]))))
    await started.wait()
    unloading = asyncio.create_task(dp.repository.unload("blocking"))

    async def unload_began() -> None:
        while dp.repository.is_ready("blocking"):
            await asyncio.sleep(0)

    await asyncio.wait_for(unload_began(), 30)  # the model stops taking requests: the unload is waiting
    assert not unloaded and not unloading.done()
    assert isinstance(await infer_error(dp, request("blocking", tensor("INPUT0", "FP32", [1.0]))), NotReady)
    release.set()
    response = await running
    await unloading
    assert unloaded == [True] and response.outputs[0].name == "OUTPUT0"


async def test_index_lists_every_version_sorted() -> None:
    dp = await plane(Versioned("10"), Versioned("2"), AddSub(), Identity("aaa"))
    index = [(m.name, m.version) for m in (await dp.repository_index(pb.RepositoryIndexRequest())).models]
    assert index == [("aaa", "1"), ("multi", "2"), ("multi", "10"), ("simple", "1")]
    assert dp.repository.index()[0].state is ModelState.READY


# --- the model API ------------------------------------------------------------------------------------------


def test_tensor_spec_and_model_declarations_are_checked() -> None:
    assert TensorSpec("x", "FP32", [1, -1]).shape == (1, -1)
    assert TensorSpec.of({"name": "x", "datatype": "BYTES", "shape": [2]}) == TensorSpec("x", "BYTES", (2,))
    with pytest.raises(ValueError, match="unknown datatype 'FLOAT'"):
        TensorSpec("x", "FLOAT", [1])
    with pytest.raises(ValueError, match="invalid"):
        TensorSpec("x", "FP32", [-2])
    with pytest.raises(ValueError, match="declared twice"):
        Model("m", outputs=[TensorSpec("y", "FP32", [1]), TensorSpec("y", "INT8", [1])])
    model = AddSub("other", version="3", settings={"k": 1}, platform="onnx", max_batch_size=8,
                   properties={"a": "b"})
    assert (model.name, model.version, model.settings, model.platform, model.max_batch_size, model.properties) == (
        "other", "3", {"k": 1}, "onnx", 8, {"a": "b"})
    assert model.inputs == (TensorSpec("INPUT0", "INT32", [1, 16]), TensorSpec("INPUT1", "INT32", [1, 16]))
    assert Model().name == "Model"
    repository = ModelRepository()
    repository.add(model)
    with pytest.raises(ValueError, match="already added"):
        repository.add(AddSub("other", version="3"))
    with pytest.raises(ValueError, match="not a directory"):
        ModelRepository(ROOT / "pyproject.toml")


async def test_default_infer_is_a_model_failure() -> None:
    dp = await plane(Model("bare", inputs=[TensorSpec("A", "FP32", [1])]))
    error = await infer_error(dp, request("bare", tensor("A", "FP32", [1.0])))
    assert isinstance(error, ModelFailure) and "does not implement infer()" in error.message
