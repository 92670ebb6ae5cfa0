"""`decoupled` for Triton's Python backend: 100 responses per request, the i-th with OUT = IN + i (wrapping)."""

import numpy as np
import triton_python_backend_utils as pb_utils

RESPONSES = 100


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for i in range(RESPONSES):
                out = pb_utils.Tensor("OUT", np.add(value, i, dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
