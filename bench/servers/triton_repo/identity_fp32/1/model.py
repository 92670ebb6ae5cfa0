"""`identity_fp32` for Triton's Python backend: OUTPUT0 = INPUT0 (FP32 [-1]), decoded to numpy and encoded back."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", array)]))
        return responses
