"""What the model configuration, statistics and classification tests share (test_model_configuration,
test_statistics, test_classification, test_extensions_together): the models they serve beside `simple`, `failing`
and `slow` (tests/serving.py), the server, and the REST form these extensions' bodies take."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from serving import Server, build_repository, running

MODELS = {
    # Identity on four FP32 scores, answered in several datatypes; SCORES has class labels.
    "scores": ("Scores", '''
import numpy as np

from oip.server.model import Model, TensorSpec


class Scores(Model):
    inputs = [TensorSpec("INPUT0", "FP32", [4])]
    outputs = [
        TensorSpec("SCORES", "FP32", [4], labels=["cat", "dog", "bird"]),
        TensorSpec("WIDE", "FP64", [4]),
        TensorSpec("COUNTS", "INT64", [4]),
        TensorSpec("SMALL", "UINT8", [4]),
        TensorSpec("FLAGS", "BOOL", [4]),
        TensorSpec("HALF", "FP16", [4]),
        TensorSpec("TEXT", "BYTES", [4]),
    ]

    def infer(self, inputs, parameters):
        x = inputs["INPUT0"]
        return {
            "SCORES": x,
            "WIDE": x.astype(np.float64),
            "COUNTS": np.round(x * 10).astype(np.int64),
            "SMALL": np.clip(np.round(x * 10), 0, 255).astype(np.uint8),
            "FLAGS": x > 0,
            "HALF": x.astype(np.float16),
            "TEXT": np.array([str(v).encode() for v in x.tolist()], dtype=object),
        }
'''),
    # A model that batches: tensors declared without the batch dimension.
    "batched": ("Batched", '''
from oip.server.model import Model, TensorSpec


class Batched(Model):
    max_batch_size = 4
    inputs = [TensorSpec("INPUT0", "FP32", [3]), TensorSpec("INPUT1", "FP32", [3])]
    outputs = [TensorSpec("OUTPUT0", "FP32", [3], labels=["a", "b", "c"])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"]}
'''),
    # Always answers a batch of one, whatever it was given: a model failure for larger batches.
    "wrong_batch": ("WrongBatch", '''
import numpy as np

from oip.server.model import Model, TensorSpec


class WrongBatch(Model):
    max_batch_size = 4
    inputs = [TensorSpec("INPUT0", "INT32", [2])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [2])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": np.zeros((1, 2), dtype=np.int32)}
'''),
    # Identity, used only by the statistics tests (so its counters are theirs alone).
    "counted": ("Counted", '''
from oip.server.model import Model, TensorSpec


class Counted(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [-1])]
    outputs = [TensorSpec("OUTPUT0", "INT32", [-1])]

    def infer(self, inputs, parameters):
        return {"OUTPUT0": inputs["INPUT0"]}
'''),
    # Declarations in model.toml (see TOML below); never run.
    "configured": ("Configured", '''
from oip.server.model import Model, TensorSpec


class Configured(Model):
    platform = "onnxruntime_onnx"
    inputs = [TensorSpec("IMAGE", "UINT8", [3, -1, -1]), TensorSpec("NAME", "BYTES", [1])]
    outputs = [TensorSpec("LOGITS", "FP16", [1000])]

    def infer(self, inputs, parameters):
        raise NotImplementedError
'''),
}
TOML = {
    "configured": 'max_batch_size = 8\ndecoupled = true\n'
                  '[dynamic_batching]\nmax_queue_delay_microseconds = 250\npreferred_batch_size = [4, 8]\n',
}
READY = ("simple", "failing", "slow", *MODELS)
MODEL_THREADS = 3  # --model-threads: the instance count the configuration reports for plain infer() models
SCORES = np.array([0.5, 3.3, 2.4, -1.0], dtype=np.float32)


@contextlib.contextmanager
def serve_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`simple`, `failing`, `slow` and the models above, served for the length of the block."""
    work = tmp_path_factory.mktemp("extensions")
    repository = build_repository(work / "models", extra=("failing", "slow"), only=("simple",))
    for name, (cls, source) in MODELS.items():
        folder = repository / name
        folder.mkdir()
        (folder / "model.toml").write_text(f'class = "model:{cls}"\n' + TOML.get(name, ""))
        (folder / "model.py").write_text(textwrap.dedent(source))
    with running(repository, work, "--model-threads", str(MODEL_THREADS), ready=READY) as server:
        yield server


def as_rest(message: Message) -> Any:
    """A message's JSON as the REST bodies of these extensions write it: proto field names, every field without
    presence at its default too, 64-bit integers as numbers (proto3 JSON makes them strings)."""
    out = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    return _numbers(out, message)


def _numbers(out: dict[str, Any], message: Message) -> dict[str, Any]:
    wide = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    for field in message.DESCRIPTOR.fields:
        if field.name not in out:
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    _numbers(out[field.name][str(key)], item)
        elif field.message_type is not None:
            if field.is_repeated:
                for item, entry in zip(out[field.name], value, strict=True):
                    _numbers(item, entry)
            else:
                _numbers(out[field.name], value)
        elif field.cpp_type in wide:
            out[field.name] = [int(v) for v in out[field.name]] if field.is_repeated else int(out[field.name])
    return out


def texts(array: Any) -> list[Any]:
    """BYTES output elements as str (tritonclient gives bytes for binary data, str for JSON)."""
    return [v.decode() if isinstance(v, bytes) else v for v in np.asarray(array).reshape(-1).tolist()]


def counted_body(values: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}
