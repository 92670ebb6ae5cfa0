"""`text_generate` for Triton's Python backend: text_output = text_input upper-cased (BYTES [1])."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            out = pb_utils.Tensor("text_output", np.array([bytes(text).upper()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
