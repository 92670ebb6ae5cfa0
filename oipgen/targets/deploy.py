"""Target `deploy`: what the engines users already run need to serve the package, written beside it in
`<out>/deploy/`: a Containerfile, KServe's ServingRuntime and InferenceService, and a Ray Serve application with
its config. Settings come from `[tool.oipgen.deploy]`; every one has a default (`DEFAULTS`).

The server's command line is decided here once (`serve_command`): the Containerfile's CMD and the
ServingRuntime's container run exactly the same one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..output import Tree
from ..render import steers_lines
from . import Context, requirements, resolve

MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts the model repository
HTTP_PORT = 8080  # KServe's ports for a runtime's REST and gRPC servers
GRPC_PORT = 8081
HEALTH_READY = "/v2/health/ready"
HEALTH_LIVE = "/v2/health/live"
METRICS_PATH = "/metrics"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Bounds of the models' requirements: how many, how long each, how large a requirements file.
MAX_MODEL_REQUIREMENTS = 200
MAX_REQUIREMENT_CHARS = 400
MAX_REQUIREMENTS_FILE_BYTES = 64 * 1024
MODEL_REQUIREMENTS_KEY = "[tool.oipgen.deploy] model_requirements"


@dataclass(frozen=True)
class DeploySettings:
    image: str  # the image the Containerfile builds and the ServingRuntime runs
    runtime: str  # ServingRuntime name
    service: str  # InferenceService name
    model_format: str  # the model format the runtime serves (supportedModelFormats, predictor.model.modelFormat)
    model_format_version: str
    storage_uri: str  # where KServe downloads the model repository from; a placeholder to replace
    base_image: str  # the Containerfile's FROM
    uid: int  # the image's non-root user
    cpu: str  # the container's requests and limits (Kubernetes quantities)
    memory: str
    min_replicas: int  # KServe's autoscaler bounds (RawDeployment: a HorizontalPodAutoscaler on CPU)
    max_replicas: int
    scale_target: int  # % CPU utilization the autoscaler aims at
    termination_grace_seconds: int  # the pod's grace period after SIGTERM; the server drains within it
    # After SIGTERM, the seconds the server goes on serving while not ready, as the pod leaves the Service's
    # endpoints: connections that still come meanwhile are answered rather than refused.
    shutdown_delay_seconds: int
    workers: int  # server processes in one container (`serve --workers N`), for a pod with N cores
    ray_replicas: int  # Ray Serve replicas of the application's deployment
    ray_num_cpus: float  # CPUs each Ray replica reserves
    ray_http_port: int  # Ray Serve's HTTP and gRPC proxies
    ray_grpc_port: int
    # The models' own Python requirements (PEP 508), installed in the image in a layer of their own, and where
    # they were read: the setting itself, or the requirements file it names.
    model_requirements: tuple[str, ...] = ()
    model_requirements_from: str = MODEL_REQUIREMENTS_KEY

    @property
    def stop_seconds(self) -> int:
        """How long the server may take from SIGTERM: the grace period less the time to stop."""
        return max(1, self.termination_grace_seconds - 5)

    @property
    def drain_seconds(self) -> int:
        """How long requests in flight may finish after the shutdown delay."""
        return max(1, self.stop_seconds - self.shutdown_delay_seconds)


def defaults(package: str) -> dict[str, Any]:
    name = package.replace("_", "-").lower()
    return {
        "image": f"{name}-server:latest",
        "runtime": f"{name}-runtime",
        "service": f"{name}-models",
        "model_format": name,
        "model_format_version": "1",
        "storage_uri": "s3://YOUR-BUCKET/path/to/model-repository",
        "base_image": "python:3.11-slim",
        "uid": 1000,
        "cpu": "1",
        "memory": "2Gi",
        "min_replicas": 1,
        "max_replicas": 4,
        "scale_target": 80,
        "termination_grace_seconds": 30,
        "shutdown_delay_seconds": 5,
        "workers": 1,
        "ray_replicas": 2,
        "ray_num_cpus": 1.0,
        "ray_http_port": 8000,
        "ray_grpc_port": 9000,
        "model_requirements": [],  # or the path of a requirements file, from the project's folder
    }


def parse_settings(raw: Mapping[str, Any], package: str, root: Path = Path(".")) -> DeploySettings:
    """`[tool.oipgen.deploy]` over the defaults; ValueError names every key that is unknown or of the wrong kind.
    A requirements file named by model_requirements is read from `root`, the project's folder."""
    values = defaults(package)
    problems = [f"unknown setting {key!r}" for key in sorted(raw) if key not in values]
    for key, value in raw.items():
        if key not in values:
            continue
        if key == "model_requirements" and isinstance(value, str):
            values[key] = value
            continue
        want = type(values[key])
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not want:
            problems.append(f"{key} must be a {want.__name__}, got {value!r}")
            continue
        values[key] = value
    for key, value in values.items():
        if isinstance(value, str) and steers_lines(value):
            problems.append(f"{key} {value!r} holds a line break, a tab or another control character")
    for key in ("runtime", "service", "model_format"):
        if not _DNS_LABEL.fullmatch(str(values[key])):
            problems.append(f"{key} {values[key]!r} is not a Kubernetes name (lower case letters, digits and '-')")
    for key in ("uid", "min_replicas", "max_replicas", "scale_target", "termination_grace_seconds", "ray_replicas",
                "workers"):
        if values[key] < (0 if key == "min_replicas" else 1):
            problems.append(f"{key} must be positive, got {values[key]}")
    if values["shutdown_delay_seconds"] < 0:
        problems.append(f"shutdown_delay_seconds must be 0 or more, got {values['shutdown_delay_seconds']}")
    elif values["termination_grace_seconds"] < values["shutdown_delay_seconds"] + 6:
        problems.append(f"termination_grace_seconds ({values['termination_grace_seconds']}) must leave the drain a "
                        f"second after shutdown_delay_seconds ({values['shutdown_delay_seconds']}) and 5 s to stop")
    if values["uid"] == 0:
        problems.append("uid must not be 0: the image runs as a non-root user")
    if values["min_replicas"] > values["max_replicas"]:
        problems.append("min_replicas is larger than max_replicas")
    if values["ray_num_cpus"] <= 0:
        problems.append("ray_num_cpus must be positive")
    for key in ("ray_http_port", "ray_grpc_port"):
        if not 1 <= values[key] <= 65535:
            problems.append(f"{key} {values[key]} is not a port")
    for key in ("image", "base_image", "storage_uri", "cpu", "memory", "model_format_version"):
        word = str(values[key])
        # One word that starts with a letter or digit: no space to split it, no quote or backslash to escape, no
        # leading YAML indicator (`&`, `*`, `!`, `-`, `{`...) to change what the YAML manifests read.
        if not word[:1].isalnum() or any(c.isspace() or c in "\"'\\" for c in word):
            problems.append(f"{key} {values[key]!r} must be one word without quotes, starting with a letter or digit")
    requirements, source = _model_requirements(values["model_requirements"], root, problems)
    if problems:
        raise ValueError("[tool.oipgen.deploy]: " + "; ".join(problems))
    chosen = {f.name: values[f.name] for f in fields(DeploySettings) if f.name in values}
    return DeploySettings(**{**chosen, "model_requirements": requirements, "model_requirements_from": source})


