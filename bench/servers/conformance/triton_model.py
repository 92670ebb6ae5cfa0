"""Every example model of spec/examples/models.yaml on Triton's Python backend: one file for all of them, each
model's config.pbtxt naming its tensors and its behaviour (the parameter `behaviour`: identity, add_sub or words),
as bench/conformance_matrix.py writes them.

- identity: output k is input k, unchanged (a BF16 tensor, which numpy cannot hold, is handed over as it came);
- add_sub: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, in the inputs' datatype (wrapping);
- words (decoupled): one response per whitespace-separated word of the one BYTES input, then the final flag.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.behaviour = config["parameters"]["behaviour"]["string_value"]
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]

    def _outputs(self, request):
        given = [pb_utils.get_input_tensor_by_name(request, name) for name in self.inputs]
        if self.behaviour == "add_sub":
            a, b = given[0].as_numpy(), given[1].as_numpy()
            with np.errstate(over="ignore"):
                return [pb_utils.Tensor(self.outputs[0], a + b), pb_utils.Tensor(self.outputs[1], a - b)]
        outputs = []
        for name, tensor in zip(self.outputs, given, strict=False):  # mymodel: more inputs than outputs
            try:
                outputs.append(pb_utils.Tensor(name, tensor.as_numpy()))
            except Exception:  # no numpy form (BF16): the same buffer under the output's name
                outputs.append(pb_utils.Tensor.from_dlpack(name, tensor.to_dlpack()))
        return outputs

    def execute(self, requests):
        if self.behaviour != "words":
            return [pb_utils.InferenceResponse(output_tensors=self._outputs(request)) for request in requests]
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, self.inputs[0]).as_numpy().reshape(-1)[0]
            for word in bytes(text).split():
                tensor = pb_utils.Tensor(self.outputs[0], np.array([word], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[tensor]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
