"""Byte equality: every golden case, converted from its REST form, serializes exactly like the protobuf
reference parse of its gRPC form (betterproto's test, on our converters); and back again."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
from conftest import SPEC
from google.protobuf import json_format
from google.protobuf.message import Message

from oipgen.api import Api, Example, RestEndpoint
from oipgen.load import load_spec

API = load_spec(SPEC)


def _message_class(full_name: str) -> type[Message]:
    m = API.message(full_name)
    obj: Any = importlib.import_module(f"oip.grpc.{m.module}_pb2")
    for part in m.py_path.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


def _endpoint(api: Api, ex: Example) -> tuple[RestEndpoint, dict[str, str]]:
    assert ex.rest is not None
    op = api.operation(ex.operation)
    for ep in op.rest:
        pattern = re.sub(r"\\\{([^{}]*)\\\}", r"(?P<\1>[^/]+)", re.escape(ep.path))
        m = re.fullmatch(pattern, ex.rest["path"])
        if m and ep.method == ex.rest["method"].upper():
            return ep, {p.field: m[p.name] for p in ep.params}
    raise AssertionError(f"{ex.name}: no REST operation of {ex.operation} matches {ex.rest['path']}")


def _bytes(msg: Message) -> bytes:
    return msg.SerializeToString(deterministic=True)


PAIRED = [
    ex for ex in API.examples
    if ex.rest and ex.grpc and ex.rest.get("status") == 200 and ex.grpc.get("code") == "OK"
]


def test_there_are_paired_cases() -> None:
    assert len(PAIRED) >= 30


@pytest.mark.parametrize("ex", PAIRED, ids=[ex.name for ex in PAIRED])
def test_request_rest_to_proto_is_byte_identical(ex: Example) -> None:
    from oip import convert, models

    assert ex.rest is not None and ex.grpc is not None
    ep, path = _endpoint(API, ex)
    rpc = API.operation(ex.operation).rpc
    reference = json_format.ParseDict(ex.grpc.get("request") or {}, _message_class(rpc.request)())
    raw = bool(ex.grpc.get("request", {}).get("raw_input_contents"))
    operation = API.operation(ex.operation).name
    if ep.body is None:  # the path alone fills the request, through the converter the REST transport uses
        built = convert.request_to_proto(operation, None, path=path)
        assert type(built) is _message_class(rpc.request) and _bytes(built) == _bytes(reference)
        return
    body = ex.rest.get("body") or {}
    converted = convert.request_to_proto(operation, body, raw=raw, path=path)
    assert _bytes(converted) == _bytes(reference)
    assert _bytes(convert.rest_to_proto(ep.body, body, raw=raw, path=path)) == _bytes(reference)
    # The typed form, through the pydantic model, gives the same bytes.
    model = getattr(models, ep.body).model_validate(body)
    typed = getattr(convert, f"{convert_name(ep.body)}_to_proto")(model, raw=raw, **path)
    assert _bytes(typed) == _bytes(reference)
    # And back: protobuf -> REST -> protobuf is stable.
    again = convert.rest_to_proto(ep.body, convert.proto_to_rest(ep.body, reference), raw=raw, path=path)
    assert _bytes(again) == _bytes(reference)


@pytest.mark.parametrize("ex", PAIRED, ids=[ex.name for ex in PAIRED])
def test_response_rest_to_proto_is_byte_identical(ex: Example) -> None:
    from oip import convert

    assert ex.rest is not None and ex.grpc is not None
    if ex.raw.get("compare") == "keys":
        pytest.skip("the case fixes only the response's keys")
    ep, _ = _endpoint(API, ex)
    rpc = API.operation(ex.operation).rpc
    reference = json_format.ParseDict(ex.grpc.get("response") or {}, _message_class(rpc.response)())
    if ep.response is None:
        assert ex.rest.get("response") in (None, {}) and _bytes(reference) == b""
        return
    expected = ex.rest["response"]
    raw = bool((ex.grpc.get("response") or {}).get("raw_output_contents"))
    converted = convert.rest_to_proto(ep.response, expected, raw=raw)
    assert _bytes(converted) == _bytes(reference)
    rest_only = {p.name: expected[p.name] for p in API.schema(ep.response).properties
                 if p.field is None and isinstance(expected, dict) and p.name in expected}
    assert convert.proto_to_rest(ep.response, reference, **rest_only) == expected


def convert_name(schema: str) -> str:
    from oipgen.api import snake_case

    return snake_case(schema)


def test_a_path_field_given_as_none_is_left_unset() -> None:
    """A route's optional path field that the request left out (no `/versions/V`) comes as None: the message keeps
    the field's default, with or without a body."""
    from oip import convert

    ready = convert.request_to_proto("model_ready", None, path={"name": "m", "version": None})
    assert (ready.name, ready.version) == ("m", "")  # type: ignore[attr-defined]
    infer = convert.request_to_proto("model_infer", {"inputs": []}, path={"model_name": "m", "model_version": None})
    assert (infer.model_name, infer.model_version) == ("m", "")  # type: ignore[attr-defined]