def _model_requirements(value: list[Any] | str, root: Path, problems: list[str]) -> tuple[tuple[str, ...], str]:
    """The models' requirements, each a PEP 508 requirement on one line: from the list itself, or read from the
    requirements file it names (requirements only, one a line; blank lines and `#` comments pass; pip options do
    not). Every problem is added to `problems`, naming the entry."""
    from packaging.requirements import InvalidRequirement, Requirement

    if isinstance(value, str):
        source = value
        path = root / value
        if not path.is_file():  # not a device, a pipe or a folder: read whole or not at all
            problems.append(f"model_requirements: {value!r} is not a file")
            return (), source
        try:
            with path.open("rb") as f:
                data = f.read(MAX_REQUIREMENTS_FILE_BYTES + 1)
        except OSError as e:
            problems.append(f"model_requirements: cannot read {value!r}: {e.strerror or e}")
            return (), source
        if len(data) > MAX_REQUIREMENTS_FILE_BYTES:
            problems.append(f"model_requirements: {value!r} is larger than {MAX_REQUIREMENTS_FILE_BYTES} bytes")
            return (), source
        text = data.decode("utf-8", "replace")
        # Split on "\n" alone: any other line break left in a line is refused below, never turned into a line.
        lines = text.removesuffix("\n").split("\n")
        # A `#` at the start or after a space starts a comment, as pip reads the file; "\r\n" ends a line too.
        entries = [(f"{value}:{n}", re.sub(r"(^|[ ])#.*", "", line.removesuffix("\r")).strip(" "))
                   for n, line in enumerate(lines, 1)]
        entries = [(where, line) for where, line in entries if line]
    else:
        source = MODEL_REQUIREMENTS_KEY
        entries = [(f"model_requirements[{i}]", item) for i, item in enumerate(value)]
    if len(entries) > MAX_MODEL_REQUIREMENTS:
        problems.append(f"model_requirements: {len(entries)} requirements, more than {MAX_MODEL_REQUIREMENTS}")
        return (), source
    out = []
    for where, item in entries:
        if not isinstance(item, str):
            problems.append(f"{where} must be a string, got {item!r}")
            continue
        shown = item if len(item) <= 80 else item[:80] + "..."
        if len(item) > MAX_REQUIREMENT_CHARS:
            problems.append(f"{where} {shown!r} is longer than {MAX_REQUIREMENT_CHARS} characters")
        elif steers_lines(item):
            problems.append(f"{where} {shown!r} holds a line break, a tab or another control character")
        elif item.startswith("-"):
            problems.append(f"{where} {shown!r} is a pip option; list requirements only (index settings belong in "
                            "pip's configuration or the base image)")
        else:
            try:
                Requirement(item)
            except InvalidRequirement as e:
                problems.append(f"{where} {shown!r} is not a requirement (PEP 508): {str(e).splitlines()[0]}")
                continue
            out.append(item.strip())
    return tuple(out), source


