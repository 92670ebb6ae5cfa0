"""Inside a pod's namespaces (see netns.py): run the server's container command line as the image does and
report what a pod's probes and clients see. Run by test_deploy.py; prints one JSON report.

    python deploy_pod.py PLAN.json

PLAN: `command` (the Containerfile's CMD, word for word), `repository` (stands for /mnt/models), `model_dir`,
`healthcheck` (the HEALTHCHECK's command), `probes` (the ServingRuntime's probes: kind -> httpGet), `pythonpath`
(the image's /app), `grace_seconds` (the pod's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import netns
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

HTTP, GRPC = 8080, 8081


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the server was not ready in time")


def probe(get: dict[str, Any]) -> int | str:
    """A probe's httpGet as the kubelet sends it (to the pod's address: here its loopback): the status, or why none."""
    try:
        return httpx.get(f"http://127.0.0.1:{get['port']}{get['path']}", timeout=5).status_code
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"


def simple_inputs(module: Any) -> list[Any]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    netns.loopback_up()
    report: dict[str, Any] = {}
    healthcheck = [sys.executable if word == "python" else word for word in plan["healthcheck"]]
    report["healthcheck_before_start"] = subprocess.run(healthcheck, capture_output=True, timeout=30).returncode

    # The container's command line, word for word, but for the model repository's place: "python" is the image's
    # interpreter (here the one with the server's requirements), the package sits on PYTHONPATH as in /app.
    command = [sys.executable if word == "python" else word.replace(plan["model_dir"], plan["repository"])
               for word in plan["command"]]
    report["command"] = command
    log = Path(plan["log"])
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": plan["pythonpath"]})
    try:
        report["ready_after_s"] = wait_ready(f"http://127.0.0.1:{HTTP}", process)
        report["listening"] = {"http": netns.listening(HTTP), "grpc": netns.listening(GRPC)}
        # Bound to every address: reachable on another address than 127.0.0.1 too.
        report["ready_on_127.0.0.2"] = httpx.get(f"http://127.0.0.2:{HTTP}/v2/health/ready", timeout=5).status_code
        report["healthcheck_when_ready"] = subprocess.run(healthcheck, capture_output=True, timeout=30).returncode
        report["probes_when_ready"] = {kind: probe(get) for kind, get in plan["probes"].items()}

        rest = triton_http.InferenceServerClient(f"127.0.0.1:{HTTP}")
        report["rest_ready"] = rest.is_server_ready()
        result = rest.infer("simple", simple_inputs(triton_http))
        report["rest_infer"] = {n: result.as_numpy(n).tolist() for n in ("OUTPUT0", "OUTPUT1")}
        grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{GRPC}")
        report["grpc_live"] = grpc_client.is_server_live()
        result = grpc_client.infer("simple", simple_inputs(triton_grpc))
        report["grpc_infer"] = {n: result.as_numpy(n).tolist() for n in ("OUTPUT0", "OUTPUT1")}
        metrics = httpx.get(f"http://127.0.0.1:{HTTP}/metrics", timeout=5)
        report["metrics"] = {"status": metrics.status_code, "type": metrics.headers.get("content-type", ""),
                             "text": metrics.text[:20000]}

        # Kubernetes ends a pod with SIGTERM, then SIGKILL after the grace period: a request in flight finishes,
        # and the server exits 0 well within the grace period.
        answer: dict[str, Any] = {}

        def slow_request() -> None:
            body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [3], "data": [7, 8, 9]}],
                    "parameters": {"delay": 2.0}}
            response = httpx.post(f"http://127.0.0.1:{HTTP}/v2/models/slow/infer", json=body, timeout=60)
            answer.update(status=response.status_code, body=response.json())

        thread = threading.Thread(target=slow_request)
        thread.start()
        started = Path(plan["repository"]) / "slow"
        deadline = time.monotonic() + 30
        while not list(started.glob("started-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        sigterm_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # within the shutdown delay: not ready, still serving, new connections too
        report["probes_while_stopping"] = {kind: probe(get) for kind, get in plan["probes"].items()}
        result = httpx.post(f"http://127.0.0.1:{HTTP}/v2/models/simple/infer", timeout=5, json={"inputs": [
            {"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for i in (0, 1)]})
        report["infer_while_stopping"] = result.status_code
        report["exit_code"] = process.wait(timeout=plan["grace_seconds"])
        report["exit_after_sigterm_s"] = time.monotonic() - sigterm_at
        thread.join(timeout=30)
        report["in_flight"] = answer
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    report["left_behind"] = netns.other_processes()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
