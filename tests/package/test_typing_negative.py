"""Negative typing tests: mypy (strict) must reject wrong uses of the generated client, models, converters and
messages, each at the line that misuses them, and accept the right ones. One mypy run over every snippet, with
the generated package on its path (about 30-60 s with a cold cache).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import GENERATED

PRELUDE = """\
import numpy as np
from oip import convert, models
from oip.client import AsyncGrpcClient, GrpcClient, RestClient
from oip.grpc import grpc_service_pb2 as pb
"""

# name -> a body whose line marked `# error: <code>` mypy must reject with that error code.
BAD = {
    "model_field_type": 'models.InferenceRequest(inputs="not a list")  # error: arg-type',
    "model_unknown_attribute": (
        'print(models.InferenceResponse(model_name="m", outputs=[]).nope)  # error: attr-defined'
    ),
    "client_model_name": 'RestClient("http://h").infer(123, {})  # error: arg-type',
    "client_unknown_operation": 'GrpcClient("h:1").no_such_operation()  # error: attr-defined',
    "client_keyword_only": 'RestClient("http://h").server_live(5.0)  # error: call-arg',
    "client_result_type": 'live: int = RestClient("http://h").server_live()  # error: assignment',
    "async_client_not_awaited": (
        "async def f() -> None:\n"
        '    meta: models.MetadataServerResponse = AsyncGrpcClient("h:1").server_metadata()  # error: assignment'
    ),
    "converter_wrong_model": (
        'convert.inference_request_to_proto(models.ServerLiveResponse(live=True))  # error: arg-type'
    ),
    "converter_result_type": (
        'req: pb.ModelInferResponse = convert.inference_request_to_proto(models.InferenceRequest(inputs=[]))'
        '  # error: assignment'
    ),
    "message_field_type": 'pb.ModelInferRequest(model_name=1)  # error: arg-type',
    "message_unknown_field": 'pb.ModelInferRequest(no_such_field="x")  # error: call-arg',
}
GOOD = """\
def use(client: RestClient, grpc_client: GrpcClient) -> None:
    live: models.ServerLiveResponse = client.server_live()
    result = grpc_client.infer("simple", {"INPUT0": np.zeros((1, 16), np.int32)}, version="1")
    array = result.as_numpy("OUTPUT0")
    request = convert.inference_request_to_proto(models.InferenceRequest(inputs=[]), model_name="m")
    message: pb.ModelInferRequest = request
    print(live.live, array, message.model_name, pb.ModelInferRequest(model_name="m").model_name)
"""
MYPY_INI = "[mypy]\nstrict = True\n\n[mypy-oip.grpc.*]\ndisallow_any_generics = False\n"


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, str]]]:
    """Errors by snippet: (line, error code)."""
    work = tmp_path_factory.mktemp("typing")
    files = {name: PRELUDE + "\n" + textwrap.dedent(body) + "\n" for name, body in BAD.items()}
    files["good"] = PRELUDE + "\n" + GOOD
    for name, text in files.items():
        (work / f"snippet_{name}.py").write_text(text)
    (work / "mypy.ini").write_text(MYPY_INI)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(work / "mypy.ini"), "--cache-dir", str(work / "cache"),
         "--show-error-codes", "--no-error-summary", *(f"snippet_{name}.py" for name in files)],
        cwd=work, capture_output=True, text=True, timeout=600, env={**os.environ, "MYPYPATH": str(GENERATED)},
    )
    errors: dict[str, list[tuple[int, str]]] = {name: [] for name in files}
    for line in result.stdout.splitlines():
        match = re.match(r"snippet_(\w+)\.py:(\d+): error: .*\[([\w-]+)\]$", line)
        if match:
            errors[match[1]].append((int(match[2]), match[3]))
    assert result.returncode in (0, 1) and not result.stderr.strip(), result.stdout + result.stderr
    errors["_raw"] = [(0, result.stdout)]
    return errors


def test_right_uses_type_check(mypy_output: dict[str, list[tuple[int, str]]]) -> None:
    assert mypy_output["good"] == [], mypy_output["_raw"][0][1]


@pytest.mark.parametrize("name", sorted(BAD))
def test_wrong_use_is_rejected(mypy_output: dict[str, list[tuple[int, str]]], name: str) -> None:
    text = PRELUDE + "\n" + textwrap.dedent(BAD[name]) + "\n"
    marked = [(i, line.split("# error: ")[1].strip()) for i, line in enumerate(text.splitlines(), start=1)
              if "# error: " in line]
    assert marked and set(marked) <= set(mypy_output[name]), (name, mypy_output[name], mypy_output["_raw"][0][1])
