"""The benchmark models MLServer 1.7.1 serves (simple, identity_fp32, text):
`mlserver start bench/servers/mlserver_repo`."""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


def _inputs(payload: InferenceRequest) -> dict:
    return {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}


def _output(name: str, array: np.ndarray):
    out = NumpyCodec.encode_output(name, array)
    out.shape = list(array.shape)  # encode_output adds a batch dimension to 1-D arrays
    return out


class Simple(MLModel):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [1, 16])."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = _inputs(payload)
        a = inputs["INPUT0"].reshape(1, 16)
        b = inputs["INPUT1"].reshape(1, 16)
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                _output("OUTPUT0", np.add(a, b, dtype=np.int32)),
                _output("OUTPUT1", np.subtract(a, b, dtype=np.int32)),
            ],
        )


class Identity(MLModel):
    """OUTPUT0 = INPUT0 (FP32 [-1])."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        item = payload.inputs[0]
        array = NumpyCodec.decode_input(item).reshape(item.shape)
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[_output("OUTPUT0", array)])


class Text(MLModel):
    """OUTPUT0[i] = INPUT0[i].upper() (BYTES [-1])."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        strings = NumpyCodec.decode_input(payload.inputs[0]).reshape(-1)
        upper = np.array([(s.encode() if isinstance(s, str) else bytes(s)).upper() for s in strings], dtype=np.object_)
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[_output("OUTPUT0", upper)])
