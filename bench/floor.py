"""Floors: the work no server can avoid. Two of them here:

- the REST transport's (`--serve-rest`): a bare uvicorn server (httptools, uvloop, the HTTP stack our server runs
  on) whose ASGI app reads each request's body whole and answers it with an answer recorded from a real server
  (`bench/loadgen.py --record`: the status, the headers that say what the body is, and the body, or a stream's
  events, written together in one chunk). bench/run.py drives it with the very load of a scenario, so our
  server's CPU per request over this one's is what our server adds to the transport (bench/grpc_floor.py is the
  same for gRPC);

- the serialization floor of a 1M-element FP32 identity over REST JSON (the default):

orjson parses the very request body the load generator sends (1,000,000 float32 values printed as doubles, as
a Python client writes them), the data becomes a float32 numpy array, and the response is written with orjson.
The floor is parse + to-numpy + the cheapest dump that writes the same numbers (the array widened to float64,
which orjson prints from numpy directly; printing float32 itself is slower). The other ways to write it are
reported alongside. Run on CPU 0, where the servers run: `taskset -c 0 python bench/floor.py [--repeat 7]`.

    python bench/floor.py --serve-rest ANSWER.json --port N    # serves until killed
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson


def _time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0, result


def measure(elements: int = 1_000_000, repeat: int = 7) -> dict[str, Any]:
    data = np.random.default_rng(0).random(elements, dtype=np.float32)  # the load generator's tensor
    body = orjson.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [elements], "data": data.tolist()}]}
    )
    out: dict[str, Any] = {"elements": elements, "request_bytes": len(body), "repeat": repeat}
    out["parse_ms"], doc = _time(lambda: orjson.loads(body), repeat)
    out["to_numpy_ms"], array = _time(lambda: np.asarray(doc["inputs"][0]["data"], dtype=np.float32), repeat)
    assert np.array_equal(array, data)

    def response(values: Any) -> dict[str, Any]:
        return {
            "model_name": "identity_fp32",
            "model_version": "1",
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [elements], "data": values}],
        }

    numpy_opt = orjson.OPT_SERIALIZE_NUMPY
    out["dump_f64_ms"], text = _time(lambda: orjson.dumps(response(array.astype(np.float64)), option=numpy_opt), repeat)
    out["response_bytes"] = len(text)
    out["dump_f32_ms"], _ = _time(lambda: orjson.dumps(response(array), option=numpy_opt), repeat)
    out["dump_tolist_ms"], _ = _time(lambda: orjson.dumps(response(array.tolist())), repeat)
    out["floor_ms"] = out["parse_ms"] + out["to_numpy_ms"] + min(out["dump_f64_ms"], out["dump_f32_ms"])
    out["floor_tolist_ms"] = out["parse_ms"] + out["to_numpy_ms"] + out["dump_tolist_ms"]
    raw = data.tobytes()
    out["raw_copy_ms"], _ = _time(lambda: np.frombuffer(raw, dtype=np.float32).tobytes(), repeat)
    return out


def serve_rest(answer_file: Path, port: int) -> None:
    """Answer every request with the recorded answer, on uvicorn as our server runs it, until killed."""
    import base64

    import uvicorn

    answer = json.loads(answer_file.read_text())
    chunks = [base64.b64decode(chunk) for chunk in answer["chunks"]]
    size = sum(len(chunk) for chunk in chunks)
    headers = [(k.lower().encode(), v.encode()) for k, v in answer["headers"]]
    if len(chunks) == 1:  # one body: its length; a stream of events: chunked, as it was sent
        headers.append((b"content-length", str(size).encode()))
    start = {"type": "http.response.start", "status": answer["status"], "headers": headers}
    # A stream's events in one body message (one chunk, one send): all are known at once, as a model that yields
    # them without waiting makes them, and a server writes what it has in one send (ours does).
    body = {"type": "http.response.body", "body": b"".join(chunks), "more_body": False}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):  # the whole body, as any server reads it
            pass
        await send(start)
        await send(body)

    config = uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", loop="uvloop", lifespan="off",
                            access_log=False, log_config=None, server_header=False)
    uvicorn.Server(config).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--serve-rest", type=Path, metavar="ANSWER", help="serve this recorded answer (see above)")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    if args.serve_rest is not None:
        serve_rest(args.serve_rest, args.port)
        return 0
    json.dump(measure(args.elements, args.repeat), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
