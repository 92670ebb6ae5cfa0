"""Unloading a model frees its memory, and reloading it does not pile up the instances it replaced: through
`python -m oip serve` on real sockets, measured as operators see it, in the server's RSS.

Each model holds a buffer of HELD_MIB (above glibc's mmap threshold, which the server sets at 32 MiB, so freeing
it gives the pages back at once), in its instance or in its module, and is served over REST and gRPC before it
goes: by the way each kind of model takes (a plain model, an inline model under dynamic batching, batched where
its calls arrive, a plain one under dynamic batching, batched by the gRPC threads), so that whatever one of those
ways keeps per instance is exercised.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import grpc
import numpy as np
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import TIMEOUT, Server, running

HELD_MIB = 40
RELOADS = 3

MODEL = '''
import numpy as np

from oip.server.model import Model, TensorSpec

MODULE_HELD = np.ones({module_bytes}, dtype=np.uint8)  # touched: resident


class Holder(Model):
    inputs = (TensorSpec("X", "INT32", [4]),)
    outputs = (TensorSpec("Y", "INT32", [4]),)
    inline = {inline}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held = np.ones({instance_bytes}, dtype=np.uint8)

    def infer(self, inputs, parameters):
        return {{"Y": inputs["X"] + 1}}
'''

BATCHING = "max_batch_size = 4\n[dynamic_batching]\nmax_queue_delay_microseconds = 100\n"

# name: (held by the module, inline, dynamic batching)
MODELS = {
    "plain": (False, False, False),
    "inline_batched": (False, True, True),  # gRPC: batched where its calls arrive
    "thread_batched": (False, False, True),  # gRPC: batched by the gRPC threads
    "module_held": (True, False, False),
}


def write_repository(root: Path) -> Path:
    held = HELD_MIB * 1024 * 1024
    for name, (in_module, inline, batching) in MODELS.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "model.toml").write_text('class = "model:Holder"\n' + (BATCHING if batching else ""))
        (folder / "model.py").write_text(textwrap.dedent(MODEL).format(
            module_bytes=held if in_module else 1, instance_bytes=1 if in_module else held, inline=inline))
    return root


def serve_each(server: Server) -> None:
    """One request to every model over each transport, answered right."""
    x = np.arange(4, dtype=np.int32)
    with server.http_client() as client, grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for name, (_, _, batching) in MODELS.items():
            shape = [1, 4] if batching else [4]
            body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": shape, "data": x.tolist()}]}
            response = client.post(f"/v2/models/{name}/infer", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == (x + 1).tolist()
            request = pb.ModelInferRequest(model_name=name, raw_input_contents=[x.tobytes()])
            request.inputs.add(name="X", datatype="INT32", shape=shape)
            reply = stub.ModelInfer(request, timeout=TIMEOUT)
            assert np.frombuffer(reply.raw_output_contents[0], np.int32).tolist() == (x + 1).tolist()


def control(server: Server, action: str) -> None:
    with server.http_client() as client:
        for name in MODELS:
            response = client.post(f"/v2/repository/models/{name}/{action}")
            assert response.status_code == 200, response.text


def test_reloads_keep_one_instance_and_unloading_frees_the_memory(tmp_path: Path) -> None:
    held = HELD_MIB * 1024  # KiB
    with running(write_repository(tmp_path / "models"), tmp_path / "server", ready=MODELS) as server:
        serve_each(server)
        loaded = server.rss_kib()
        for _ in range(RELOADS):
            control(server, "load")  # a loaded model: reloaded from its folder, the old instance retired
            serve_each(server)
        reloaded = server.rss_kib()
        # Each model kept by any one way would hold RELOADS buffers more; less than one buffer of slack
        assert reloaded - loaded < held, (
            f"after {RELOADS} reloads of {len(MODELS)} models the RSS grew {(reloaded - loaded) // 1024} MiB "
            f"(each holds {HELD_MIB} MiB)\n{server.log_text()}")
        control(server, "unload")
        unloaded = server.rss_kib()
        assert loaded - unloaded > (len(MODELS) - 1) * held, (
            f"unloading {len(MODELS)} models of {HELD_MIB} MiB each freed {(loaded - unloaded) // 1024} MiB "
            f"({loaded // 1024} to {unloaded // 1024} MiB)\n{server.log_text()}")
        with server.http_client() as client:  # and the server serves on
            assert client.get("/v2/health/live").status_code == 200
