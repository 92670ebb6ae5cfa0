"""A unary ModelInfer call to a model declared quick and never blocking (`Model.inline`) is answered by grpcio's
polling thread as soon as its request is in (`oip.server.grpc.pool.WarmPool`, `answers_here`): no pool thread, no
model slot. Any other model's call goes to a pool thread as before. So an inline model is answered while every
pool thread and every model slot is held by another model's call.

The models answer the name of the thread they ran on (a BYTES output); `hold` (not inline) first writes a
`started` file into its folder and waits for a `release` file there (30 s at most).
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from oip import codec
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import TIMEOUT, Server, start_server

MODEL = '''
import threading
import time
from pathlib import Path

import numpy as np

from oip.server.model import Model, TensorSpec


class Where(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [1])]
    outputs = [TensorSpec("THREAD", "BYTES", [1])]
    inline = {inline}
    hold = {hold}

    def infer(self, inputs, parameters):
        if self.hold:
            folder = Path(self.path)
            (folder / "started").write_text("1")
            deadline = time.monotonic() + 30
            while not (folder / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return {{"THREAD": np.array([threading.current_thread().name.encode()], dtype=object)}}
'''
MODELS = {"inline": (True, False), "threaded": (False, False), "hold": (False, True)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("polling")
    repository = workdir / "models"
    for name, (inline, hold) in MODELS.items():
        folder = repository / name
        folder.mkdir(parents=True)
        (folder / "model.toml").write_text('class = "model:Where"\n')
        (folder / "model.py").write_text(textwrap.dedent(MODEL.format(inline=inline, hold=hold)))
    # One pool thread and one model slot: a `hold` call takes both.
    server = start_server(repository, workdir, "--grpc-threads", "1", "--model-threads", "1", ready=list(MODELS))
    try:
        yield server
    finally:
        server.stop()


def _thread(stub: pb_grpc.GRPCInferenceServiceStub, model: str, timeout: float = TIMEOUT, general: bool = False) -> str:
    """The name of the server's thread that ran `model` for one ModelInfer call; `general`: a request the server's
    lean way leaves to the general way (an output asked for with a parameter)."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    if general:
        request.outputs.add(name="THREAD").parameters["binary_data"].bool_param = True
    request.raw_input_contents.append((1).to_bytes(4, "little"))
    reply = stub.ModelInfer(request, timeout=timeout)
    name = codec.from_raw(reply.raw_output_contents[0], "BYTES", [1])[0]
    assert isinstance(name, bytes)
    return name.decode()


def test_an_inline_model_is_answered_by_the_polling_thread(server: Server) -> None:
    with server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        inline = {_thread(stub, "inline") for _ in range(5)}
        threaded = {_thread(stub, "threaded") for _ in range(5)}
    # grpcio's polling thread runs its `_serve` loop; the pool's threads are named after the server's pool.
    assert len(inline) == 1 and inline.pop().endswith("(_serve)"), inline
    assert threaded and all(name.startswith("oip-grpc_") for name in threaded), threaded


def _held(stub: pb_grpc.GRPCInferenceServiceStub) -> str:
    try:
        return _thread(stub, "hold")
    except grpc.RpcError as exc:
        return f"failed: {exc.code()} {exc.details()}"


@pytest.mark.parametrize("general", [False, True], ids=["lean", "general"])
def test_an_inline_model_needs_no_pool_thread_nor_model_slot(server: Server, general: bool) -> None:
    """With the only pool thread and the only model slot held by a `hold` call, the inline model still answers,
    whichever way the server takes its request; once it has, `hold` is released and answers too."""
    folder = server.repository / "hold"
    (folder / "release").unlink(missing_ok=True)
    (folder / "started").unlink(missing_ok=True)
    held: list[str] = []
    with server.channel() as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        caller = threading.Thread(target=lambda: held.append(_held(stub)))
        caller.start()
        try:
            deadline = time.monotonic() + TIMEOUT
            while not (folder / "started").exists():
                assert caller.is_alive() and time.monotonic() < deadline, f"the hold call did not start: {held}"
                time.sleep(0.01)
            answered = _thread(stub, "inline", timeout=10, general=general)
        except grpc.RpcError as exc:
            pytest.fail(f"the inline model waited for the held thread or slot: {exc.code()}")
        finally:
            (folder / "release").write_text("1")
            caller.join(TIMEOUT)
    assert answered.endswith("(_serve)")
    assert held and held[0].startswith("oip-grpc_"), held