def test_request_to_proto_refuses_what_the_operation_does_not_take() -> None:
    from oip import convert

    with pytest.raises(convert.ConvertError, match="takes no request body"):
        convert.request_to_proto("server_live", {"x": 1})
    with pytest.raises(convert.ConvertError, match="'nope' is not a field"):
        convert.request_to_proto("model_ready", None, path={"nope": "x"})


def test_parameters_take_the_oneof_case_of_their_json_type() -> None:
    from oip import convert

    msg = convert.rest_to_proto(
        "InferenceRequest",
        {"parameters": {"b": True, "i": -3, "u": 2**64 - 1, "f": 0.5, "s": "x"}, "inputs": []},
    )
    cases = {k: v.WhichOneof("parameter_choice") for k, v in msg.parameters.items()}  # type: ignore[attr-defined]
    assert cases == {"b": "bool_param", "i": "int64_param", "u": "uint64_param", "f": "double_param",
                     "s": "string_param"}
    assert convert.proto_to_rest("InferenceRequest", msg)["parameters"] == {
        "b": True, "f": 0.5, "i": -3, "s": "x", "u": 2**64 - 1}


def test_a_parameters_map_reads_back_each_entry_that_has_a_case() -> None:
    """What servers and clients read of a gRPC parameters map: every entry with its case's value (bytes as base64,
    as REST writes them), an entry whose case was never set left out."""
    from oip import convert
    from oip.grpc import grpc_service_pb2 as pb

    message = pb.ModelInferRequest()
    message.parameters["s"].string_param = "x"
    message.parameters["unset"].SetInParent()  # present on the wire, no case: no value to give
    message.parameters["b"].bool_param = False
    message.parameters["u"].uint64_param = 2**64 - 1
    entries = pb.ModelInferRequest.FromString(message.SerializeToString()).parameters
    assert convert.params_from_proto(pb.InferParameter.DESCRIPTOR.full_name, entries) == {
        "s": "x", "b": False, "u": 2**64 - 1}
    load = pb.RepositoryModelLoadRequest()
    load.parameters["file:1/model.onnx"].bytes_param = b"\x00\xff"
    load.parameters["none"].SetInParent()
    assert convert.params_from_proto(pb.ModelRepositoryParameter.DESCRIPTOR.full_name, load.parameters) == {
        "file:1/model.onnx": "AP8="}


@pytest.mark.parametrize("value", [{"a": 1}, [1, 2], 2**64])
def test_parameters_that_have_no_grpc_form_are_refused(value: object) -> None:
    from oip import convert

    with pytest.raises(convert.ConvertError, match="parameter 'p'"):
        convert.rest_to_proto("InferenceRequest", {"parameters": {"p": value}, "inputs": []})


def test_repository_parameters_have_no_double_case() -> None:
    from oip import convert

    with pytest.raises(convert.ConvertError, match="allowed: bool, bytes, int, str"):
        convert.rest_to_proto("RepositoryModelLoadRequest", {"parameters": {"x": 0.5}})


def test_tensor_data_that_does_not_fit_its_shape_is_a_convert_error() -> None:
    from oip import convert

    with pytest.raises(convert.ConvertError, match="INPUT0"):
        convert.rest_to_proto("InferenceRequest", {"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3]}]})


def test_contents_in_two_fields_is_refused() -> None:
    from oip import convert
    from oip.grpc import grpc_service_pb2 as pb

    msg = pb.ModelInferResponse(model_name="m")
    out = msg.outputs.add(name="O", datatype="INT32", shape=[1])
    out.contents.int_contents.append(1)
    out.contents.fp32_contents.append(1.0)
    with pytest.raises(convert.ConvertError, match="more than one field"):
        convert.proto_to_rest("InferenceResponse", msg)


def test_unwrapped_map_round_trips_keyed_by_name() -> None:
    from oip import convert

    regions = [{"name": "b", "key": "/b", "offset": 0, "byte_size": 8},
               {"name": "a", "key": "/a", "offset": 16, "byte_size": 4}]
    msg = convert.rest_to_proto("SystemSharedMemoryStatusResponse", regions)
    assert sorted(msg.regions) == ["a", "b"]  # type: ignore[attr-defined]
    assert convert.proto_to_rest("SystemSharedMemoryStatusResponse", msg) == sorted(regions, key=lambda r: r["name"])


def test_model_config_enums_and_oneof_messages_round_trip() -> None:
    from oip import convert, models

    config = {
        "name": "simple", "platform": "python", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
        "version_policy": {"all": {}},
        "dynamic_batching": {"max_queue_delay_microseconds": 100},
        "model_transaction_policy": {"decoupled": False},
    }
    msg = convert.model_config_response_to_proto(models.ModelConfigResponse.model_validate(config))
    assert msg.config.input[0].data_type == 8 and msg.config.version_policy.HasField("all")
    back = convert.proto_to_rest("ModelConfigResponse", msg)
    assert back["input"] == config["input"] and back["version_policy"] == {"all": {}}
    assert back["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
