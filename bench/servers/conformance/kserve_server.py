"""Every example model of spec/examples/models.yaml that KServe 0.21.0 can serve, from the list in models.json beside
this file (written by bench/conformance_matrix.py): `python kserve_server.py --http_port N --grpc_port M`.

One Model class for all of them: its metadata declares the entry's tensors (get_input_types / get_output_types), and
it computes the entry's behaviour: identity (output k is input k) or add_sub (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 =
INPUT0 - INPUT1, wrapping). As in bench/servers/kserve_server.py, a response needs a string id and binary outputs
are asked for over REST only.
"""

import json
import uuid
from pathlib import Path

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve.utils.numpy_codec import from_np_dtype


class Example(Model):
    def __init__(self, entry: dict) -> None:
        super().__init__(entry["name"])
        self.entry = entry
        self.ready = True

    def get_input_types(self) -> list:
        return [dict(tensor) for tensor in self.entry["inputs"]]

    def get_output_types(self) -> list:
        return [dict(tensor) for tensor in self.entry["outputs"]]

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        arrays = [item.as_numpy().reshape(item.shape) for item in payload.inputs]
        if self.entry["behaviour"] == "add_sub":
            with np.errstate(over="ignore"):
                arrays = [arrays[0] + arrays[1], arrays[0] - arrays[1]]
        binary = bool(not payload.from_grpc and payload.use_binary_outputs)
        outputs = []
        for tensor, array in zip(self.entry["outputs"], arrays, strict=False):  # mymodel: more inputs than outputs
            output = InferOutput(name=tensor["name"], shape=list(array.shape), datatype=from_np_dtype(array.dtype))
            output.set_data_from_numpy(array, binary_data=binary or payload.from_grpc)
            outputs.append(output)
        kwargs = {"use_binary_outputs": True} if binary else {}
        return InferResponse(response_id=payload.id or str(uuid.uuid4()), model_name=self.name,
                             infer_outputs=outputs, from_grpc=payload.from_grpc, **kwargs)


if __name__ == "__main__":
    entries = json.loads((Path(__file__).parent / "models.json").read_text())
    ModelServer().start([Example(entry) for entry in entries])
