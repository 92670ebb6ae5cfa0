"""What the streaming, shared memory and batching tests share (test_streaming, test_shared_memory, test_batching):
the models they serve beside the examples, the server, and tritonclient's clients of it."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import Server, build_repository, running

# --- the models ------------------------------------------------------------------------------------------------

MODELS: dict[str, tuple[str, str]] = {
    # Decoupled, a plain generator: one response per element of IN (none for an empty IN); a negative element
    # fails the request after the responses before it.
    "repeat": ('class = "model:Repeat"\n', '''
        import numpy as np

        from oip.server.model import Model, TensorSpec


        class Repeat(Model):
            inputs = [TensorSpec("IN", "INT32", [-1])]
            outputs = [TensorSpec("OUT", "INT32", [1]), TensorSpec("IDX", "UINT32", [1])]
            decoupled = True

            def infer(self, inputs, parameters):
                for i, value in enumerate(inputs["IN"].tolist()):
                    if value < 0:
                        raise ValueError(f"negative value {value}")
                    yield {"OUT": np.array([value], np.int32), "IDX": np.array([i], np.uint32)}
    '''),
    # The same as an async generator, declared decoupled by its model.toml.
    "repeat_async": ('class = "model:RepeatAsync"\ndecoupled = true\n', '''
        import asyncio

        import numpy as np

        from oip.server.model import Model, TensorSpec


        class RepeatAsync(Model):
            inputs = [TensorSpec("IN", "INT32", [-1])]
            outputs = [TensorSpec("OUT", "INT32", [1]), TensorSpec("IDX", "UINT32", [1])]

            async def infer(self, inputs, parameters):
                for i, value in enumerate(inputs["IN"].tolist()):
                    await asyncio.sleep(0.001)
                    if value < 0:
                        raise ValueError(f"negative value {value}")
                    yield {"OUT": np.array([value], np.int32), "IDX": np.array([i], np.uint32)}
    '''),
    # Batches dynamically and costs 10 ms per call: DOUBLE = INPUT0 * scale (a request parameter, default 2),
    # ROWSUM = the sum of each row.
    "counter": ('class = "model:Counter"\n', '''
        import time

        import numpy as np

        from oip.server.model import DynamicBatching, Model, TensorSpec


        class Counter(Model):
            max_batch_size = 8
            dynamic_batching = DynamicBatching(max_queue_delay_microseconds=20000)
            inputs = [TensorSpec("INPUT0", "INT32", [4])]
            outputs = [TensorSpec("DOUBLE", "INT32", [4]), TensorSpec("ROWSUM", "INT64", [1])]

            def infer(self, inputs, parameters):
                time.sleep(0.01)
                x = inputs["INPUT0"]
                return {"DOUBLE": x * int(parameters.get("scale", 2)), "ROWSUM": x.sum(axis=1, keepdims=True)}
    '''),
    # Batches dynamically with a variable dimension: requests of different lengths cannot share a call.
    "ragged": ('class = "model:Ragged"\nmax_batch_size = 8\n[dynamic_batching]\nmax_queue_delay_microseconds = 50000\n',
               '''
        import time

        from oip.server.model import Model, TensorSpec


        class Ragged(Model):
            inputs = [TensorSpec("INPUT0", "FP32", [-1])]
            outputs = [TensorSpec("OUTPUT0", "FP32", [-1])]

            def infer(self, inputs, parameters):
                time.sleep(0.005)
                return {"OUTPUT0": inputs["INPUT0"] + 1}
    '''),
}


def write_models(root: Path) -> None:
    for name, (toml, code) in MODELS.items():
        folder = root / name
        folder.mkdir()
        (folder / "model.toml").write_text(toml)
        (folder / "model.py").write_text(textwrap.dedent(code))


@contextlib.contextmanager
def serve_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`simple`, `identity_fp32`, `identity_bytes` and the models above, served for the length of the block."""
    root = tmp_path_factory.mktemp("stream_shm_batch")
    repository = build_repository(root / "models", only=("simple", "identity_fp32", "identity_bytes"))
    write_models(repository)
    with running(repository, root / "run", ready=["simple", *MODELS]) as server:
        yield server


@contextlib.contextmanager
def triton_grpc_client(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient's gRPC client of `server`, one per test (a stream belongs to its client)."""
    client = grpcclient.InferenceServerClient(server.target)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def triton_http_client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    """tritonclient's HTTP client of `server`, one per test, with room for concurrent calls."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=16)
    try:
        yield client
    finally:
        client.close()


SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)
