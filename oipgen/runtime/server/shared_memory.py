"""The system shared memory extension: tensor data in POSIX shared memory instead of the request and response.

A client creates a shared memory object (`shm_open`, on Linux a file under /dev/shm), registers a region of it
under a name (`SystemSharedMemoryRegister`: name, key, offset, byte size), and then names the region in a
tensor's parameters instead of sending the data:

- an input with `shared_memory_region`, `shared_memory_byte_size` and optionally `shared_memory_offset` (and no
  `data`, binary data, `contents` or raw entry) is read from the region: `shared_memory_byte_size` bytes in the
  raw form of the tensor (little-endian, BYTES framed as 4-byte length + bytes);
- a requested output with the same parameters is written into the region; the response output then has its
  name, datatype and shape and nothing else (no data, no parameters: Triton's response; over gRPC its
  `raw_output_contents` entry is empty, so the entries of the other outputs keep their positions).

Everything is checked as Triton checks it: the key names an existing shared memory object (a regular file,
symbolic links refused), the registered region lies inside the object as it is now, a name is registered once,
a tensor's offset and size lie inside its region, an input's size is exactly its data's size, an output fits
its space. Unregistering a region that requests still use takes effect when they finish (the name is free at
once). The object is mapped with `mmap`; its size is checked again before every access, so a client that
shrinks it gets an error rather than crashing the server.

Shared memory is available where /dev/shm is (Linux); elsewhere the extension answers UNIMPLEMENTED and is not
listed in the server metadata. CUDA shared memory is not implemented: this server has no GPU stack.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy.typing as npt

from .. import codec, extensions
from .errors import AlreadyExists, InvalidRequest, NotFound, Unimplemented

__all__ = [
    "BYTE_SIZE",
    "OFFSET",
    "REGION",
    "Placement",
    "Region",
    "SharedMemory",
    "placement_of",
]

REGION: Final = extensions.SHARED_MEMORY_REGION
OFFSET: Final = extensions.SHARED_MEMORY_OFFSET
BYTE_SIZE: Final = extensions.SHARED_MEMORY_BYTE_SIZE
KEYS: Final = frozenset({REGION, OFFSET, BYTE_SIZE})

ROOT: Final = Path("/dev/shm")
_NAME_MAX: Final = 255


class Region:
    """A registered region: `byte_size` bytes at `offset` of the shared memory object `key`, mapped."""

    __slots__ = ("_fd", "_map", "_users", "_view", "byte_size", "key", "name", "offset", "retired")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._fd = fd
        self._map = mapping
        self._view: memoryview | None = memoryview(mapping)[offset:offset + byte_size]
        self._users = 0
        self.retired = False  # unregistered: closed once the last user is done

    def _checked_view(self, offset: int, size: int) -> memoryview:
        view = self._view
        if view is None:
            raise NotFound(f"shared memory region '{self.name}' is no longer registered")
        try:
            actual = os.fstat(self._fd).st_size
        except OSError as exc:
            raise InvalidRequest(f"shared memory region '{self.name}' is no longer usable: {exc}") from None
        if self.offset + offset + size > actual:
            raise InvalidRequest(
                f"shared memory region '{self.name}': the object '{self.key}' shrank to {actual} bytes, which no "
                f"longer holds bytes {self.offset + offset}..{self.offset + offset + size} of it"
            )
        return view

    def read(self, offset: int, size: int) -> bytes:
        """A copy of `size` bytes at `offset` of the region (bounds already checked by the caller)."""
        return bytes(self._checked_view(offset, size)[offset:offset + size])

    def write(self, offset: int, data: bytes | memoryview) -> None:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        self._checked_view(offset, size)[offset:offset + size] = data

    def acquire(self) -> None:
        self._users += 1

    def release(self) -> None:
        self._users -= 1
        if self.retired and self._users <= 0:
            self.close()

    def retire(self) -> None:
        """Unregistered: close now, or when the requests using the region are done."""
        self.retired = True
        if self._users <= 0:
            self.close()

    def close(self) -> None:
        if self._view is None:
            return
        self._view.release()
        self._view = None
        with contextlib.suppress(BufferError, OSError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


class _Using:
    __slots__ = ("regions",)

    def __init__(self, regions: dict[str, Region]) -> None:
        self.regions = regions

    def __enter__(self) -> dict[str, Region]:
        for region in self.regions.values():
            region.acquire()
        return self.regions

    def __exit__(self, *exc_info: object) -> None:
        for region in self.regions.values():
            region.release()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one tensor's data lies: `byte_size` bytes at `offset` inside the region named `region`."""

    region: str
    offset: int
    byte_size: int


def placement_of(parameters: Mapping[str, Any], where: str) -> Placement | None:
    """The tensor's shared memory parameters, or None when it names no region; InvalidRequest when they are
    incomplete or of the wrong type (region: string; offset, byte size: integers >= 0)."""
    if not KEYS.intersection(parameters):
        return None
    region = parameters.get(REGION)
    if region is None:
        raise InvalidRequest(f"{where}: '{OFFSET}' and '{BYTE_SIZE}' need '{REGION}'")
    if not isinstance(region, str) or not region:
        raise InvalidRequest(f"{where}: invalid value type for '{REGION}' parameter, expected a non-empty string")
    values: dict[str, int] = {}
    for key in (OFFSET, BYTE_SIZE):
        value = parameters.get(key)
        if value is None:
            if key == BYTE_SIZE:
                raise InvalidRequest(f"{where}: '{REGION}' needs '{BYTE_SIZE}', the size of the tensor's data")
            value = 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(f"{where}: invalid value for '{key}' parameter, expected an integer >= 0")
        values[key] = value
    return Placement(region, values[OFFSET], values[BYTE_SIZE])