def serve_command(package: str, settings: DeploySettings) -> list[str]:
    """The server's command line in a container: the repository KServe mounts, every address, KServe's ports,
    a shutdown delay and a drain that end within the pod's grace period, and the worker processes asked for."""
    workers = [f"--workers={settings.workers}"] if settings.workers > 1 else []
    delay = [f"--shutdown-delay-seconds={settings.shutdown_delay_seconds}"] if settings.shutdown_delay_seconds else []
    return [
        "python", "-m", package, "serve",
        f"--model-repository={MODEL_DIR}",
        "--host=0.0.0.0",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        *delay,
        f"--graceful-shutdown-seconds={settings.drain_seconds}",
        *workers,
    ]


def build(ctx: Context, tree: Tree) -> None:
    settings = parse_settings(ctx.settings.get("deploy", {}), ctx.package)
    command = serve_command(ctx.package, settings)
    server_requirements = requirements(resolve(["server"]))
    variables = {
        "deploy": settings,
        "command": command,
        "requirements": server_requirements,
        # Shell words for the models' layer: their requirements, then the server's again, so that pip resolves
        # both together and a model requirement that conflicts with the server's fails the image build.
        "model_install": [shlex.quote(r) for r in (*settings.model_requirements, *server_requirements)],
        "model_dir": MODEL_DIR,
        "http_port": HTTP_PORT,
        "grpc_port": GRPC_PORT,
        "health_ready": HEALTH_READY,
        "health_live": HEALTH_LIVE,
        "metrics_path": METRICS_PATH,
        "note": "\n".join(ctx.header.splitlines()[:2]),
        "ray_module": f"{ctx.package}_ray",
    }
    available = ctx.renderer.env.list_templates(extensions=["jinja"])
    for name in sorted(t for t in available if t.startswith("deploy/")):
        path = name.removesuffix(".jinja").replace("PACKAGE", ctx.package)
        tree.add_beside(path, ctx.renderer.render(name, **variables))
