"""`text` for Triton's Python backend: OUTPUT0[i] = INPUT0[i].upper() (BYTES)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            strings = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            upper = np.array([bytes(s).upper() for s in strings], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", upper)]))
        return responses
