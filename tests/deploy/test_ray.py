"""The generated Ray Serve application (generated/deploy/ray) on a local Ray cluster, driven by tritonclient.

The set-up installs `ray[serve]` and the server's requirements into a virtual environment cached in tests/.cache
(kept between runs while the requirements are the same; about a minute to make with pip's cache warm). The
cluster runs inside private network, PID and mount namespaces (netns.py): a head node on loopback, `serve run`
on the generated serve-config.yaml as generated (2 replicas, Ray's HTTP proxy on 8000 and gRPC proxy on 9000),
but for args.model_repository, which names a test repository. Ray cannot clash with another Ray on the machine,
and its processes are ended by PID, with nothing left when the namespace's first process exits. The plain server
runs beside it in the same namespace for the same calls; the timings are recorded in
tests/.cache/ray-report.json, never asserted. A cold run takes 3-5 minutes on this 2-core machine (install
included); warm, about 2.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import netns
import pytest
import yaml
from conftest import GENERATED, TESTS
from serving import build_repository
from test_deploy import RAY_GRPC_PORT, RAY_HTTP_PORT
from venvs import installer

from oipgen.output import read_manifest

pytestmark = pytest.mark.ray

RAY = "ray[serve]==2.60.0"
CACHE = TESTS / ".cache"
INSTALL_TIMEOUT = 900.0
RUN_TIMEOUT = 600.0
CONFIG = GENERATED / "deploy" / "ray" / "serve-config.yaml"

# Answers, after 0.2 s, with the PID of the process that ran it: which replica answered.
WHOAMI = '''
import os
import time

import numpy as np

from oip.server.model import Model, TensorSpec


class WhoAmI(Model):
    inputs = [TensorSpec("INPUT0", "INT32", [1])]
    outputs = [TensorSpec("OUTPUT0", "INT64", [1])]

    def infer(self, inputs, parameters):
        time.sleep(0.2)
        return {"OUTPUT0": np.array([os.getpid()], dtype=np.int64)}
'''
SIMPLE = {"OUTPUT0": [list(range(1, 17))], "OUTPUT1": [list(range(-1, 15))]}


def ray_venv() -> Path:
    """A virtual environment with ray[serve] and the server's requirements (made once, reused while they hold)."""
    manifest = read_manifest(GENERATED / "oip")
    assert manifest is not None
    wanted = [RAY, *manifest["runtime_requirements"]]
    venv = CACHE / "ray-venv"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "ray-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = venv / "oipgen-requirements.json"
        if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
            return venv
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
        install = subprocess.run([*installer(venv), *wanted], capture_output=True, text=True,
                                 timeout=INSTALL_TIMEOUT)
        assert install.returncode == 0, f"installing {wanted} failed:\n{install.stdout[-3000:]}{install.stderr[-3000:]}"
        stamp.write_text(json.dumps(wanted))
    return venv


