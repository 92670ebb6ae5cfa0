"""Every example model of spec/examples/models.yaml on MLServer 1.7.1: one class for all of them, each model's
model-settings.json naming its tensors and its behaviour (`parameters.extra.behaviour`: identity, add_sub or
words), as bench/conformance_matrix.py writes them.

- identity: output k is input k, its data handed back as it came (any datatype MLServer has);
- add_sub: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, in the inputs' datatype (wrapping);
- words: MLServer's streaming (`predict_stream`, its generate_stream and infer_stream endpoints): one response per
  whitespace-separated word of the one BYTES input.
"""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class Example(MLModel):
    async def load(self) -> bool:
        self.behaviour = self.settings.parameters.extra["behaviour"]
        self.output_names = [tensor.name for tensor in self.settings.outputs]
        return True

    def _response(self, payload: InferenceRequest, outputs: list) -> InferenceResponse:
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id, outputs=outputs)

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if self.behaviour == "add_sub":
            a, b = (NumpyCodec.decode_input(item).reshape(item.shape) for item in payload.inputs[:2])
            with np.errstate(over="ignore"):
                arrays = [a + b, a - b]
            outputs = []
            for name, array in zip(self.output_names, arrays, strict=True):
                output = NumpyCodec.encode_output(name, array)
                output.shape = list(array.shape)  # encode_output adds a batch dimension to 1-D arrays
                outputs.append(output)
            return self._response(payload, outputs)
        outputs = [
            ResponseOutput(name=name, shape=item.shape, datatype=item.datatype, data=item.data)
            for name, item in zip(self.output_names, payload.inputs, strict=False)  # mymodel: more inputs than outputs
        ]
        return self._response(payload, outputs)

    async def predict_stream(self, payloads):
        async for payload in payloads:
            text = payload.inputs[0].data.root[0]
            for word in (text.encode() if isinstance(text, str) else bytes(text)).split():
                output = ResponseOutput(name=self.output_names[0], shape=[1], datatype="BYTES", data=[word.decode()])
                yield self._response(payload, [output])
