"""The scenarios of `make bench`: one workload of bench/loadgen.py at one concurrency, and how it is compared.

Each scenario says which load generator ranks the servers on it (`tool`): perf_analyzer (the C++ tool of
Triton's client wheels, which nobody here wrote) wherever it can send the workload to both Triton and our server,
bench/loadgen.py where it cannot (bench/pa.py's NOT_APPLICABLE says why: generate, typed contents, parameters
over REST, BYTES in JSON) and for the scenarios the benchmark has ranked with it from the start. Both run on every
scenario where they can. `floor`: also measured on the bare transport answering the same bytes (bench/floor.py,
bench/grpc_floor.py), so that the report says what our server adds to it: CPU per request for a small request,
peak memory for the large gRPC one (what grpcio itself holds of a 4 MB message). `new`: a workload
beyond `simple` and the identity (issue 30), held to Triton's throughput and CPU per inference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

LOADGEN: Final = "loadgen"
PERF_ANALYZER: Final = "perf_analyzer"


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: str
    concurrency: int
    title: str
    long: bool = False  # a slow scenario: twice the window
    # Measured on a server started for it (unless it is the first on this server): its peak memory is then its
    # own, not what an earlier scenario's payloads left resident in the server's allocator.
    fresh: bool = False
    tool: str = LOADGEN  # the load generator whose figures rank the servers
    floor: bool = False  # measured against the bare transport's floor too
    new: bool = False  # a workload held to Triton's throughput and CPU per inference


def _small(name: str, workload: str, concurrency: int, title: str, tool: str = PERF_ANALYZER) -> Scenario:
    return Scenario(name, workload, concurrency, title, tool=tool, floor=True, new=True)


SCENARIOS: Final = (
    Scenario("simple_rest_c1", "simple_rest", 1, "simple REST JSON c=1", floor=True),
    Scenario("simple_rest_c8", "simple_rest", 8, "simple REST JSON c=8", floor=True),
    Scenario("simple_grpc_c1", "simple_grpc", 1, "simple gRPC c=1", floor=True),
    Scenario("simple_grpc_c8", "simple_grpc", 8, "simple gRPC c=8", floor=True),
    Scenario("identity_grpc_raw", "identity_grpc_raw", 1, "identity 1M FP32 gRPC raw c=1", fresh=True, floor=True),
    Scenario("identity_rest_binary", "identity_rest_binary", 1, "identity 1M FP32 REST binary c=1", fresh=True),
    Scenario("identity_rest_json", "identity_rest_json", 1, "identity 1M FP32 REST JSON c=1", long=True, fresh=True),
    _small("text_rest_json_c1", "text_rest_json", 1, "text REST JSON c=1", LOADGEN),
    _small("text_rest_json_c8", "text_rest_json", 8, "text REST JSON c=8", LOADGEN),
    _small("text_rest_binary_c1", "text_rest_binary", 1, "text REST binary c=1"),
    _small("text_rest_binary_c8", "text_rest_binary", 8, "text REST binary c=8"),
    _small("text_grpc_c1", "text_grpc", 1, "text gRPC c=1"),
    _small("text_grpc_c8", "text_grpc", 8, "text gRPC c=8"),
    _small("batched_rest_c32", "batched_rest", 32, "batched REST JSON c=32"),
    _small("batched_grpc_c32", "batched_grpc", 32, "batched gRPC c=32"),
    _small("decoupled_grpc_c8", "decoupled_grpc", 8, "decoupled x100 gRPC stream c=8"),
    _small("generate_c8", "generate", 8, "generate c=8", LOADGEN),
    _small("generate_stream_c8", "generate_stream", 8, "generate_stream (SSE) c=8", LOADGEN),
    _small("simple_contents_grpc_c8", "simple_contents_grpc", 8, "simple gRPC typed contents (KServe) c=8", LOADGEN),
    _small("simple_params_grpc_c8", "simple_params_grpc", 8, "simple gRPC parameters (tritonclient) c=8"),
    _small("simple_params_rest_c8", "simple_params_rest", 8, "simple REST parameters (tritonclient) c=8", LOADGEN),
)
BY_NAME: Final = {s.name: s for s in SCENARIOS}
TITLES: Final = {s.name: s.title for s in SCENARIOS}