@pytest.fixture(scope="module")
def ray(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    why_not = netns.available()
    if why_not:
        pytest.skip(f"no private namespaces for the Ray cluster: {why_not}")
    started = time.monotonic()
    venv = ray_venv()
    installed = time.monotonic() - started
    work = Path(tmp_path_factory.mktemp("ray", numbered=True))
    repository = build_repository(work / "models", extra=("failing",), only=("simple", "identity_fp32"))
    (repository / "whoami").mkdir()
    (repository / "whoami" / "model.toml").write_text('class = "model:WhoAmI"\n')
    (repository / "whoami" / "model.py").write_text(textwrap.dedent(WHOAMI))
    plan = {
        "ray_bin": str(venv / "bin"),
        "config": str(CONFIG),
        "repository": str(repository),
        "pythonpath": f"{GENERATED}:{GENERATED / 'deploy' / 'ray'}",
        "workdir": str(work),
        "calls": 200,
        "package": "oip",
        "http_port": RAY_HTTP_PORT,
        "grpc_port": RAY_GRPC_PORT,
    }
    (work / "plan.json").write_text(json.dumps(plan))
    report = netns.run(TESTS / "ray_serve_check.py", str(work / "plan.json"), timeout=RUN_TIMEOUT)
    report["install_s"] = installed
    report["total_s"] = time.monotonic() - started
    (CACHE / "ray-report.json").write_text(json.dumps({k: v for k, v in report.items() if k != "stderr"}, indent=2))
    return report


def test_the_config_is_the_generated_one_with_two_replicas(ray: dict[str, Any]) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert ray["replicas"] == config["applications"][0]["deployments"][0]["num_replicas"] == 2
    assert config["grpc_options"]["grpc_servicer_functions"] == [
        "oip.grpc.grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"]
    assert config["applications"][0]["args"] == {"model_repository": "/mnt/models"}


@pytest.mark.parametrize("server", ["ray", "plain"])
def test_tritonclient_gets_the_right_numbers_over_rest_and_grpc(ray: dict[str, Any], server: str) -> None:
    answers = ray[server]
    assert answers["rest_ready"] is True and answers["grpc_live"] is True and answers["grpc_ready"] is True
    assert answers["rest_infer"] == SIMPLE
    assert answers["grpc_infer"] == SIMPLE
    assert answers["grpc_metadata_inputs"] == ["INPUT0", "INPUT1"]
    assert answers["grpc_stream"] == [SIMPLE, SIMPLE]  # ModelStreamInfer, bidirectional, through Ray's proxy


@pytest.mark.parametrize("server", ["ray", "plain"])
def test_a_large_tensor_goes_both_ways(ray: dict[str, Any], server: str) -> None:
    assert ray[server]["rest_large_identity"] is True
    assert ray[server]["grpc_large_identity"] is True


def test_errors_keep_their_status_through_ray(ray: dict[str, Any]) -> None:
    through_ray, plain = ray["ray"], ray["plain"]
    for key in ("grpc_unknown_model", "grpc_missing_input", "grpc_model_failure", "rest_unknown_model",
                "rest_bad_request"):
        assert through_ray[key] == plain[key], key
    assert through_ray["grpc_unknown_model"] == "StatusCode.NOT_FOUND"
    assert through_ray["grpc_missing_input"] == "StatusCode.INVALID_ARGUMENT"  # a client error, not INTERNAL
    assert through_ray["grpc_model_failure"] == "StatusCode.INTERNAL"
    assert through_ray["rest_unknown_model"][0] == 404 and "error" in through_ray["rest_unknown_model"][1]
    assert through_ray["rest_bad_request"][0] == 400
    # Bytes that are no request message: Ray's proxy parses them with the generated servicer's deserializer and
    # answers UNKNOWN itself; the plain server refuses them as INVALID_ARGUMENT. Never INTERNAL.
    assert plain["grpc_malformed"] == "StatusCode.INVALID_ARGUMENT"
    assert through_ray["grpc_malformed"] != "StatusCode.INTERNAL"


def test_both_replicas_answer(ray: dict[str, Any]) -> None:
    assert len(ray["ray"]["answering_pids"]) == 2
    assert len(ray["plain"]["answering_pids"]) == 1


def test_stopping_leaves_nothing_behind(ray: dict[str, Any]) -> None:
    """Looked at before anything is killed: once `serve run` is interrupted no replica (nor anything of the
    application) runs, and once `ray stop` has run nothing at all is left; nothing needed killing after."""
    assert ray["plain_exit"] == 0
    assert ray["serve_run_exit"] == 0
    serve = [c for c in ray["after_serve_run"] if c.startswith(("ray::Serve", "ray::ProxyActor"))]
    assert serve == [], serve  # the replicas (ray::ServeReplica:oip:oip), Serve's controller and proxies
    assert ray["ray_stop_exit"] == 0
    assert ray["after_ray_stop"] == []
    assert ray["killed"] == []
