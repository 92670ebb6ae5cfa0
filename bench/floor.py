"""The serialization floor of a 1M-element FP32 identity over REST JSON: the work no JSON server can avoid.

orjson parses the very request body the load generator sends (1,000,000 float32 values printed as doubles, as
a Python client writes them), the data becomes a float32 numpy array, and the response is written with orjson.
The floor is parse + to-numpy + the cheapest dump that writes the same numbers (the array widened to float64,
which orjson prints from numpy directly; printing float32 itself is slower). The other ways to write it are
reported alongside. Run on CPU 0, where the servers run: `taskset -c 0 python bench/floor.py [--repeat 7]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    json.dump(measure(args.elements, args.repeat), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
