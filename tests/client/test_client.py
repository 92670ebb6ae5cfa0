"""The generated clients against the generated server over real sockets (`python -m oip serve` on loopback).

The four clients (RestClient, AsyncRestClient, GrpcClient, AsyncGrpcClient) run the same checks: every operation
of the spec, inference with every datatype over REST JSON, REST binary and gRPC raw, BYTES from numpy str_,
bytes_ and object arrays, explicit datatypes (FP16, BF16), and every kind of error mapped to the same typed
exception on both transports. The async clients run on their own event loop in a thread (`Blocking`), so one test
body serves all four; native asyncio use (concurrent requests, streams) has its own tests.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import pytest
from oip import codec, models
from oip.client import (
    AlreadyExists,
    AsyncGrpcClient,
    AsyncRestClient,
    DeadlineExceeded,
    GrpcClient,
    InferRequest,
    InferResult,
    InvalidArgument,
    NotFound,
    OipClientError,
    RequestedOutput,
    RestClient,
    ServerError,
    Tensor,
    TooLarge,
    Unavailable,
    Unimplemented,
)
from serving import Recording, Server, build_repository, example_models, running

pytestmark = pytest.mark.anyio

KINDS = ("rest", "rest_async", "grpc", "grpc_async")
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
TIMEOUT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("client")
    repository = build_repository(root / "models", extra=("slow", "failing", "rendezvous"))
    names = [m["name"] for m in example_models()] + ["slow", "failing", "rendezvous"]
    with running(repository, root, "--model-threads", "8", ready=names) as server:
        yield server


class Blocking:
    """An async client driven from sync code: it lives on its own event loop in a thread, and each method call
    runs there to completion (streams are collected into a list)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> Any:
            return factory()

        self.client = self.run(make())

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(TIMEOUT * 2)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if name == "stream_infer":
            def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
                async def collect() -> list[Any]:
                    return [result async for result in attribute(*args, **kwargs)]
                return iter(self.run(collect()))
            return stream
        if inspect.iscoroutinefunction(attribute):
            return lambda *args, **kwargs: self.run(attribute(*args, **kwargs))
        return attribute

    def close(self) -> None:
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


def make_client(kind: str, server: Server, **options: Any) -> Any:
    if kind == "rest":
        return RestClient(server.url, trust_env=False, timeout=TIMEOUT, **options)
    if kind == "grpc":
        return GrpcClient(server.target, timeout=TIMEOUT, **options)
    if kind == "rest_async":
        return Blocking(lambda: AsyncRestClient(server.url, trust_env=False, timeout=TIMEOUT, **options))
    return Blocking(lambda: AsyncGrpcClient(server.target, timeout=TIMEOUT, **options))


@pytest.fixture(scope="module")
def clients(server: Server) -> Iterator[dict[str, Any]]:
    made = {kind: make_client(kind, server) for kind in KINDS}
    yield made
    for client in made.values():
        client.close()


@pytest.fixture(params=KINDS)
def client(request: pytest.FixtureRequest, clients: dict[str, Any]) -> Any:
    return clients[request.param]


def is_rest(client: Any) -> bool:
    return isinstance(getattr(client, "client", client), RestClient | AsyncRestClient)


# --- the shape of the clients -------------------------------------------------------------------------------------


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    """The public methods of a client class, its own and those of its bases (the runtime's machinery)."""
    members = {name: member for base in reversed(cls.__mro__[:-1]) for name, member in vars(base).items()}
    return {name: inspect.signature(member) for name, member in members.items()
            if callable(member) and not name.startswith("_")}


def test_the_four_clients_have_the_same_methods_and_arguments() -> None:
    reference = public_methods(RestClient)
    expected = {"server_live", "server_ready", "model_ready", "server_metadata", "model_metadata", "infer",
                "stream_infer", "model_config", "model_statistics", "repository_index", "repository_model_load",
                "repository_model_unload", "system_shared_memory_status", "system_shared_memory_register",
                "system_shared_memory_unregister", "cuda_shared_memory_status", "cuda_shared_memory_register",
                "cuda_shared_memory_unregister", "generate", "generate_stream", "close"}
    assert set(reference) == expected
    for cls in (AsyncRestClient, GrpcClient, AsyncGrpcClient):
        methods = public_methods(cls)
        assert set(methods) == expected, cls
        for name, signature in reference.items():
            assert list(methods[name].parameters) == list(signature.parameters), (cls, name)
            returns = str(methods[name].return_annotation).removeprefix("Async")
            assert returns == str(signature.return_annotation), (cls, name)


