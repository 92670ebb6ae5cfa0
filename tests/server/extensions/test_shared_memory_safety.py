"""System shared memory that cannot be turned against the host, against the generated server.

- `--shared-memory-prefix`: only keys with the prefix register; another application's segment is refused.
- `--shared-memory-max-regions` / `--shared-memory-max-bytes`: past either cap, register answers 429 `{"error"}`
  over REST and RESOURCE_EXHAUSTED over gRPC, and other clients are served meanwhile.
- A held region keeps no file descriptor (the server's descriptor count does not grow with registrations), its
  object stays mapped while registered and is unmapped by unregister (/proc/PID/maps).
- Region names and keys are validated; an object replaced or shrunk after registration is refused, never read.
- `--shared-memory off`: not listed in the server metadata; every endpoint answers 501 / UNIMPLEMENTED, and so does
  an inference that names a region.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jsonschema
import numpy as np
import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import Server, assert_error_body, build_repository, check_simple, grpc_call, running

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no POSIX shared memory (/dev/shm) on this host")

PREFIX = "/oipgen_safe_"
MAX_REGIONS = 8
MAX_BYTES = 1 << 20


@contextlib.contextmanager
def shm_object(size: int, prefix: str = PREFIX) -> Iterator[str]:
    """A shared memory object of `size` zero bytes under /dev/shm; its key. Removed on the way out."""
    key = f"{prefix}{uuid.uuid4().hex[:12]}"
    path = SHM / key[1:]
    with path.open("wb") as handle:
        handle.truncate(size)
    try:
        yield key
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("shm_safe")
    options = ("--shared-memory-prefix", PREFIX, "--shared-memory-max-regions", str(MAX_REGIONS),
               "--shared-memory-max-bytes", str(MAX_BYTES))
    with running(build_repository(root / "models", only=("simple", "identity_fp32")), root, *options) as server:
        yield server


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("shm_off")
    with running(build_repository(root / "models", only=("simple", "identity_fp32")), root,
                 "--shared-memory", "off") as server:
        yield server


def register(http: httpx.Client, name: str, key: str, byte_size: int, offset: int = 0) -> httpx.Response:
    return http.post(f"/v2/systemsharedmemory/region/{name}/register",
                     json={"key": key, "byte_size": byte_size, "offset": offset})


def fd_count(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def mapped(server: Server, key: str) -> bool:
    return f"/dev/shm/{key[1:]}" in Path(f"/proc/{server.process.pid}/maps").read_text()


def test_prefix_admits_only_its_keys(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    with shm_object(64, prefix="/other_application_") as foreign, shm_object(64) as mine:
        message = assert_error_body(register(http, "foreign", foreign, 64), 400)
        assert f"only registers keys that start with '{PREFIX}'" in message, message
        code, error = grpc_call(stub, "SystemSharedMemoryRegister",
                                pb.SystemSharedMemoryRegisterRequest(name="foreign", key=foreign, byte_size=64))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "--shared-memory-prefix" in error.details()
        assert http.get("/v2/systemsharedmemory/status").json() == []
        assert register(http, "mine", mine, 64).status_code == 200
        try:
            assert [r["key"] for r in http.get("/v2/systemsharedmemory/status").json()] == [mine]
        finally:
            assert http.post("/v2/systemsharedmemory/region/mine/unregister").status_code == 200


def test_caps_refuse_before_resources_run_out(server: Server, http: httpx.Client,
                                              stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    names = [f"held_{i}" for i in range(MAX_REGIONS)]
    with shm_object(4096) as key:
        before = fd_count(server)
        try:
            for name in names:
                assert register(http, name, key, 4096).status_code == 200
            # no descriptor per held region; the object is mapped
            assert fd_count(server) <= before + 1, (before, fd_count(server))
            assert mapped(server, key)
            # the count cap, on both transports
            message = assert_error_body(register(http, "one_too_many", key, 4096), 429)
            assert "--shared-memory-max-regions" in message, message
            code, error = grpc_call(stub, "SystemSharedMemoryRegister",
                                    pb.SystemSharedMemoryRegisterRequest(name="one_too_many", key=key, byte_size=8))
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "regions are registered" in error.details()
            check_simple(http, stub)  # other clients are served while the regions are held
            # a region holds: inference through it still works
            body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                    "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": names[0],
                                                                   "shared_memory_byte_size": 16}}]}
            assert http.post("/v2/models/identity_fp32/infer", json=body).status_code == 200
            assert np.frombuffer((SHM / key[1:]).read_bytes()[:16], "<f4").tolist() == [1, 2, 3, 4]
        finally:
            assert http.post("/v2/systemsharedmemory/unregister").status_code == 200
        assert http.get("/v2/systemsharedmemory/status").json() == []
        assert not mapped(server, key)  # unregister unmapped it
    with shm_object(MAX_BYTES) as big:
        assert register(http, "half", big, MAX_BYTES // 2 + 1).status_code == 200
        try:
            message = assert_error_body(register(http, "other_half", big, MAX_BYTES // 2), 429)
            assert f"exceed the {MAX_BYTES} bytes" in message and "--shared-memory-max-bytes" in message, message
            code, _ = grpc_call(stub, "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(
                name="other_half", key=big, byte_size=MAX_BYTES // 2))
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert register(http, "rest", big, MAX_BYTES // 2 - 1).status_code == 200  # exactly up to the cap
        finally:
            assert http.post("/v2/systemsharedmemory/unregister").status_code == 200
    check_simple(http, stub)


@pytest.mark.parametrize(
    ("name", "key", "message"),
    [
        ("r", PREFIX + "a/b", "no other '/'"),
        ("r", "/" + PREFIX, "no other '/'"),
        ("r", PREFIX + "a\0b", "no NUL"),
        ("r", PREFIX + "x" * 300, "at most 255 bytes"),
        ("r", "/..", "invalid shared memory key"),
        ("x" * 300, PREFIX + "a", "at most 255 characters"),
        ("line\nbreak", PREFIX + "a", "no control characters"),
        ("c1\x85control", PREFIX + "a", "no control characters"),
    ],
    ids=["slash", "double_leading_slash", "nul", "long_key", "dotdot", "long_name", "control_name", "c1_name"],
)
def test_names_and_keys_are_validated(http: httpx.Client, stub: pb_grpc.GRPCInferenceServiceStub, name: str,
                                      key: str, message: str) -> None:
    got = assert_error_body(_register_named(http, name, key), 400)
    assert message in got, got
    code, error = grpc_call(stub, "SystemSharedMemoryRegister",
                            pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=8))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and message in error.details()


def test_any_name_without_control_characters_is_a_region_name(http: httpx.Client) -> None:
    """The spec's pattern refuses only C0 and C1 control characters: other characters (private use, unassigned,
    not printable to Python) name a region; the answer is then about the key, not the name."""
    name = "r\U000fc072\u00e2\U000e250e"
    got = assert_error_body(_register_named(http, name, PREFIX + "a/b"), 400)
    assert "no other '/'" in got and "region name" not in got, got


# Names at the edges of the rule: control characters (C0, DEL, C1) anywhere, a final newline (which Python's `$`
# admits), "/", the length bound, and characters next to the refused ranges.
_NAMES = ["r", "a\n", "\n", "a\nb", "\x85", "c1\x9f", "\x7f", "~\xa0", "\x1f", "a/b", " ", "%0A", "x" * 255, "x" * 256,
          "\U000fc072", "\u2028"]


def _region_name_schema(http: httpx.Client) -> dict[str, Any]:
    """The published schema of a region name (the path parameter of register)."""
    document = http.get("/openapi.json").json()
    operation = document["paths"]["/v2/systemsharedmemory/region/{region_name}/register"]["post"]
    schema: dict[str, Any] = next(p["schema"] for p in operation["parameters"] if p["name"] == "region_name")
    return schema


def _accepted(http: httpx.Client) -> list[bool]:
    """Which of _NAMES the server takes as a region name (register gets to the key, and refuses that)."""
    accepted = []
    for name in _NAMES:
        got = _register_named(http, name, PREFIX + "a/b")
        assert got.status_code in (400, 404), got.text
        accepted.append(got.status_code == 400 and "no other '/'" in got.json()["error"])
    return accepted


def test_the_documented_name_is_exactly_the_accepted_name(http: httpx.Client) -> None:
    """The published schema of a region name, read with Python's `re` (jsonschema), admits exactly the names the
    server accepts in the path of register (and of unregister)."""
    schema = _region_name_schema(http)
    python = [jsonschema.Draft202012Validator(schema).is_valid(name) for name in _NAMES]
    accepted = _accepted(http)
    assert python == accepted, list(zip(_NAMES, python, accepted, strict=True))
    # unregister takes the same names: an unknown one is no error (as in Triton), one no region can have is
    unregistered = [http.post(f"/v2/systemsharedmemory/region/{urllib.parse.quote(name, safe='')}/unregister")
                    .status_code == 200 for name in _NAMES]
    assert unregistered == accepted, list(zip(_NAMES, unregistered, accepted, strict=True))
    assert accepted.count(True) == 7, list(zip(_NAMES, accepted, strict=True))


def test_the_documented_name_reads_the_same_in_ecma_262(http: httpx.Client) -> None:
    """The same schema read as a JavaScript client reads it (ECMA-262 regular expressions, with node) admits
    exactly the names the server accepts."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the region name's pattern is not read with ECMA-262 here")
    schema = _region_name_schema(http)
    assert set(schema) == {"type", "minLength", "maxLength", "allOf"}  # what the script reads
    script = ("const s = JSON.parse(process.argv[1]); const names = JSON.parse(process.argv[2]);"
              "const ok = n => n.length >= s.minLength && [...n].length <= s.maxLength"
              " && s.allOf.every(a => !new RegExp(a.not.pattern, 'u').test(n));"
              "console.log(JSON.stringify(names.map(ok)));")
    done = subprocess.run([node, "-e", script, json.dumps(schema), json.dumps(_NAMES)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    accepted = _accepted(http)
    assert json.loads(done.stdout) == accepted, list(zip(_NAMES, json.loads(done.stdout), accepted, strict=True))


def _register_named(http: httpx.Client, name: str, key: str) -> httpx.Response:
    """Register over REST under any region name: it travels in the path, percent-encoded."""
    return http.post(f"/v2/systemsharedmemory/region/{urllib.parse.quote(name, safe='')}/register",
                     json={"key": key, "byte_size": 8})


def test_replaced_or_shrunk_object_is_refused(server: Server, http: httpx.Client,
                                              stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                        "parameters": {"shared_memory_region": "moving", "shared_memory_byte_size": 16}}]}
    with shm_object(64) as key:
        path = SHM / key[1:]
        with path.open("r+b") as handle, mmap.mmap(handle.fileno(), 64) as view:
            view[:16] = np.array([1, 2, 3, 4], "<f4").tobytes()
        assert register(http, "moving", key, 64).status_code == 200
        try:
            answer = http.post("/v2/models/identity_fp32/infer", json=body)
            assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [1, 2, 3, 4]
            os.truncate(path, 8)  # shrunk below the region: refused, never a SIGBUS
            assert "shrank to 8 bytes" in assert_error_body(http.post("/v2/models/identity_fp32/infer", json=body), 400)
            path.unlink()  # replaced by another object of the same name
            with path.open("wb") as handle:
                handle.truncate(64)
            message = assert_error_body(http.post("/v2/models/identity_fp32/infer", json=body), 400)
            assert "removed or replaced" in message, message
        finally:
            assert http.post("/v2/systemsharedmemory/region/moving/unregister").status_code == 200
    check_simple(http, stub)


def test_off_is_not_advertised_and_unimplemented(off: Server) -> None:
    with off.clients() as (http, stub), shm_object(64) as key:
        assert "system_shared_memory" not in http.get("/v2").json()["extensions"]
        assert "system_shared_memory" not in stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=30).extensions
        for method, path, payload in (("POST", "/v2/systemsharedmemory/region/r/register", {"key": key,
                                                                                            "byte_size": 64}),
                                      ("GET", "/v2/systemsharedmemory/status", None),
                                      ("GET", "/v2/systemsharedmemory/region/r/status", None),
                                      ("POST", "/v2/systemsharedmemory/region/r/unregister", None),
                                      ("POST", "/v2/systemsharedmemory/unregister", None)):
            assert_error_body(http.request(method, path, json=payload), 501)
        calls: list[tuple[str, Any]] = [
            ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name="r", key=key, byte_size=64)),
            ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
            ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="r")),
        ]
        for method, message in calls:
            code, _ = grpc_call(stub, method, message)
            assert code is grpc.StatusCode.UNIMPLEMENTED, method
        body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}]}
        assert_error_body(http.post("/v2/models/identity_fp32/infer", json=body), 501)
        assert not mapped(off, key)
        check_simple(http, stub)
