"""`bodies`: REST bodies read and completed without protobuf (the REST client's path) give what the protobuf path
gives (the gRPC client's and the server's), and answers that break their schema are refused, naming the property."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from oip import bodies, convert

from oipgen.api import Api


def _through_protobuf(schema: str, body: Any) -> Any:
    return bodies.complete(schema, convert.proto_to_rest(schema, convert.rest_to_proto(schema, copy.deepcopy(body))))


def _cases(api: Api) -> list[tuple[str, str, Any]]:
    """(case, schema, body) of every golden REST body, request or answer, whose schema carries no tensor data."""
    out = []
    for example in api.examples:
        if not example.rest or example.rest.get("status") != 200:
            continue
        rpcs = {op.rpc.name for op in api.operations}
        if example.operation not in rpcs:  # an operation only REST has: its bodies are no message's
            continue
        for endpoint in api.operation(example.operation).rest:
            for schema, body in ((endpoint.body, example.rest.get("body")), (endpoint.response,
                                                                            example.rest.get("response"))):
                if schema in bodies.BINDINGS and body is not None and "Inference" not in schema:
                    out.append((example.name, schema, body))
            break
    return out


def test_every_golden_body_reads_as_through_protobuf(api: Api) -> None:
    cases = _cases(api)
    assert len({schema for _, schema, _ in cases}) >= 6, sorted({schema for _, schema, _ in cases})
    for name, schema, body in cases:
        assert bodies.read(schema, copy.deepcopy(body)) == _through_protobuf(schema, body), name


def test_defaults_are_completed_and_unknown_properties_dropped() -> None:
    read = bodies.read("MetadataServerResponse", {"name": "s", "surprise": 1})
    assert read == {"name": "s", "version": "", "extensions": []}
    assert read == _through_protobuf("MetadataServerResponse", {"name": "s"})


def test_maps_are_listed_in_key_order_and_bytes_unwrapped() -> None:
    regions = [{"name": n, "key": f"/{n}", "byte_size": 8} for n in ("b", "a")]
    read = bodies.read("SystemSharedMemoryStatusResponse", regions)
    assert [r["name"] for r in read] == ["a", "b"] and read[0]["offset"] == 0
    assert read == _through_protobuf("SystemSharedMemoryStatusResponse", regions)
    body = {"raw_handle": {"b64": "AAE="}, "device_id": 0, "byte_size": 2}
    assert bodies.read("CudaSharedMemoryRegisterRequest", body)["raw_handle"] == "AAE="


@pytest.mark.parametrize(("schema", "body", "message"), [
    ("MetadataServerResponse", {"name": 5}, "MetadataServerResponse.name: 5 is not a valid str"),
    ("MetadataServerResponse", {"extensions": "x"}, "expected a JSON array"),
    ("MetadataServerResponse", [], "expected a JSON object"),
    ("SystemSharedMemoryStatusResponse", [{"name": "a", "byte_size": -1}], "-1 is not a valid uint64"),
    ("SystemSharedMemoryStatusResponse", [{"name": "a", "byte_size": True}], "True is not a valid uint64"),
    ("CudaSharedMemoryRegisterRequest", {"raw_handle": "not base64!"}, "raw_handle: not valid base64"),
    ("ModelConfigResponse", {"name": "m", "input": [{"name": "x", "data_type": "TYPE_NOPE"}]},
     "'TYPE_NOPE' is not one of TYPE_INVALID"),
])
def test_answers_that_break_their_schema_are_refused(schema: str, body: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bodies.read(schema, body)
