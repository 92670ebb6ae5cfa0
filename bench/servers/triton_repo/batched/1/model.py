"""`batched` for Triton's Python backend: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32, wrapping).

Triton's dynamic batcher hands the Python backend the requests of a batch as a list; the rows of every request
are merged into one computation and split back, as a model that batches computes."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        a = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        b = [pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy() for r in requests]
        rows = [x.shape[0] for x in a]
        a, b = np.concatenate(a), np.concatenate(b)
        total, difference = np.add(a, b, dtype=np.int32), np.subtract(a, b, dtype=np.int32)
        responses, start = [], 0
        for n in rows:
            outputs = [pb_utils.Tensor("OUTPUT0", total[start:start + n]),
                       pb_utils.Tensor("OUTPUT1", difference[start:start + n])]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            start += n
        return responses