def test_async_methods_are_coroutines() -> None:
    for cls in (AsyncRestClient, AsyncGrpcClient):
        for name in public_methods(cls):
            member = getattr(cls, name)
            if name in ("stream_infer", "generate_stream"):  # iterators
                continue
            assert inspect.iscoroutinefunction(member), (cls, name)
    assert inspect.isasyncgenfunction(AsyncGrpcClient.stream_infer)


# --- health and metadata ------------------------------------------------------------------------------------------


def test_health(client: Any) -> None:
    assert client.server_live() == models.ServerLiveResponse(live=True)
    assert client.server_ready() == models.ServerReadyResponse(ready=True)
    assert client.model_ready("simple") == models.ModelReadyResponse(name="simple", ready=True)
    assert client.model_ready("simple", "1") == models.ModelReadyResponse(name="simple", ready=True)
    with pytest.raises(NotFound):
        client.model_ready("nope")


def test_metadata(client: Any) -> None:
    metadata = client.server_metadata()
    assert isinstance(metadata, models.MetadataServerResponse)
    assert metadata.name == "oip"
    assert {"binary_tensor_data", "model_repository"} <= set(metadata.extensions)
    simple = client.model_metadata("simple")
    assert isinstance(simple, models.MetadataModelResponse)
    assert simple.name == "simple" and simple.versions == ["1"]
    assert [(t.name, t.datatype, t.shape) for t in simple.inputs or []] == [
        ("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])]
    assert client.model_metadata("simple", "1") == simple
    with pytest.raises(NotFound):
        client.model_metadata("nope")
    with pytest.raises(NotFound):
        client.model_metadata("simple", "9")


def test_config_and_statistics(client: Any) -> None:
    config = client.model_config("simple")
    assert isinstance(config, models.ModelConfigResponse)
    assert config.name == "simple" and config.max_batch_size == 0
    assert [(i.name, i.data_type, i.dims) for i in config.input or []] == [
        ("INPUT0", "TYPE_INT32", [1, 16]), ("INPUT1", "TYPE_INT32", [1, 16])]
    assert client.model_config("simple", "1") == config
    client.infer("simple", {"INPUT0": A, "INPUT1": B})
    stats = client.model_statistics("simple")
    assert isinstance(stats, models.ModelStatisticsResponse)
    [entry] = stats.model_stats
    assert (entry.name, entry.version) == ("simple", "1")
    assert entry.inference_count and entry.inference_count >= 1
    assert entry.inference_stats.fail.count == 0  # defaults are filled in on both transports
    assert [(s.name, s.version) for s in client.model_statistics("simple", "1").model_stats] == [("simple", "1")]
    assert "simple" in {s.name for s in client.model_statistics().model_stats}
    with pytest.raises(NotFound):
        client.model_statistics("nope")


def test_statistics_of_a_version_needs_a_model_over_rest(clients: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="no endpoint") as caught:
        clients["rest"].model_statistics(version="1")
    assert caught.value.status is None and caught.value.code is None


def test_both_transports_answer_the_same(clients: dict[str, Any]) -> None:
    rest, grpc = clients["rest"], clients["grpc"]
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("server_live", ()), ("server_ready", ()), ("model_ready", ("simple",)),
        ("server_metadata", ()), ("model_metadata", ("simple",)), ("model_metadata", ("identity_bytes", "1")),
        ("model_config", ("mymodel",)), ("repository_index", ()), ("system_shared_memory_status", ()),
    ]
    for name, args in calls:
        assert getattr(rest, name)(*args) == getattr(grpc, name)(*args), name
    one = rest.model_statistics("mymodel")
    other = grpc.model_statistics("mymodel")
    assert one.model_dump(exclude={"model_stats"}) == other.model_dump(exclude={"model_stats"})
    assert set(one.model_stats[0].model_dump()) == set(other.model_stats[0].model_dump())


# --- inference ----------------------------------------------------------------------------------------------------


def check_simple(result: InferResult, a: np.ndarray = A, b: np.ndarray = B) -> None:
    assert isinstance(result, InferResult)
    assert result.model_name == "simple" and result.model_version == "1"
    assert result.names == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result["OUTPUT1"], a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    assert [(o.name, o.datatype, o.shape) for o in result.outputs] == [
        ("OUTPUT0", "INT32", (1, 16)), ("OUTPUT1", "INT32", (1, 16))]


def test_infer_simple(client: Any) -> None:
    check_simple(client.infer("simple", {"INPUT0": A, "INPUT1": B}))
    result = client.infer("simple", {"INPUT0": A, "INPUT1": B}, version="1", id="request-7")
    check_simple(result)
    assert result.id == "request-7"
    assert client.infer("simple", {"INPUT0": A, "INPUT1": B}).id == ""


@pytest.mark.parametrize("binary", [None, True, False])
def test_infer_simple_rest_modes(clients: dict[str, Any], binary: bool | None) -> None:
    for kind in ("rest", "rest_async"):
        check_simple(clients[kind].infer("simple", {"INPUT0": A, "INPUT1": B}, binary=binary))


def test_infer_inputs_as_lists_and_tensors(client: Any) -> None:
    a, b = A.tolist(), B.tolist()
    check_simple(client.infer("simple", {"INPUT0": a, "INPUT1": b}, datatypes={"INPUT0": "INT32", "INPUT1": "INT32"}))
    check_simple(client.infer("simple", [Tensor("INPUT0", a, "INT32"), Tensor("INPUT1", B)]))
    check_simple(client.infer("simple", {"INPUT0": Tensor("INPUT0", A), "INPUT1": B}))
    # non-contiguous and big-endian arrays are sent as the values they hold
    wide = np.zeros((1, 32), dtype=np.int32)
    wide[:, ::2] = A
    check_simple(client.infer("simple", {"INPUT0": wide[:, ::2], "INPUT1": B.astype(">i4")}))


def test_requested_outputs(client: Any) -> None:
    result = client.infer("simple", {"INPUT0": A, "INPUT1": B}, outputs=["OUTPUT1"])
    assert result.names == ["OUTPUT1"]
    np.testing.assert_array_equal(result["OUTPUT1"], A - B)
    with pytest.raises(KeyError, match="OUTPUT0"):
        result.as_numpy("OUTPUT0")
    result = client.infer("simple", {"INPUT0": A, "INPUT1": B},
                          outputs=[RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0", binary=False)])
    assert result.names == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(result.as_dict()["OUTPUT0"], A + B)


def test_parameters_travel(client: Any) -> None:
    """Every parameter reaches the model with its type (the rendezvous model answers the parameters it saw)."""
    sent = {"tag": "x", "flag": True, "n": 3, "big": 2**63, "f": 0.25, "parties": 1, "group": f"travel-{id(client)}"}
    result = client.infer("rendezvous", {"INPUT0": np.array([1, 2], np.int32)}, parameters=sent)
    np.testing.assert_array_equal(result["OUTPUT0"], [1, 2])
    assert result.parameters == sent
    assert {k: type(v) for k, v in result.parameters.items()} == {k: type(v) for k, v in sent.items()}


def values_of(datatype: str, exact_json: bool) -> np.ndarray:
    """Test values of `datatype` with its extremes (and NaN/inf where JSON is not involved)."""
    if datatype == "BOOL":
        return np.array([True, False, True])
    if datatype == "BYTES":
        return np.array([b"hello", "wörld".encode(), b"", b"x" * 300, b"tail\x00\x00"], dtype=object)
    if datatype == "BF16":
        return np.array([1.0, -2.5, 3.140625, 0.0, np.inf, -np.inf], dtype=ml_dtypes.bfloat16)
    dtype = codec.dtype_of(datatype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1, info.max // 3], dtype=dtype)
    info_f = np.finfo(dtype)
    values = [0.5, -1.25, float(info_f.max), float(info_f.smallest_subnormal), 1 / 3]
    if not exact_json:
        values += [np.inf, -np.inf]
    return np.array(values, dtype=dtype)


DATATYPES = [m["name"].removeprefix("identity_").upper() for m in example_models() if m["name"].startswith("identity_")]
JSON_DATATYPES = [d for d in DATATYPES if d not in ("FP16", "BF16")]
MODES = [("rest", "json"), ("rest", "binary"), ("rest_async", "json"), ("rest_async", "binary"), ("grpc", "raw"),
         ("grpc_async", "raw")]


def test_every_example_datatype_is_covered() -> None:
    assert sorted(DATATYPES) == sorted(["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                        "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"])


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize(("kind", "mode"), MODES)
def test_every_datatype(clients: dict[str, Any], kind: str, mode: str, datatype: str) -> None:
    client = clients[kind]
    values = values_of(datatype, exact_json=mode == "json")
    binary = {"json": False, "binary": True, "raw": None}[mode]
    if mode == "json" and datatype not in JSON_DATATYPES:
        # JSON cannot carry FP16 or BF16: the input goes binary anyway, and the output must be asked for binary
        result = client.infer(f"identity_{datatype.lower()}", {"INPUT0": values}, binary=False,
                              outputs=[RequestedOutput("OUTPUT0", binary=True)])
    else:
        result = client.infer(f"identity_{datatype.lower()}", {"INPUT0": values}, binary=binary)
    output = result.as_numpy("OUTPUT0")
    meta = result.output("OUTPUT0")
    assert (meta.name, meta.datatype, meta.shape) == ("OUTPUT0", datatype, values.shape)
    assert output.dtype == values.dtype, (output.dtype, values.dtype)
    assert output.shape == values.shape
    if datatype == "BYTES":
        assert output.tolist() == values.tolist()
    else:
        np.testing.assert_array_equal(output, values)


def test_fp16_as_json_without_binary_output_is_the_servers_400(clients: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="binary") as caught:
        clients["rest"].infer("identity_fp16", {"INPUT0": np.ones(3, np.float16)}, binary=False)
    assert caught.value.status == 400


def test_bytes_from_numpy_str_bytes_and_object_arrays(client: Any) -> None:
    expected = [b"caf\xc3\xa9", b"", b"x"]
    for data in (
        np.array(["café", "", "x"]),  # np.str_ (<U4): tritonclient refuses these
        np.array([b"caf\xc3\xa9", b"", b"x"]),  # np.bytes_ (S5)
        np.array(["café", b"", "x"], dtype=object),  # object: str and bytes mixed
        ["café", "", "x"],
        [b"caf\xc3\xa9", b"", b"x"],
    ):
        result = client.infer("identity_bytes", {"INPUT0": data})
        assert result.output("OUTPUT0").datatype == "BYTES"
        assert result["OUTPUT0"].tolist() == expected, data


def test_bytes_keep_trailing_nuls_and_any_byte(client: Any) -> None:
    # Python bytes in a list are kept whole (numpy's fixed-width bytes would drop the trailing NULs), and bytes
    # that are not UTF-8 go as binary data even in JSON mode (their answer must be asked for as binary data)
    data = [b"nul\x00", b"\xff\xfe\x00", b"\x00"]
    result = client.infer("identity_bytes", {"INPUT0": data}, binary=True)
    assert result["OUTPUT0"].tolist() == data
    result = client.infer("identity_bytes", {"INPUT0": data}, binary=False,
                          outputs=[RequestedOutput("OUTPUT0", binary=True)])
    assert result["OUTPUT0"].tolist() == data


def test_bytes_matrix(client: Any) -> None:
    data = np.array([["a", "bb"], ["ccc", "é"]])
    result = client.infer("identity_bytes", {"INPUT0": data.reshape(-1)})
    assert result["OUTPUT0"].tolist() == [b"a", b"bb", b"ccc", "é".encode()]


def test_explicit_datatypes(client: Any) -> None:
    floats = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
    result = client.infer("identity_bf16", {"INPUT0": Tensor("INPUT0", floats, datatype="BF16")})
    assert result["OUTPUT0"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(result["OUTPUT0"].astype(np.float32), floats)
    result = client.infer("identity_fp16", {"INPUT0": [0.5, 1.5]}, datatypes={"INPUT0": "FP16"})
    assert result["OUTPUT0"].dtype == np.float16 and result["OUTPUT0"].tolist() == [0.5, 1.5]
    result = client.infer("identity_int8", {"INPUT0": np.array([-3, 100])}, datatypes={"INPUT0": "INT8"})
    assert result["OUTPUT0"].dtype == np.int8 and result["OUTPUT0"].tolist() == [-3, 100]
    with pytest.raises(InvalidArgument, match="out of range") as caught:
        client.infer("identity_int8", {"INPUT0": np.array([300])}, datatypes={"INPUT0": "INT8"})
    assert caught.value.status is None and caught.value.code is None  # refused before anything was sent
    with pytest.raises(InvalidArgument, match="datatype"):
        client.infer("identity_int8", {"INPUT0": np.array([1j])})
    with pytest.raises(InvalidArgument, match="unknown datatype"):
        client.infer("identity_int8", {"INPUT0": Tensor("INPUT0", [1], datatype="INT7")})


def test_large_tensor(client: Any) -> None:
    data = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32)
    for binary in ((None, False) if is_rest(client) else (None,)):
        result = client.infer("identity_fp32", {"INPUT0": data}, binary=binary)
        np.testing.assert_array_equal(result["OUTPUT0"], data)


def test_empty_tensor(client: Any) -> None:
    result = client.infer("identity_fp32", {"INPUT0": np.zeros(0, np.float32)})
    assert result["OUTPUT0"].shape == (0,) and result["OUTPUT0"].dtype == np.float32


def test_outputs_are_read_only_views(clients: dict[str, Any]) -> None:
    result = clients["grpc"].infer("identity_fp32", {"INPUT0": np.ones(4, np.float32)})
    output = result["OUTPUT0"]
    assert not output.flags.writeable
    copy = output.copy()
    copy[0] = 2
    assert copy.tolist() == [2, 1, 1, 1]


# --- streams ------------------------------------------------------------------------------------------------------


def test_stream_infer(client: Any) -> None:
    requests = [{"INPUT0": A, "INPUT1": B}, InferRequest({"INPUT0": B, "INPUT1": A}, id="second", outputs=["OUTPUT1"])]
    if is_rest(client):
        with pytest.raises(Unimplemented, match="no REST form"):
            list(client.stream_infer("simple", requests))
        return
    results = list(client.stream_infer("simple", requests))
    assert len(results) == 2
    check_simple(results[0])
    assert results[1].id == "second" and results[1].names == ["OUTPUT1"]
    np.testing.assert_array_equal(results[1]["OUTPUT1"], B - A)


def test_stream_error_ends_the_stream(clients: dict[str, Any]) -> None:
    for kind in ("grpc", "grpc_async"):
        with pytest.raises(OipClientError, match=r"unknown model|not found"):
            list(clients[kind].stream_infer("nope", [{"INPUT0": A}]))
        with pytest.raises(InvalidArgument, match="complex"):  # a request that cannot be written
            list(clients[kind].stream_infer("simple", [{"INPUT0": A, "INPUT1": B}, {"INPUT0": np.ones(2, complex)}]))


def test_stream_errors_can_come_as_results(clients: dict[str, Any]) -> None:
    """With raise_errors=False a failed request is a result carrying the server's message; the stream goes on."""
    requests = [InferRequest({"INPUT0": A, "INPUT1": B}, id="ok"), InferRequest({"INPUT0": A}, id="bad"),
                InferRequest({"INPUT0": B, "INPUT1": A}, id="ok2")]
    for kind in ("grpc", "grpc_async"):
        results = list(clients[kind].stream_infer("simple", requests, raise_errors=False))
        assert [(r.id, bool(r.error)) for r in results] == [("ok", False), ("bad", True), ("ok2", False)]
        assert "INPUT1" in results[1].error
        check_simple(results[0])


# --- errors -------------------------------------------------------------------------------------------------------


def check_error(error: OipClientError, client: Any, status: int, code: str) -> None:
    if is_rest(client):
        assert error.status == status and error.code is None, (error.status, error.code)
    else:
        assert error.code is not None and error.code.name == code and error.status is None, error.code
    assert error.message and "Traceback" not in error.message


def test_errors_are_typed_the_same_on_both_transports(client: Any) -> None:
    with pytest.raises(NotFound, match="nope") as not_found:
        client.infer("nope", {"INPUT0": A})
    check_error(not_found.value, client, 404, "NOT_FOUND")
    with pytest.raises(NotFound):
        client.infer("simple", {"INPUT0": A, "INPUT1": B}, version="7")
    with pytest.raises(InvalidArgument) as bad_shape:
        client.infer("simple", {"INPUT0": A[:, :15], "INPUT1": B[:, :15]})
    check_error(bad_shape.value, client, 400, "INVALID_ARGUMENT")
    with pytest.raises(InvalidArgument, match="INPUT1"):
        client.infer("simple", {"INPUT0": A})
    with pytest.raises(InvalidArgument):
        client.infer("simple", {"INPUT0": A.astype(np.float32), "INPUT1": B})
    with pytest.raises(ServerError, match="the model cannot do this") as failure:
        client.infer("failing", {"INPUT0": np.array([1], np.int32)})
    check_error(failure.value, client, 500, "INTERNAL")
    with pytest.raises(Unimplemented) as unimplemented:
        client.cuda_shared_memory_register("gpu", raw_handle=b"\x00" * 8, device_id=0, byte_size=64)
    check_error(unimplemented.value, client, 501, "UNIMPLEMENTED")
    for call in (client.cuda_shared_memory_status, client.cuda_shared_memory_unregister):
        with pytest.raises(Unimplemented, match="CUDA"):
            call()
        with pytest.raises(Unimplemented, match="CUDA"):
            call("gpu")
    # the same server keeps answering
    check_simple(client.infer("simple", {"INPUT0": A, "INPUT1": B}))


def test_timeouts(client: Any) -> None:
    with pytest.raises(DeadlineExceeded):
        client.infer("slow", {"INPUT0": np.array([1], np.int32)}, parameters={"delay": 1.5}, timeout=0.2)
    check_simple(client.infer("simple", {"INPUT0": A, "INPUT1": B}))


@pytest.mark.parametrize("kind", KINDS)
def test_unreachable_server_is_unavailable(kind: str) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = Server(None, port, port, Path("/dev/null"), Path("/dev/null"))  # type: ignore[arg-type]
    client = make_client(kind, fake)
    try:
        with pytest.raises(Unavailable) as caught:
            client.server_live(timeout=5)
        assert caught.value.status is None
    finally:
        client.close()


def test_grpc_message_size_limit(server: Server) -> None:
    with GrpcClient(server.target, max_message_size=1024) as client, pytest.raises(TooLarge):
        client.infer("identity_fp32", {"INPUT0": np.zeros(10_000, np.float32)})


def test_rest_errors_without_the_error_shape() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/ready"):
            return httpx.Response(400)  # Triton: not ready, no body
        if request.url.path == "/v2":
            return httpx.Response(422, json={"detail": [{"msg": "field required"}]})
        return httpx.Response(502, text="bad gateway")

    with RestClient("http://server", transport=httpx.MockTransport(answer)) as client:
        assert client.model_ready("m") == models.ModelReadyResponse(name="m", ready=False)
        with pytest.raises(InvalidArgument, match="field required") as caught:
            client.server_metadata()
        assert caught.value.status == 422
        with pytest.raises(Unavailable, match="bad gateway"):
            client.server_live()


# --- the model repository and shared memory -----------------------------------------------------------------------


def test_repository(client: Any) -> None:
    index = client.repository_index()
    assert all(isinstance(entry, models.ModelIndex) for entry in index)
    states = {entry.name: entry.state for entry in index}
    assert states["simple"] == "READY"
    assert {entry.name for entry in client.repository_index(ready=True)} >= {"simple", "identity_int16"}
    client.repository_model_unload("identity_int16")
    try:
        assert client.model_ready("identity_int16").ready is False
        assert "identity_int16" not in {entry.name for entry in client.repository_index(ready=True)}
        with pytest.raises(OipClientError):
            client.infer("identity_int16", {"INPUT0": np.ones(2, np.int16)})
    finally:
        client.repository_model_load("identity_int16")
    assert client.model_ready("identity_int16").ready is True
    with pytest.raises(NotFound):
        client.repository_model_load("nope")
    with pytest.raises(Unimplemented):  # this server takes no load parameters
        client.repository_model_load("identity_int16", parameters={"config": "{}"})


def test_system_shared_memory(client: Any) -> None:
    region = shared_memory.SharedMemory(create=True, size=4096)
    name = f"region_{id(client)}"
    try:
        client.system_shared_memory_register(name, key="/" + region.name, byte_size=1024, offset=64)
        status = client.system_shared_memory_status(name)
        assert status == [models.SystemSharedMemoryRegionStatus(name=name, key="/" + region.name, offset=64,
                                                                byte_size=1024)]
        assert name in {r.name for r in client.system_shared_memory_status()}
        with pytest.raises(InvalidArgument):  # AlreadyExists over gRPC, 400 over REST: both InvalidArgument
            client.system_shared_memory_register(name, key="/" + region.name, byte_size=1024)
        client.system_shared_memory_unregister(name)
        assert name not in {r.name for r in client.system_shared_memory_status()}
        client.system_shared_memory_register(name, key="/" + region.name, byte_size=16)
        client.system_shared_memory_unregister()
        assert client.system_shared_memory_status() == []
    finally:
        region.close()
        region.unlink()


def test_already_exists_is_an_invalid_argument() -> None:
    assert issubclass(AlreadyExists, InvalidArgument)


# --- REST specifics: binary negotiation, headers, connection reuse ------------------------------------------------


def test_rest_binary_negotiation_and_headers(server: Server) -> None:
    transport = Recording()
    with RestClient(server.url, transport=transport, headers={"X-Client": "oip"}) as client:
        check_simple(client.infer("simple", {"INPUT0": A, "INPUT1": B}, headers={"X-Call": "1"}))
        check_simple(client.infer("simple", {"INPUT0": A, "INPUT1": B}))
        paths = [(r.method, r.url.path) for r in transport.sent]
        assert paths == [("GET", "/v2"), ("POST", "/v2/models/simple/infer"), ("POST", "/v2/models/simple/infer")]
        infer = transport.sent[1]
        assert "inference-header-content-length" in infer.headers  # the server lists binary_tensor_data
        assert infer.headers["x-client"] == "oip" and infer.headers["x-call"] == "1"
        assert infer.headers["accept-encoding"] == "identity"
        assert "x-call" not in transport.sent[2].headers
        client.infer("simple", {"INPUT0": A, "INPUT1": B}, binary=False)
        assert "inference-header-content-length" not in transport.sent[-1].headers
        assert transport.sent[-1].headers["content-type"] == "application/json"
        assert len(transport._pool.connections) == 1  # one keep-alive connection for everything
    with RestClient(server.url, transport=Recording(), binary=False) as client:
        check_simple(client.infer("simple", {"INPUT0": A, "INPUT1": B}))
        sent = client._http._transport.sent
        assert [r.url.path for r in sent] == ["/v2/models/simple/infer"]  # no need to ask the server
        assert "inference-header-content-length" not in sent[0].headers


def test_rest_url_forms(server: Server) -> None:
    with RestClient(f"127.0.0.1:{server.http_port}/", trust_env=False) as client:
        assert client.url == f"http://127.0.0.1:{server.http_port}"
        assert client.server_live().live


def test_rest_quotes_path_segments() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json={"name": "a/b c", "ready": True})

    with RestClient("http://server/prefix", transport=httpx.MockTransport(answer)) as client:
        client.model_ready("a/b c", "2")
    assert seen == ["/prefix/v2/models/a%2Fb%20c/versions/2/ready"]


def test_context_managers_close(server: Server) -> None:
    with RestClient(server.url, trust_env=False) as rest:
        rest.server_live()
    assert rest._http.is_closed
    with GrpcClient(server.target) as grpc_client:
        grpc_client.server_live()
    with pytest.raises(ValueError, match="closed"):
        grpc_client.server_live()


# --- native asyncio -----------------------------------------------------------------------------------------------


async def test_async_clients_run_requests_concurrently(server: Server) -> None:
    async with AsyncRestClient(server.url, trust_env=False) as rest, AsyncGrpcClient(server.target) as grpc_client:
        inputs = [{"INPUT0": A + i, "INPUT1": B} for i in range(20)]
        for client in (rest, grpc_client):
            results = await asyncio.gather(*(client.infer("simple", x) for x in inputs))
            for i, result in enumerate(results):
                check_simple(result, A + i, B)
        # The rendezvous model answers only once all 8 requests are inside it at once: they are concurrent.
        meet = {"parties": 8, "group": "async-clients"}
        together = [client.infer("rendezvous", {"INPUT0": np.array([i], np.int32)}, parameters=meet)
                    for client in (rest, grpc_client) for i in range(4)]
        results = await asyncio.gather(*together)
        assert sorted(int(r["OUTPUT0"][0]) for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]


async def test_async_stream_from_an_async_iterator(server: Server) -> None:
    async def requests() -> Any:
        for i in range(3):
            await asyncio.sleep(0)
            yield {"INPUT0": A + i, "INPUT1": B}

    async with AsyncGrpcClient(server.target) as client:
        results = [result async for result in client.stream_infer("simple", requests())]
    assert len(results) == 3
    for i, result in enumerate(results):
        check_simple(result, A + i, B)
