"""Inside a node's namespaces (see netns.py): a local Ray cluster serving the generated Ray Serve config, driven
with tritonclient over REST and gRPC beside the plain server, then stopped. Run by test_ray.py; prints one JSON
report.

    python ray_serve_check.py PLAN.json

PLAN: `ray_bin` (the bin folder of a virtual environment with ray[serve] and the server's requirements),
`config` (the generated serve-config.yaml), `repository` (the model repository for args.model_repository),
`pythonpath` (the package and the Ray application's folder), `workdir` (scratch: Ray's temp dir, logs),
`calls` (requests per timed run), `http_port` and `grpc_port` (where the clients expect Ray's proxies: the
documented ports, not read from the config under test).

Stopping is looked at as a user stops it: `serve run` interrupted (it shuts the application down), then
`ray stop`; what is left after each is reported before anything is killed. Only then is whatever remains ended
by PID (`killed` lists them), so that nothing outlives the namespace either way.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import netns
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import yaml
from tritonclient.utils import InferenceServerException

START_TIMEOUT = 240.0


def simple_inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def outputs(result: Any) -> dict[str, list[Any]]:
    return {name: result.as_numpy(name).tolist() for name in ("OUTPUT0", "OUTPUT1")}


def wait(what: str, check: Any, processes: list[subprocess.Popen[bytes]], timeout: float = START_TIMEOUT) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{what}: {process.args!r} exited with {process.returncode}")
        try:
            if check():
                return time.monotonic() - started
        except Exception:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{what}: not in {timeout} s")


def grpc_code(call: Any) -> str:
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status())
    return "OK"


def drive(http_port: int, grpc_port: int, calls: int) -> dict[str, Any]:
    """Answers, errors and timings of one server (Ray's proxies or the plain server)."""
    out: dict[str, Any] = {}
    rest = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}")
    grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    out["rest_ready"] = rest.is_server_ready()
    out["rest_infer"] = outputs(rest.infer("simple", simple_inputs(triton_http)))
    out["grpc_live"] = grpc_client.is_server_live()
    out["grpc_ready"] = grpc_client.is_model_ready("simple")
    out["grpc_infer"] = outputs(grpc_client.infer("simple", simple_inputs(triton_grpc)))
    out["grpc_metadata_inputs"] = [i.name for i in grpc_client.get_model_metadata("simple").inputs]
    # Errors keep the server's own status over both transports.
    out["grpc_unknown_model"] = grpc_code(lambda: grpc_client.infer("no_such_model", simple_inputs(triton_grpc)))
    bad = [triton_grpc.InferInput("INPUT0", [1, 16], "INT32")]
    bad[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    out["grpc_missing_input"] = grpc_code(lambda: grpc_client.infer("simple", bad))
    out["grpc_model_failure"] = grpc_code(lambda: grpc_client.infer("failing", failing_input(triton_grpc)))
    response = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/no_such_model/infer", json={"inputs": []})
    out["rest_unknown_model"] = [response.status_code, response.json()]
    response = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/simple/infer",
                          json={"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1]}]})
    out["rest_bad_request"] = [response.status_code, response.json()]
    # A large answer (1 MiB, which the servicer serializes itself) and a large request, over both transports.
    big = np.arange(262144, dtype=np.float32)
    for name, client, module in (("rest", rest, triton_http), ("grpc", grpc_client, triton_grpc)):
        tensor = module.InferInput("INPUT0", [big.size], "FP32")
        tensor.set_data_from_numpy(big, **({"binary_data": True} if module is triton_http else {}))
        answer = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
        out[f"{name}_large_identity"] = bool(answer is not None and np.array_equal(answer, big))
    # Bytes that are not a ModelInferRequest at all.
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            call(b"\x0a\xff\xff\xff", timeout=30)
            out["grpc_malformed"] = "OK"
        except grpc.RpcError as exc:
            out["grpc_malformed"] = str(exc.code())
    # Which process answered, 16 requests in flight at a time (each takes 0.2 s), up to 8 rounds until more than
    # one process has answered: Ray's router spreads requests over the replicas by their queues.
    def whoami(_: int) -> int:
        body = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/whoami/infer", timeout=60,
                          json={"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [0]}]})
        pid: int = body.json()["outputs"][0]["data"][0]
        return pid

    pids: set[int] = set()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for _ in range(8):
            pids.update(pool.map(whoami, range(16)))
            if len(pids) > 1:
                break
    out["answering_pids"] = sorted(pids)
    # Streaming (bidirectional) inference over gRPC.
    streamed: list[Any] = []
    grpc_client.start_stream(callback=lambda result, error: streamed.append(error or outputs(result)))
    for request_id in ("1", "2"):
        grpc_client.async_stream_infer("simple", simple_inputs(triton_grpc), request_id=request_id)
    deadline = time.monotonic() + 30
    while len(streamed) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    grpc_client.stop_stream()
    out["grpc_stream"] = [s if isinstance(s, dict) else f"error: {s}" for s in streamed]
    out["timing"] = timing(rest, grpc_client, http_port, grpc_port, calls)
    rest.close()
    grpc_client.close()
    return out


def failing_input(module: Any) -> list[Any]:
    tensor = module.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    return [tensor]


def timing(rest: Any, grpc_client: Any, http_port: int, grpc_port: int, calls: int) -> dict[str, float]:
    """Milliseconds per sequential call and calls per second with 8 in flight, `simple` over each transport."""
    out: dict[str, float] = {}
    for name, client, module in (("rest", rest, triton_http), ("grpc", grpc_client, triton_grpc)):
        inputs = simple_inputs(module)
        for _ in range(20):
            client.infer("simple", inputs)
        started = time.perf_counter()
        for _ in range(calls):
            client.infer("simple", inputs)
        out[f"{name}_ms_per_call"] = (time.perf_counter() - started) * 1000 / calls

        def worker(count: int, module: Any = module, name: str = name) -> None:
            own = (triton_http.InferenceServerClient(f"127.0.0.1:{http_port}") if name == "rest"
                   else triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}"))
            own_inputs = simple_inputs(module)
            for _ in range(count):
                own.infer("simple", own_inputs)
            own.close()

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(worker, [calls // 8] * 8))
        out[f"{name}_per_s_at_8"] = (calls // 8 * 8) / (time.perf_counter() - started)
    return out


def stop_all(grace: float = 10.0) -> list[str]:
    """End the cluster's processes (every other process of this PID namespace, all started here) by PID: SIGTERM,
    then SIGKILL for those still there after `grace` seconds. The command lines of those that needed SIGKILL."""
    for pid, _ in netns.other_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while netns.other_processes() and time.monotonic() < deadline:
        reap()
        time.sleep(0.1)
    killed = []
    for pid, cmdline in netns.other_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(cmdline)
    time.sleep(0.2)
    reap()
    return killed


def settle(seconds: float = 10.0) -> list[str]:
    """The command lines of the processes left in this namespace once those that are ending are gone (reaped:
    this is their init), waiting `seconds` at most."""
    deadline = time.monotonic() + seconds
    while netns.other_processes() and time.monotonic() < deadline:
        reap()
        time.sleep(0.1)
    return [cmdline for _, cmdline in netns.other_processes()]


def reap() -> None:
    """Collect exited children (processes Ray's daemons left are re-parented to this one, the namespace's init)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    # A suite started in the background by a shell inherits SIGINT ignored, and so would `serve run`, which stops
    # on SIGINT: give it the default disposition.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    netns.loopback_up()
    workdir = Path(plan["workdir"])
    ray_bin = Path(plan["ray_bin"])
    env = {**os.environ, "PYTHONPATH": plan["pythonpath"], "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_DEDUP_LOGS": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    report: dict[str, Any] = {}
    config = yaml.safe_load(Path(plan["config"]).read_text())
    app = config["applications"][0]
    app["args"]["model_repository"] = plan["repository"]
    config_path = workdir / "serve-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    http_port, grpc_port = plan["http_port"], plan["grpc_port"]
    report["replicas"] = app["deployments"][0]["num_replicas"]
    processes: list[subprocess.Popen[bytes]] = []
    logs = workdir / "logs"
    logs.mkdir()
    try:
        started = time.monotonic()
        head = subprocess.run(
            [str(ray_bin / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", "--port=6379",
             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={workdir / 'ray'}"],
            env=env, capture_output=True, text=True, timeout=START_TIMEOUT,
        )
        if head.returncode != 0:
            raise RuntimeError(f"ray start failed: {head.stdout[-3000:]}{head.stderr[-3000:]}")
        report["ray_start_s"] = time.monotonic() - started
        with (logs / "serve-run.log").open("wb") as log:
            serve_run = subprocess.Popen([str(ray_bin / "serve"), "run", "--address=127.0.0.1:6379", str(config_path)],
                                         env=env, stdout=log, stderr=subprocess.STDOUT)
        processes.append(serve_run)
        report["serve_ready_s"] = wait(
            "Ray Serve", lambda: httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready").status_code == 200
            and triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}").is_server_live(), processes)
        report["ray"] = drive(http_port, grpc_port, plan["calls"])

        with (logs / "plain.log").open("wb") as log:
            plain = subprocess.Popen(
                [sys.executable, "-m", plan["package"], "serve", f"--model-repository={plan['repository']}",
                 "--host=127.0.0.1", "--http-port=18000", "--grpc-port=18001"],
                env={**os.environ, "PYTHONPATH": plan["pythonpath"]}, stdout=log, stderr=subprocess.STDOUT)
        processes.append(plain)
        wait("plain server", lambda: httpx.get("http://127.0.0.1:18000/v2/health/ready").status_code == 200, processes)
        report["plain"] = drive(18000, 18001, plan["calls"])
        plain.send_signal(signal.SIGTERM)
        report["plain_exit"] = plain.wait(timeout=30)

        # Stop as a user does: serve run shuts the applications down on SIGINT; then `ray stop` ends the cluster.
        stopping = time.monotonic()
        serve_run.send_signal(signal.SIGINT)
        report["serve_run_exit"] = serve_run.wait(timeout=60)
        reap()
        report["after_serve_run"] = [cmdline for _, cmdline in netns.other_processes()]
        ray_stop = subprocess.run([str(ray_bin / "ray"), "stop"], env=env, capture_output=True, text=True,
                                  timeout=120)
        report["ray_stop_exit"] = ray_stop.returncode
        report["after_ray_stop"] = settle()
        report["stop_s"] = time.monotonic() - stopping
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        report["killed"] = [cmdline for _, cmdline in netns.other_processes()]  # still there, whatever happened
        stop_all()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
