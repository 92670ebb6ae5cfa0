"""The server's OpenAPI document: the spec's own, plus each ready model's inference request and response schemas,
following loads and unloads. The document is checked as OpenAPI 3.1, and real requests and answers of the server
against the schemas it publishes. About 15 s."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import serving
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

# Tensor names that need escaping in paths and schemas; a model that batches; FP16 (no JSON data).
ODD_MODEL = '''
import numpy as np

from oip.server.model import Model, TensorSpec


class Odd(Model):
    max_batch_size = 4
    inputs = [TensorSpec("INPUT-0", "INT8", [3]), TensorSpec("half", "FP16", [-1]), TensorSpec("text", "BYTES", [])]
    outputs = [TensorSpec("OUT/0", "INT8", [3]), TensorSpec("flag", "BOOL", [])]

    def infer(self, inputs, parameters):
        batch = inputs["INPUT-0"].shape[0]
        return {"OUT/0": inputs["INPUT-0"], "flag": np.ones(batch, dtype=bool)}
'''
LATE_MODEL = '''
from oip.server.model import Model, TensorSpec


class Late(Model):
    inputs = [TensorSpec("X", "FP64", [2, -1])]
    outputs = [TensorSpec("Y", "FP64", [2, -1])]

    def infer(self, inputs, parameters):
        return {"Y": inputs["X"]}
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serving.Server]:
    root = tmp_path_factory.mktemp("openapi_models")
    repository = serving.build_repository(root / "models", only=("simple", "mymodel"))
    (repository / "odd model").mkdir()
    (repository / "odd model" / "model.toml").write_text('class = "model:Odd"\nversions = ["1", "2"]\n')
    (repository / "odd model" / "model.py").write_text(ODD_MODEL)
    with serving.running(repository, root / "server", ready=("simple", "mymodel", "odd model")) as running:
        yield running


def document(http: httpx.Client) -> dict[str, Any]:
    response = http.get("/openapi.json")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    doc: dict[str, Any] = response.json()
    return doc


def validator(doc: dict[str, Any], schema: str) -> Draft202012Validator:
    """A JSON Schema validator of the document's component `schema` (OpenAPI 3.1 schemas are JSON Schema 2020-12)."""
    registry: Registry[Any] = Registry().with_resource("urn:doc", Resource.from_contents(doc, DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{schema}"}, registry=registry)


def infer_schemas(doc: dict[str, Any], path: str) -> tuple[str, str]:
    """The component names of the request and 200 answer of the inference operation at `path`."""
    operation = doc["paths"][path]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    prefix = "#/components/schemas/"
    assert request.startswith(prefix) and answer.startswith(prefix)
    return request.removeprefix(prefix), answer.removeprefix(prefix)


def test_the_document_is_openapi_31_with_each_models_schemas(http: httpx.Client) -> None:
    doc = document(http)
    validate(doc)  # OpenAPI 3.1, schemas included
    paths = doc["paths"]
    for path in ("/v2/models/simple/infer", "/v2/models/simple/versions/1/infer", "/v2/models/mymodel/infer",
                 "/v2/models/odd%20model/infer", "/v2/models/odd%20model/versions/1/infer",
                 "/v2/models/odd%20model/versions/2/infer"):
        assert path in paths, sorted(paths)
        operation = paths[path]["post"]
        assert not [p for p in operation.get("parameters", []) if p.get("in") == "path"], operation
        assert operation["tags"] == [f"model {path.split('/')[3].replace('%20', ' ')}"]
    # the spec's own operations stay, and its schemas are untouched
    assert "/v2/models/{model_name}/infer" in paths and "/v2/health/live" in paths
    operation_ids = [op["operationId"] for item in paths.values() for op in item.values() if isinstance(op, dict)]
    assert len(operation_ids) == len(set(operation_ids))
    request, _ = infer_schemas(doc, "/v2/models/simple/infer")
    schema = doc["components"]["schemas"][request]
    assert schema["allOf"][0] == {"$ref": "#/components/schemas/InferenceRequest"}
    text = str(schema)
    assert "'INPUT0'" in text and "'INT32'" in text and "INPUT1" in text


def test_docs_page(http: httpx.Client) -> None:
    response = http.get("/docs")
    assert response.status_code == 200 and "swagger" in response.text.lower() and "/openapi.json" in response.text


def _simple(a: list[int], b: list[int], shape: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": a},
                       {"name": "INPUT1", "datatype": "INT32", "shape": shape, "data": b}]}


def test_generate_requests_and_answers_match_the_published_schemas(http: httpx.Client) -> None:
    """A model's own generate operations: what the schemas accept the server runs, what they refuse it refuses,
    and its answers (JSON, and each event of the stream) fit the answer schema."""
    doc = document(http)
    request_name, answer_name = infer_schemas(doc, "/v2/models/simple/generate")
    assert request_name == "simple.GenerateRequest" and answer_name == "simple.GenerateResponse"
    stream = doc["paths"]["/v2/models/simple/generate_stream"]["post"]
    event = stream["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert event["properties"]["data"]["contentSchema"] == {"$ref": f"#/components/schemas/{answer_name}"}
    requests, answers = validator(doc, request_name), validator(doc, answer_name)
    a, b = list(range(16)), [1] * 16
    good = [
        {"INPUT0": a, "INPUT1": b},
        {"INPUT0": a, "parameters": {"INPUT1": b, "p": "x"}, "id": "r1", "q": 2.5},
        {"INPUT0": a, "INPUT1": b, "binary_data_output": False, "triton_enable_empty_final_response": 1},
    ]
    for body in good:
        assert not list(requests.iter_errors(body)), body
        response = http.post("/v2/models/simple/generate", json=body)
        assert response.status_code == 200, response.text
        assert not list(answers.iter_errors(response.json())), response.json()
        assert response.json()["OUTPUT0"] == [x + y for x, y in zip(a, b, strict=True)]
        events = http.post("/v2/models/simple/generate_stream", json=body)
        assert events.status_code == 200, events.text
        data = [line.removeprefix("data: ") for line in events.text.splitlines() if line.startswith("data: ")]
        assert len(data) == 1 and not list(answers.iter_errors(json.loads(data[0]))), events.text
    bad = [
        {"INPUT0": a},  # an input missing
        {"INPUT0": a, "INPUT1": b[:15]},  # too few elements
        {"INPUT0": a, "INPUT1": [[1] * 16]},  # nested
        {"INPUT0": a, "INPUT1": 1},  # one element for sixteen
        {"INPUT0": a, "INPUT1": [2**31] * 16},  # out of INT32's range
        {"INPUT0": a, "INPUT1": ["1"] * 16},  # strings for INT32
        {"INPUT0": a, "INPUT1": b, "parameters": {"INPUT1": b}},  # an input twice
        {"INPUT0": a, "INPUT1": b, "p": [1]},  # a parameter that is not a scalar
        {"INPUT0": a, "INPUT1": b, "parameters": {"p": None}},
        {"INPUT0": a, "INPUT1": b, "triton_x": 1},  # a reserved key
        {"INPUT0": a, "INPUT1": b, "binary_data_output": 1},  # a boolean parameter of another type
        {"INPUT0": a, "INPUT1": b, "id": 7},
        {"INPUT0": a, "INPUT1": b, "parameters": 3},
    ]
    for body in bad:
        assert list(requests.iter_errors(body)), body
        assert http.post("/v2/models/simple/generate", json=body).status_code == 400, body  # and the server agrees


def test_real_requests_and_answers_match_the_published_schemas(http: httpx.Client) -> None:
    doc = document(http)
    request_name, answer_name = infer_schemas(doc, "/v2/models/simple/infer")
    requests, answers = validator(doc, request_name), validator(doc, answer_name)
    good = [
        _simple(list(range(16)), [1] * 16, [1, 16]),
        _simple([list(range(16))], [[1] * 16], [1, 16]),  # nested like the shape
        {**_simple(list(range(16)), [1] * 16, [1, 16]), "id": "x", "outputs": [{"name": "OUTPUT1"}]},
    ]
    for body in good:
        assert not list(requests.iter_errors(body)), body
        response = http.post("/v2/models/simple/infer", json=body)
        assert response.status_code == 200, response.text
        assert not list(answers.iter_errors(response.json())), response.json()
    bad = [
        _simple(list(range(16)), [1] * 16, [2, 8]),  # another shape
        _simple(list(range(15)), [1] * 16, [1, 16]),  # too few elements
        _simple(list(range(16)), [2**31] * 16, [1, 16]),  # out of INT32's range
        {"inputs": _simple(list(range(16)), [1] * 16, [1, 16])["inputs"][:1]},  # an input missing
        {"inputs": _simple(list(range(16)), [1] * 16, [1, 16])["inputs"][:1] * 2},  # one input twice
        {**_simple(list(range(16)), [1] * 16, [1, 16]), "outputs": [{"name": "OUTPUT7"}]},  # unknown output
        {"inputs": [{**t, "datatype": "FP32"} for t in _simple(list(range(16)), [1] * 16, [1, 16])["inputs"]]},
        {**_simple(list(range(16)), [1] * 16, [1, 16]), "outputs": [{"name": "OUTPUT1"}] * 2},  # one output twice
        {"inputs": [{k: v for k, v in t.items() if k != "data"}  # no data
                    for t in _simple(list(range(16)), [1] * 16, [1, 16])["inputs"]]},
        {**_simple(list(range(16)), [1] * 16, [1, 16]), "parameters": {"triton_x": 1}},  # a reserved key
    ]
    for body in bad:
        assert list(requests.iter_errors(body)), body
        assert http.post("/v2/models/simple/infer", json=body).status_code == 400, body  # and the server agrees
    # A model's own operation is the JSON form of its inference: data in `data`, not in the binary part of the
    # body nor in shared memory (the spec's operation describes those forms, for every model).
    operation = doc["paths"]["/v2/models/simple/infer"]["post"]
    assert not [p for p in operation.get("parameters", []) if p.get("in") == "header"], operation
    assert set(operation["responses"]["200"]["content"]) == {"application/json", "application/octet-stream"}
    good_body = _simple(list(range(16)), [1] * 16, [1, 16])
    for where, parameters in (("inputs", {"binary_data_size": 64}), ("inputs", {"shared_memory_region": "r"}),
                              ("outputs", {"shared_memory_region": "r", "shared_memory_byte_size": 64})):
        tensors = [{**t, "parameters": parameters} for t in good_body["inputs"]] if where == "inputs" else [
            {"name": "OUTPUT0", "parameters": parameters}]
        assert list(requests.iter_errors({**good_body, where: tensors})), (where, parameters)
    classified = {**good_body, "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]}
    assert not list(requests.iter_errors(classified))
    response = http.post("/v2/models/simple/infer", json=classified)
    assert response.status_code == 200 and not list(answers.iter_errors(response.json())), response.text


def test_batching_bytes_fp16_and_versions(http: httpx.Client) -> None:
    doc = document(http)
    request_name, answer_name = infer_schemas(doc, "/v2/models/odd%20model/versions/2/infer")
    requests, answers = validator(doc, request_name), validator(doc, answer_name)
    body = {"inputs": [{"name": "INPUT-0", "datatype": "INT8", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
                       {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
                       {"name": "half", "datatype": "FP16", "shape": [2, 1], "parameters": {"binary_data_size": 4}}]}
    assert not list(requests.iter_errors(body))
    # FP16 has no JSON form, the batch dimension is -1 (any), INT8 is bounded
    assert list(requests.iter_errors({**body, "inputs": [*body["inputs"][:2], {**body["inputs"][2], "data": [1, 2]}]}))
    assert list(requests.iter_errors({**body, "inputs": [{**body["inputs"][0], "data": [1, 2, 3, 4, 5, 300]},
                                                         *body["inputs"][1:]]}))
    half = np.array([[1.5], [2.5]], dtype="<f2").tobytes()
    payload = httpx.Request("POST", "/", json=body).content
    response = http.post("/v2/models/odd%20model/versions/2/infer", content=payload + half,
                         headers={"Inference-Header-Content-Length": str(len(payload)),
                                  "Content-Type": "application/octet-stream"})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert not list(answers.iter_errors(answer)), answer
    assert list(answers.iter_errors({**answer, "model_version": "1"}))  # the versioned path answers its version
    assert list(answers.iter_errors({**answer, "model_name": "simple"}))
    # a model with an input that has no JSON form takes the binary form: the header stays, binary_data_size too
    operation = doc["paths"]["/v2/models/odd%20model/versions/2/infer"]["post"]
    assert [p["name"] for p in operation["parameters"] if p.get("in") == "header"] == [
        "Inference-Header-Content-Length"]


def test_the_document_follows_loads_and_unloads(server: serving.Server, http: httpx.Client) -> None:
    before = document(http)
    assert "/v2/models/mymodel/infer" in before["paths"]
    assert http.post("/v2/repository/models/mymodel/unload").status_code == 200
    after_unload = document(http)
    assert not [p for p in after_unload["paths"] if "/mymodel/" in p]
    assert not [s for s in after_unload["components"]["schemas"] if s.startswith("mymodel.")]
    assert not [t for t in after_unload.get("tags", []) if t["name"] == "model mymodel"]
    assert "/v2/models/simple/infer" in after_unload["paths"]
    validate(after_unload)

    folder = server.repository / "late"
    folder.mkdir()
    (folder / "model.toml").write_text('class = "model:Late"\n')
    (folder / "model.py").write_text(textwrap.dedent(LATE_MODEL))
    assert http.post("/v2/repository/models/late/load").status_code == 200
    assert http.post("/v2/repository/models/mymodel/load").status_code == 200
    loaded = document(http)
    assert "/v2/models/late/infer" in loaded["paths"] and "/v2/models/mymodel/infer" in loaded["paths"]
    request_name, _ = infer_schemas(loaded, "/v2/models/late/infer")
    requests = validator(loaded, request_name)
    x = {"name": "X", "datatype": "FP64", "shape": [2, 5], "data": [0.5] * 10}
    assert not list(requests.iter_errors({"inputs": [x]}))
    assert list(requests.iter_errors({"inputs": [{**x, "shape": [3, 5]}]}))
    late = {f"/v2/models/late/{version}{op}" for version in ("", "versions/1/")
            for op in ("infer", "generate", "generate_stream")}
    assert loaded["paths"].keys() - before["paths"].keys() == late
    validate(loaded)
