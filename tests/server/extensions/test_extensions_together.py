"""The model configuration, statistics and classification extensions together: switched off in a data plane that
leaves them out (in process), and as the generated clients give them, the same over REST and gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from extension_models import READY, SCORES, counted_body, serve_models, texts
from oip.grpc import grpc_service_pb2 as pb
from oip.server import DataPlane, Model, ModelRepository, Settings, Tensor, TensorSpec, Unimplemented
from oip.server.types import InferRequest, RequestedOutput
from serving import Server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve_models(tmp_path_factory) as server:
        yield server


class Echo(Model):
    name = "echo"
    inputs = (TensorSpec("INPUT0", "INT32", [-1]),)
    outputs = (TensorSpec("OUTPUT0", "INT32", [-1]),)

    def infer(self, inputs: Any, parameters: Any) -> Any:
        return {"OUTPUT0": inputs["INPUT0"]}


def test_disabled_extensions_are_unimplemented() -> None:
    async def scenario() -> None:
        repository = ModelRepository()
        repository.add(Echo())
        await repository.load_all()
        dp = DataPlane(repository, Settings(extensions=["model_repository", "binary_tensor_data", "parameters"]))
        with pytest.raises(Unimplemented):
            await dp.model_config(pb.ModelConfigRequest(name="echo"))
        with pytest.raises(Unimplemented):
            await dp.model_statistics(pb.ModelStatisticsRequest())
        tensor = Tensor("INPUT0", "INT32", [2], np.array([1, 2], dtype=np.int32))
        with pytest.raises(Unimplemented):
            await dp.model_infer(InferRequest("echo", inputs=[tensor],
                                              outputs=[RequestedOutput("OUTPUT0", {"classification": 1})]))
        # without classification the request runs, and is counted (statistics are kept, only not served)
        await dp.model_infer(InferRequest("echo", inputs=[tensor]))
        assert dp.statistics.for_model("echo", "1").success.count == 1

    asyncio.run(scenario())


# --- the generated clients ----------------------------------------------------------------------------------------


def test_generated_clients(server: Server, http: httpx.Client) -> None:
    """oip.client's REST and gRPC clients: model_config, model_statistics and classification, the same over both."""
    from oip.client import errors as client_errors
    from oip.client.grpc import GrpcClient
    from oip.client.rest import RestClient
    from oip.client.tensors import RequestedOutput as ClientOutput

    with RestClient(server.url, trust_env=False) as rest, GrpcClient(server.target) as grpc_client:
        for client in (rest, grpc_client):
            config = client.model_config("batched")
            assert (config.name, config.max_batch_size) == ("batched", 4)
            assert [(t.name, t.dims) for t in config.input or []] == [("INPUT0", [3]), ("INPUT1", [3])]
            assert config.model_transaction_policy is not None and config.model_transaction_policy.decoupled is False
            with pytest.raises(client_errors.NotFound):
                client.model_config("nope")
        assert rest.model_config("simple", "1") == grpc_client.model_config("simple", "1")

        assert http.post("/v2/models/counted/infer", json=counted_body([1])).status_code == 200
        rest_stats = rest.model_statistics("counted")
        assert rest_stats == grpc_client.model_statistics("counted")
        (entry,) = rest_stats.model_stats
        assert entry.name == "counted" and entry.inference_stats is not None
        assert entry.inference_stats.success is not None and (entry.inference_stats.success.count or 0) >= 1
        every = {(s.name, s.version) for s in grpc_client.model_statistics().model_stats}
        assert every == {(name, "1") for name in READY}
        with pytest.raises(client_errors.NotFound):
            rest.model_statistics("nope")

        outputs = [ClientOutput("SCORES", parameters={"classification": 2})]
        for client in (rest, grpc_client):
            result = client.infer("scores", {"INPUT0": SCORES}, outputs=outputs)
            assert texts(result.as_numpy("SCORES")) == ["3.300000:1:dog", "2.400000:2:bird"]
            with pytest.raises(client_errors.InvalidArgument, match="unsupported type 'BOOL'"):
                client.infer("scores", {"INPUT0": SCORES}, outputs=[ClientOutput("FLAGS", {"classification": 1})])


def test_extensions_through_the_generated_clients(server: Server) -> None:
    """Model configuration, statistics and classification, as the generated clients give them."""
    from oip.client import GrpcClient, RequestedOutput, RestClient

    with RestClient(server.url) as rest, GrpcClient(server.target) as grpc_client:
        for client in (rest, grpc_client):
            config = client.model_config("scores")
            assert config.name == "scores" and [i.name for i in config.input or []] == ["INPUT0"]
            result = client.infer("scores", {"INPUT0": SCORES},
                                  [RequestedOutput("SCORES", {"classification": 2}), "COUNTS"])
            assert [x.decode() for x in result.as_numpy("SCORES").tolist()] == ["3.300000:1:dog", "2.400000:2:bird"]
            assert result.as_numpy("COUNTS").tolist() == [5, 33, 24, -10]
            stats = client.model_statistics("scores").model_stats
            assert [s.name for s in stats] == ["scores"] and (stats[0].inference_count or 0) >= 1
        assert rest.model_config("scores") == grpc_client.model_config("scores")