def _object_name(key: str) -> str:
    """The file name under /dev/shm of a shm_open key ("/name" or "name"), as glibc's shm_open derives it."""
    name = key.lstrip("/")
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name.encode()) > _NAME_MAX:
        raise InvalidRequest(
            f"invalid shared memory key {key!r}: a key is a name such as '/input0', without further '/'"
        )
    return name


@dataclass
class SharedMemory:
    """The registered system shared memory regions of one server."""

    root: Path = ROOT
    regions: dict[str, Region] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        """Whether the host has POSIX shared memory where this server looks for it."""
        return self.root.is_dir() and hasattr(os, "O_NOFOLLOW")

    def _require(self) -> None:
        if not self.available:
            raise Unimplemented(
                f"system shared memory is not available on this host (no {self.root}); send tensor data in "
                "the request instead"
            )

    # --- registration ---------------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._require()
        if not name:
            raise InvalidRequest("'region name' is necessary to register a system shared memory region")
        if not key:
            raise InvalidRequest(f"shared memory register request for region '{name}' has no 'key' field")
        if byte_size <= 0:
            raise InvalidRequest(f"failed to register shared memory region '{name}': 'byte_size' must be > 0")
        if name in self.regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        path = self.root / _object_name(key)
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise InvalidRequest(f"unable to open shared memory region: '{key}' does not exist") from None
        except OSError as exc:
            raise InvalidRequest(f"unable to open shared memory region: '{key}': {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequest(f"unable to open shared memory region: '{key}' is not a shared memory object")
            if offset + byte_size > info.st_size:
                raise InvalidRequest(
                    f"failed to register shared memory region '{name}': invalid args (offset {offset} + byte_size "
                    f"{byte_size} exceeds the {info.st_size} bytes of '{key}')"
                )
            try:
                mapping = mmap.mmap(fd, offset + byte_size, access=mmap.ACCESS_WRITE)
            except (OSError, ValueError) as exc:
                raise InvalidRequest(f"failed to register shared memory region '{name}': {exc}") from None
        except BaseException:
            os.close(fd)
            raise
        self.regions[name] = Region(name, key, offset, byte_size, fd, mapping)

    def unregister(self, name: str = "") -> None:
        """Unregister the region `name`, or every region when `name` is empty. An unknown name is no error
        (as in Triton)."""
        self._require()
        names = [name] if name else list(self.regions)
        for item in names:
            region = self.regions.pop(item, None)
            if region is not None:
                region.retire()

    def unregister_all(self) -> None:
        """Close every region (server shutdown)."""
        for region in list(self.regions.values()):
            region.retire()
        self.regions.clear()

    def status(self, name: str = "") -> list[Region]:
        self._require()
        if not name:
            return list(self.regions.values())
        region = self.regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region]

    # --- tensor data ----------------------------------------------------------------------------------

    def _region(self, placement: Placement, where: str) -> Region:
        if not self.available:
            raise Unimplemented(f"{where}: system shared memory is not available on this host")
        region = self.regions.get(placement.region)
        if region is None:
            raise NotFound(f"{where}: unable to find shared memory region: '{placement.region}'")
        if placement.offset >= region.byte_size:
            raise InvalidRequest(
                f"{where}: invalid offset {placement.offset} for shared memory region '{region.name}' of "
                f"{region.byte_size} bytes"
            )
        if placement.offset + placement.byte_size > region.byte_size:
            raise InvalidRequest(
                f"{where}: invalid offset + byte size for shared memory region '{region.name}': "
                f"{placement.offset} + {placement.byte_size} exceeds its {region.byte_size} bytes"
            )
        return region

    def read(self, placement: Placement, datatype: str, shape: list[int], name: str) -> npt.NDArray[Any]:
        """An input's data, decoded from its region (a copy: the client may reuse the region at once)."""
        region = self._region(placement, f"input '{name}'")
        data = region.read(placement.offset, placement.byte_size)
        return codec.from_raw(data, datatype, shape, name=name)

    def using(self, placements: Mapping[str, Placement]) -> _Using:
        """`with shared_memory.using(placements) as regions`: the regions of the outputs to write, by output
        name, checked now and kept open until the block ends (even if unregistered meanwhile)."""
        return _Using({name: self._region(p, f"output '{name}'") for name, p in placements.items()})

    @staticmethod
    def write(region: Region, placement: Placement, data: npt.NDArray[Any], datatype: str, name: str) -> int:
        """Write an output's raw form into its region; the number of bytes written."""
        raw = codec.to_raw(data, datatype, name=name)
        size = raw.nbytes if isinstance(raw, memoryview) else len(raw)
        if size > placement.byte_size:
            raise InvalidRequest(
                f"shared memory size specified with the request for output '{name}' ({placement.byte_size} bytes) "
                f"should be at least {size} bytes to hold the results"
            )
        region.write(placement.offset, raw)
        return size
