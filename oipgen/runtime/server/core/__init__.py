"""The protocol's semantics, over no transport: the data plane's operations (`dataplane`), inference (`pipeline`:
prepare, schedule, run, finish; `accounting`: the one construct every inference enters and leaves through, which
tells the observers; `invoke`: calling the model; `lean`: the common request with only the work it needs, for the
transports' lean decoders), the checks of requests and answers against the model's
declarations (`validation`, `classification`), dynamic batching (`batching`), streams (`streaming`), Triton's
generate extension (`generate`), the model configuration extension (`configuration`), system shared memory
(`shared_memory`) and the model repository (`repository`, a model folder's files: `model_files`).

It imports `model`, `observe` and the server's vocabulary (`errors`, `types`, `settings`), never a transport
library: protobuf messages are its vocabulary for the operations, numpy tensors for inference.

Rendered from the spec: `dataplane_base` (`DataPlaneBase`: one coroutine per operation of the spec, answering
UNIMPLEMENTED until `DataPlane` implements it, and the operations' kinds: `TENSOR_OPERATIONS`,
`STREAMING_OPERATIONS`).
"""
