"""Each model's own operations in the OpenAPI document (`model_document`): the spec's inference and generate paths
made concrete for every ready model (and version), with request and response schemas narrowed to the model's
metadata."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

import numpy as np

from ... import datatypes, extensions, framing
from ...grpc import grpc_service_pb2 as pb
from ..core import generate, validation
from ..core.dataplane_base import TENSOR_OPERATIONS
from ..core.streaming import EMPTY_FINAL
from .document import DOCUMENT
from .endpoints import ENDPOINTS, REST_ONLY_ENDPOINTS

__all__ = ["MODEL_ENDPOINTS", "model_document"]


def _variable(params: Sequence[tuple[str, str]], field: str) -> str:
    return next((variable for variable, filled in params if filled == field), "")


# The REST operations of the spec that run one model: path, method, the path variables that name the model and the
# version ("": none), and the kind of operation ("infer" or "generate"), whose request and answer schemas
# `model_document` narrows per model (`_NARROWING`).
MODEL_ENDPOINTS: Final[tuple[tuple[str, str, str, str, str], ...]] = (
    *((e.path, e.method.lower(), _variable(e.params, "model_name"), _variable(e.params, "model_version"), "infer")
      for e in ENDPOINTS if e.operation in TENSOR_OPERATIONS and e.body and e.response),
    *((e.path, e.method.lower(), _variable(e.params, "model_name"), _variable(e.params, "model_version"),
       "generate")
      for e in REST_ONLY_ENDPOINTS if e.operation in ("generate", "generate_stream")),
)
_SCHEMAS: Final = "#/components/schemas/"
# The parameter keys that make a tensor travel outside the JSON body (binary data after it, shared memory): a
# model's own operation describes the JSON form of its inference, so its inputs carry `data` and none of these.
_NOT_JSON_INPUT: Final = tuple(
    key for key, extension in extensions.PARAMETERS.items()
    if key == extensions.BINARY_DATA_SIZE or extension == "system_shared_memory"
)
_NOT_JSON_OUTPUT: Final = tuple(key for key, extension in extensions.PARAMETERS.items()
                                if extension == "system_shared_memory")
_JSON: Final = "application/json"
_EVENTS: Final = "text/event-stream"
# The last document `model_document` made: its base, what it was made from, and the document (one entry).
_LAST: Final[list[tuple[dict[str, Any], tuple[tuple[str, bytes], ...], dict[str, Any]]]] = []


def model_document(
    models: Iterable[tuple[str, pb.ModelMetadataResponse]], base: dict[str, Any] = DOCUMENT
) -> dict[str, Any]:
    """`base` (`DOCUMENT`, or the part of it a server publishes) with each model's own operations: for every
    (version, metadata) of `models` (version "": the one the server picks), the inference and generate paths of
    `base` (`MODEL_ENDPOINTS`) made concrete for that model (and version), whose request and answer schemas narrow
    the spec's to the model's tensors: names, datatypes, shapes (-1: any size), element counts and ranges, and one
    tag per model; every status and header as `base` has it. The templated paths of `base` then name only the
    models that are not served (`_elsewhere`). `base` itself is never changed; with no models it is returned.

    The last document is kept and returned again (the same object: read it, do not change it) while the base and
    the models' metadata are the same, so that asking again costs no more than comparing the metadata."""
    given = list(models)
    if not given:
        return base
    made_from = tuple((version, metadata.SerializeToString(deterministic=True)) for version, metadata in given)
    if _LAST and _LAST[0][0] is base and _LAST[0][1] == made_from:
        return _LAST[0][2]
    doc = dict(base)
    paths = doc["paths"] = dict(base.get("paths", {}))
    components = doc["components"] = dict(base.get("components", {}))
    schemas = components["schemas"] = dict(components.get("schemas", {}))
    tags = doc["tags"] = list(base.get("tags", []))
    tagged: set[str] = set()
    operations = [(path, method, model_var, version_var, _NARROWING[kind], spec_operation)
                  for path, method, model_var, version_var, kind in MODEL_ENDPOINTS
                  if isinstance(spec_operation := base.get("paths", {}).get(path, {}).get(method), dict)
                  and all(_components(spec_operation))]
    suffixes = sorted({part for *_, spec_operation in operations for part in _components(spec_operation)})
    for version, metadata in given:
        name = metadata.name
        key = _unique(_key(name + (f".v{version}" if version else "")), schemas, suffixes)
        about = _about(metadata, version)
        for path, method, model_var, version_var, narrowing, spec_operation in operations:
            if bool(version) != bool(version_var) or not model_var:
                continue
            values = {model_var: name, **({version_var: version} if version_var else {})}
            concrete = path
            for var, value in values.items():
                concrete = concrete.replace("{" + var + "}", quote(value, safe=""))
            if concrete in paths:
                continue
            body, response = _components(spec_operation)
            request, answer = f"{key}.{body}", f"{key}.{response}"
            schemas[request] = narrowing.request(metadata, body, about)
            schemas[answer] = narrowing.answer(metadata, version, response, about)
            paths[concrete] = {method: _operation(spec_operation, set(values), request, answer, response, name,
                                                  version, summary=narrowing.summary, binary=_binary(metadata))}
        tag = f"model {name}"
        if tag not in tagged:
            tagged.add(tag)
            tags.append({"name": tag, "description": _about(metadata, "")})
    served = sorted({metadata.name for _, metadata in given})
    for path, method, model_var, _, _ in MODEL_ENDPOINTS:
        spec_operation = paths.get(path, {}).get(method)
        if model_var and isinstance(spec_operation, dict):
            paths[path] = {**paths[path], method: _elsewhere(spec_operation, model_var, served)}
    _LAST[:] = [(base, made_from, doc)]
    return doc


