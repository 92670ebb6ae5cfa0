"""`text_tokens` for Triton's Python backend: one response per whitespace-separated word of text_input."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            for word in bytes(text).split():
                out = pb_utils.Tensor("text_output", np.array([word], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
