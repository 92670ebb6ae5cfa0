"""The benchmark models KServe 0.21.0 serves (simple, identity_fp32, text):
`python kserve_server.py --http_port N --grpc_port M`.

KServe's defaults otherwise (one uvicorn worker), except logging: bench/servers.py passes `--enable_latency_logging
false` and kserve_logging.json (no access log), the one policy of the benchmark. Pitfalls from
shared/research/bench-baselines.md: a response needs a string id, and `use_binary_outputs` is passed for REST only
(over gRPC, ndarray outputs go raw anyway).
"""

import uuid

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


def _response(model: Model, payload: InferRequest, outputs: dict) -> InferResponse:
    binary = bool(not payload.from_grpc and payload.use_binary_outputs)
    infer_outputs = []
    for name, array in outputs.items():
        datatype = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}.get(array.dtype, "BYTES")
        out = InferOutput(name=name, shape=list(array.shape), datatype=datatype)
        out.set_data_from_numpy(array, binary_data=binary or payload.from_grpc)
        infer_outputs.append(out)
    kwargs = {"use_binary_outputs": True} if binary else {}
    return InferResponse(
        response_id=payload.id or str(uuid.uuid4()),
        model_name=model.name,
        infer_outputs=infer_outputs,
        from_grpc=payload.from_grpc,
        **kwargs,
    )


class Simple(Model):
    def __init__(self) -> None:
        super().__init__("simple")
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        a = payload.get_input_by_name("INPUT0").as_numpy().reshape(1, 16)
        b = payload.get_input_by_name("INPUT1").as_numpy().reshape(1, 16)
        return _response(
            self, payload, {"OUTPUT0": np.add(a, b, dtype=np.int32), "OUTPUT1": np.subtract(a, b, dtype=np.int32)}
        )


class Identity(Model):
    def __init__(self) -> None:
        super().__init__("identity_fp32")
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        item = payload.inputs[0]
        return _response(self, payload, {"OUTPUT0": item.as_numpy().reshape(item.shape)})


class Text(Model):
    """OUTPUT0[i] = INPUT0[i].upper() (BYTES [-1])."""

    def __init__(self) -> None:
        super().__init__("text")
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        strings = payload.inputs[0].as_numpy().reshape(-1)
        upper = np.array([(s.encode() if isinstance(s, str) else bytes(s)).upper() for s in strings], dtype=np.object_)
        return _response(self, payload, {"OUTPUT0": upper})


if __name__ == "__main__":
    ModelServer().start([Simple(), Identity(), Text()])