def _elsewhere(base: Mapping[str, Any], model_var: str, served: list[str]) -> dict[str, Any]:
    """The spec's templated operation `base` (inference or generate) beside the served models' own: a concrete
    path matches before a templated one (OpenAPI), so the templated operation only ever serves the names in
    `model_var` that are not among `served` (an unknown model: 404), and its path parameter says so."""
    operation = copy.deepcopy(dict(base))
    parameters = operation["parameters"] = [copy.deepcopy(_resolve(p)) for p in operation.get("parameters", [])]
    for parameter in parameters:
        if parameter.get("in") == "path" and parameter.get("name") == model_var:
            schema = parameter["schema"] = dict(parameter.get("schema", {}))
            schema["not"] = {"enum": served}
            about = parameter.get("description")
            parameter["description"] = (
                "Any model but those served with an operation of their own (`/v2/models/<name>/...`), which a "
                "concrete path answers first." + (f" {about}" if about else "")
            )
    return operation


def _key(text: str) -> str:
    """A component name for `text` (OpenAPI allows letters, digits, '.', '-' and '_')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def _unique(key: str, schemas: Mapping[str, Any], suffixes: Iterable[str]) -> str:
    candidate, n = key, 1
    while any(f"{candidate}.{suffix}" in schemas for suffix in suffixes):
        n += 1
        candidate = f"{key}_{n}"
    return candidate


def _about(metadata: pb.ModelMetadataResponse, version: str) -> str:
    """One line per tensor, in Markdown: what /docs shows of the model."""
    head = f"Model `{metadata.name}`" + (f", version {version}" if version else "")
    if metadata.platform:
        head += f" ({metadata.platform})"
    lines = [head + ".", ""]
    for kind, tensors in (("input", metadata.inputs), ("output", metadata.outputs)):
        for t in tensors:
            lines.append(f"* {kind} `{t.name}`: {t.datatype} {list(t.shape)}")
    return "\n".join(lines) + "\n\nShapes: -1 is any size."


def _element(datatype: str) -> dict[str, Any] | None:
    """The schema of one JSON `data` element of `datatype`; None when the datatype has no JSON form."""
    info = datatypes.BY_NAME.get(datatype)
    if info is None:
        return {}
    if not info.json:
        return None
    kind = info.dtype.kind
    if kind == "b":
        return {"type": "boolean"}
    if kind in "iu":
        limits = np.iinfo(info.dtype)
        return {"type": "integer", "minimum": int(limits.min), "maximum": int(limits.max)}
    if kind == "f":
        largest = np.finfo(info.dtype).max
        if info.dtype.itemsize >= 8:
            return {"type": "number", "minimum": -float(largest), "maximum": float(largest)}
        # a narrower float takes every number that rounds to a finite value: below its largest plus half a step
        bound = float(largest) + (float(largest) - float(np.nextafter(largest, largest.dtype.type(0)))) / 2
        return {"type": "number", "exclusiveMinimum": -bound, "exclusiveMaximum": bound}
    return {"type": "string"}


def _data(shape: Sequence[int], element: dict[str, Any]) -> dict[str, Any]:
    """The schema of `data` for a tensor of `shape`: flat, or nested like the shape (dimensions of -1: any)."""
    flat: dict[str, Any] = {"type": "array", "items": element}
    if all(d >= 0 for d in shape):
        flat["minItems"] = flat["maxItems"] = math.prod(shape)
    if len(shape) <= 1:
        return flat
    nested: dict[str, Any] = element
    for dim in reversed(shape):
        nested = {"type": "array", "items": nested, **({"minItems": dim, "maxItems": dim} if dim >= 0 else {})}
    return {"anyOf": [flat, nested]}


def _binary(metadata: pb.ModelMetadataResponse) -> bool:
    """Whether the model takes an input that has no JSON form (so its requests carry binary tensor data)."""
    return any(_element(t.datatype) is None for t in metadata.inputs)


def _tensor(tensor: pb.ModelMetadataResponse.TensorMetadata, request: bool = False) -> dict[str, Any]:
    """The schema of one tensor of a request (`request`: an input in its JSON form, `data` required) or of an
    answer: its name, datatype, shape and data."""
    shape = list(tensor.shape)
    dims: dict[str, Any] = {"type": "array", "minItems": len(shape), "maxItems": len(shape)}
    if shape:
        dims["prefixItems"] = [{"const": d} if d >= 0 else {"type": "integer", "minimum": 0} for d in shape]
    schema: dict[str, Any] = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {"name": {"const": tensor.name}, "datatype": {"const": tensor.datatype}, "shape": dims},
    }
    element = _element(tensor.datatype)
    if element is None:
        schema["description"] = f"{tensor.datatype} has no JSON form: send it as binary tensor data"
        schema["not"] = {"required": ["data"]}
    else:
        schema["properties"]["data"] = _data(shape, element)
        if request:
            schema["required"].append("data")
            schema["properties"]["parameters"] = {
                "type": "object", "properties": dict.fromkeys(_NOT_JSON_INPUT, False)}
    return schema


def _request_schema(metadata: pb.ModelMetadataResponse, base: str, about: str) -> dict[str, Any]:
    inputs: dict[str, Any] = {"type": "array", "minItems": len(metadata.inputs), "maxItems": len(metadata.inputs)}
    if metadata.inputs:
        inputs["items"] = {"oneOf": [_tensor(t, request=not _binary(metadata)) for t in metadata.inputs]}
        # every input present (and, with as many items as inputs, each exactly once)
        inputs["allOf"] = [
            {"contains": {"type": "object", "required": ["name"], "properties": {"name": {"const": t.name}}}}
            for t in metadata.inputs
        ]
    outputs: dict[str, Any] = {"type": "array", "maxItems": len(metadata.outputs)}
    if metadata.outputs:
        outputs["items"] = {"oneOf": [_requested(t) for t in metadata.outputs]}
        # each output at most once
        outputs["allOf"] = [
            {"contains": {"type": "object", "required": ["name"], "properties": {"name": {"const": t.name}}},
             "minContains": 0, "maxContains": 1}
            for t in metadata.outputs
        ]
    return {
        "description": f"An inference request of model `{metadata.name}`.\n\n{about}",
        "allOf": [
            {"$ref": _SCHEMAS + base},
            {"type": "object", "properties": {"inputs": inputs, "outputs": outputs}},
        ],
    }


def _requested(tensor: pb.ModelMetadataResponse.TensorMetadata) -> dict[str, Any]:
    """The schema of one requested output in the JSON form: its name; written to no shared memory; classified only
    when its datatype can be ranked."""
    forbidden = list(_NOT_JSON_OUTPUT)
    if not _ranked(tensor.datatype):
        forbidden.append(extensions.CLASSIFICATION)
    return {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"const": tensor.name},
            "parameters": {"type": "object", "properties": dict.fromkeys(forbidden, False)},
        },
    }


def _ranked(datatype: str) -> bool:
    """Whether the classification extension can rank a tensor of `datatype` (numbers with a JSON form)."""
    info = datatypes.BY_NAME.get(datatype)
    return info is not None and info.json and info.dtype.kind in "iuf"


def _answer_schema(metadata: pb.ModelMetadataResponse, version: str, base: str, about: str) -> dict[str, Any]:
    outputs: dict[str, Any] = {"type": "array", "maxItems": len(metadata.outputs)}
    if metadata.outputs:
        outputs["items"] = {"oneOf": [_output(t) for t in metadata.outputs]}
    properties: dict[str, Any] = {"model_name": {"const": metadata.name}, "outputs": outputs}
    if version:
        properties["model_version"] = {"const": version}
    return {
        "description": f"The answer of model `{metadata.name}` to an inference request.\n\n{about}",
        "allOf": [{"$ref": _SCHEMAS + base}, {"type": "object", "properties": properties}],
    }


def _output(tensor: pb.ModelMetadataResponse.TensorMetadata) -> dict[str, Any]:
    """An output as declared, or, for a datatype the classification extension ranks, its classes (BYTES)."""
    schema = _tensor(tensor)
    if not _ranked(tensor.datatype):
        return schema
    classes = {
        "type": "object",
        "description": "the output as classes (classification extension)",
        "required": ["name", "datatype"],
        "properties": {"name": {"const": tensor.name}, "datatype": {"const": "BYTES"}},
    }
    return {"anyOf": [schema, classes]}


def _operation(base: Mapping[str, Any], fixed: set[str], request: str, answer: str, response: str, name: str,
               version: str, summary: str, binary: bool) -> dict[str, Any]:
    """The spec's operation `base` for one model: the path variables in `fixed` filled in, the JSON body and every
    answer content of the spec's `response` schema (JSON, or the events of a stream) narrowed to the model's
    schemas; every other part (statuses, answer headers) as the spec has it. Unless the model takes an input that
    has no JSON form (`binary`), the request is the JSON form alone, so without the header of binary tensor data
    (the spec's inference operation describes that form for every model)."""
    operation = copy.deepcopy(dict(base))
    suffix = f".{_key(name)}" + (f".{_key(version)}" if version else "")
    operation["operationId"] = f"{base.get('operationId', 'infer')}{suffix}"
    operation["summary"] = f"{summary} {name}" + (f", version {version}." if version else ".")
    operation["tags"] = [f"model {name}"]
    operation["parameters"] = [
        p for p in operation.get("parameters", [])
        if not (_resolve(p).get("in") == "path" and _resolve(p).get("name") in fixed)
        and (binary or not (_resolve(p).get("in") == "header" and _resolve(p).get("name") == framing.HEADER_LENGTH))
    ]
    body = operation["requestBody"] = copy.deepcopy(_resolve(operation.get("requestBody", {})))
    body.setdefault("content", {}).setdefault(_JSON, {})["schema"] = {"$ref": _SCHEMAS + request}
    responses = operation.setdefault("responses", {})
    ok = responses["200"] = copy.deepcopy(_resolve(responses.get("200", {"description": "The answer."})))
    for media, content in ok.setdefault("content", {}).items():
        if content.get("schema") == {"$ref": _SCHEMAS + response}:
            content["schema"] = _events(answer) if media == _EVENTS else {"$ref": _SCHEMAS + answer}
    return operation


def _events(answer: str) -> dict[str, Any]:
    """One server-sent event whose `data` is the JSON of an `answer` (the schema of a `text/event-stream` content
    describes each event, as OpenAPI 3.2's `itemSchema` does)."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"type": "string", "contentMediaType": _JSON, "contentSchema": {"$ref": _SCHEMAS + answer}}},
    }


def _components(operation: Mapping[str, Any]) -> tuple[str, str]:
    """The component names of the JSON body and of the 200 answer of a spec operation ("" where it has none)."""
    body = _resolve(operation.get("requestBody", {})).get("content", {}).get(_JSON, {}).get("schema", {})
    ok = _resolve(operation.get("responses", {}).get("200", {})).get("content", {})
    answers = [content.get("schema", {}).get("$ref", "") for content in ok.values()]
    response = next((ref for ref in answers if ref.startswith(_SCHEMAS)), "")
    return body.get("$ref", "").removeprefix(_SCHEMAS), response.removeprefix(_SCHEMAS)


# ------------------------------------------------------------------------------------------- generate extension


def _generate_request(metadata: pb.ModelMetadataResponse, base: str, about: str) -> dict[str, Any]:
    """A generate body of the model as `generate.request` reads it: every input once, as a top-level key or in
    `parameters`, a scalar or a flat array whose elements fit the input's shape and datatype; `id` a string; every
    other key of either object a request parameter (a scalar; reserved keys as the data plane takes them)."""
    inputs = {t.name: _generate_value(list(t.shape), _element(t.datatype)) for t in metadata.inputs}
    nested = generate.PARAMETERS not in inputs
    known = [*inputs, *_BOOLEAN_PARAMETERS, *_ANY_PARAMETERS]
    top = _parameters(inputs, (generate.ID, generate.PARAMETERS))
    properties = top["properties"]
    properties[generate.ID] = {"type": "string"}
    if nested:
        properties[generate.PARAMETERS] = _parameters(inputs, (generate.ID,))
        # a key in both objects is given twice (400)
        top["dependentSchemas"] = {
            k: {"properties": {generate.PARAMETERS: {"not": {"required": [k]}}}} for k in known}
        top["allOf"] = [{"anyOf": [{"required": [name]}, {"required": [generate.PARAMETERS], "properties": {
            generate.PARAMETERS: {"required": [name]}}}]} for name in inputs]
    elif inputs:
        top["required"] = list(inputs)
    return {"description": f"A generate request of model `{metadata.name}`.\n\n{about}",
            "allOf": [{"$ref": _SCHEMAS + base}, top]}


# Request parameters the data plane reads as booleans, and one it drops whatever its value.
_BOOLEAN_PARAMETERS: Final = tuple(sorted((validation.TRANSPORT_PARAMETERS | validation.RESERVED_ALLOWED)
                                          - {EMPTY_FINAL}))
_ANY_PARAMETERS: Final = (EMPTY_FINAL,)
_SCALAR: Final = {"anyOf": [{"type": "boolean"}, {"type": "number"}, {"type": "string"}]}


def _parameters(inputs: Mapping[str, Any], keys: Sequence[str] = ()) -> dict[str, Any]:
    """A generate object (the body or its `parameters`): `inputs` by name, the reserved request parameters the
    data plane takes, the other `keys` (their schemas added by the caller), and any other key that is not reserved
    (`triton_*`) a scalar request parameter."""
    properties = {**inputs, **{key: {"type": "boolean"} for key in _BOOLEAN_PARAMETERS},
                  **{key: _SCALAR for key in _ANY_PARAMETERS}}
    return {
        "type": "object",
        "properties": properties,
        "propertyNames": {"anyOf": [{"enum": [*properties, *keys]},
                                    {"not": {"pattern": "^" + re.escape(validation.RESERVED_PREFIX)}}]},
        "additionalProperties": _SCALAR,
    }


def _generate_value(shape: Sequence[int], element: dict[str, Any] | None) -> dict[str, Any] | bool:
    """One input or output in the generate form: a flat array of the elements a tensor of `shape` holds, and, when
    it may hold one element, that element alone (`generate.shape_for`); False when the datatype has no JSON form.
    A variable dimension beside fixed ones takes a multiple of their product, which JSON Schema cannot say of a
    length: any length then."""
    if element is None:
        return False
    flat: dict[str, Any] = {"type": "array", "items": element}
    fixed = math.prod(d for d in shape if d > 0)
    if 0 in shape:
        flat["maxItems"] = 0
        return flat
    if all(d > 0 for d in shape):
        flat["minItems"] = flat["maxItems"] = fixed
    return {"anyOf": [element, flat]} if fixed == 1 else flat


def _generate_answer(metadata: pb.ModelMetadataResponse, version: str, base: str, about: str) -> dict[str, Any]:
    """A generate answer of the model (`generate.answer`): its name and version, and each output as a flat array,
    or its one element alone."""
    properties: dict[str, Any] = {
        t.name: _generate_value(list(t.shape), _element(t.datatype) or {}) for t in metadata.outputs}
    properties["model_name"] = {"const": metadata.name}
    if version:
        properties["model_version"] = {"const": version}
    return {"description": f"The answer of model `{metadata.name}` to a generate request.\n\n{about}",
            "allOf": [{"$ref": _SCHEMAS + base}, {"type": "object", "properties": properties}]}


class _Narrowing:
    """How one kind of operation narrows its request and answer schemas to a model, and its summary."""

    def __init__(self, request: Callable[[pb.ModelMetadataResponse, str, str], dict[str, Any]],
                 answer: Callable[[pb.ModelMetadataResponse, str, str, str], dict[str, Any]], summary: str) -> None:
        self.request, self.answer, self.summary = request, answer, summary


_NARROWING: Final = {
    "infer": _Narrowing(_request_schema, _answer_schema, "Run inference on model"),
    "generate": _Narrowing(_generate_request, _generate_answer, "Generate with model"),
}


def _resolve(item: Any) -> Any:
    """A local `$ref` of DOCUMENT resolved (`#/components/...`), anything else as it is."""
    ref = item.get("$ref") if isinstance(item, Mapping) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return item
    target: Any = DOCUMENT
    for part in ref[2:].split("/"):
        target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, Mapping) else {}
    return target
