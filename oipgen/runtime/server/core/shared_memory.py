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

Shared memory is available where /dev/shm is (Linux); elsewhere, or with `--shared-memory off`, the extension
answers UNIMPLEMENTED and is not listed in the server metadata. CUDA shared memory is not implemented: this server
has no GPU stack.

The risk, and its bounds. As in Triton, a client may register any shared memory object the server's user can open,
then read it back through outputs or overwrite it with outputs: other applications' segments included. So:
- `--shared-memory-prefix PREFIX` admits only keys that start with PREFIX (others: INVALID_ARGUMENT), so that
  clients reach only the objects meant for the server; `--shared-memory off` turns the extension off.
- At most `max_regions` regions and `max_bytes` mapped bytes in all (`--shared-memory-max-regions`,
  `--shared-memory-max-bytes`); past either, register answers RESOURCE_EXHAUSTED (REST 429) before anything is
  opened. A held region keeps no file descriptor: the object is mapped, then its descriptor closed at once, so
  registrations cannot exhaust the server's descriptors; unregistering unmaps it.
- Region names are 1 to 255 characters without control characters; keys are "/name" or "name" with one leading
  slash at most, no other "/", no NUL, at most 255 bytes, never "." or "..".
Before every access the object is looked up again by its key: the same object (device and inode) must still be
there, at least as large as the region needs, so that a client that shrinks or replaces it gets an error rather
than crashing the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import numpy.typing as npt

from ... import codec, extensions
from ..errors import AlreadyExists, Exhausted, InvalidRequest, NotFound, Unimplemented

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
_NAME_MAX: Final = 255  # bytes of an object name (NAME_MAX), and characters of a region name
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters, as the spec's pattern says
MAX_REGIONS: Final = 1024
MAX_BYTES: Final = 16 * 1024**3


class _Mapping:
    """A shared, writable mapping of the first `size` bytes of an open file that keeps no file descriptor: mmap(2)
    through libc (Python's `mmap.mmap` keeps a duplicate descriptor open for as long as the mapping lives)."""

    __slots__ = ("_address", "_fallback", "size", "view")

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self._address: int | None = None
        self._fallback: mmap.mmap | None = None
        libc = _libc()
        if libc is None:  # not glibc-like: Python's mmap, at the cost of a descriptor per region
            self._fallback = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            self.view = memoryview(self._fallback)
            return
        address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        self._address = address
        self.view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")

    def close(self) -> None:
        """Unmap (every view of the mapping must be released first)."""
        self.view.release()
        if self._fallback is not None:
            with contextlib.suppress(BufferError, OSError):
                self._fallback.close()
        elif self._address is not None:
            lib = _libc()
            if lib is not None:
                lib.munmap(self._address, self.size)
            self._address = None


_MAP_FAILED: Final = ctypes.c_void_p(-1).value
_LIBC: list[Any] = []


def _libc() -> Any:
    """libc's mmap and munmap with their C signatures, or None where they cannot be had."""
    if not _LIBC:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            lib.mmap.restype = ctypes.c_void_p
            lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_long]
            lib.munmap.restype = ctypes.c_int
            lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError):
            lib = None
        _LIBC.append(lib)
    return _LIBC[0]


class Region:
    """A registered region: `byte_size` bytes at `offset` of the shared memory object `key`, mapped (no file
    descriptor is kept: the object is found again by its path, and must be the same one, before each access)."""

    __slots__ = ("_identity", "_map", "_path", "_users", "_view", "byte_size", "key", "name", "offset", "retired")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, path: Path, identity: tuple[int, int],
                 mapping: _Mapping) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._path = path
        self._identity = identity  # (st_dev, st_ino) of the object registered
        self._map = mapping
        self._view: memoryview | None = mapping.view[offset:offset + byte_size]
        self._users = 0
        self.retired = False  # unregistered: unmapped once the last user is done

    def _checked_view(self, offset: int, size: int) -> memoryview:
        view = self._view
        if view is None:
            raise NotFound(f"shared memory region '{self.name}' is no longer registered")
        try:
            info = os.stat(self._path, follow_symlinks=False)
        except OSError as exc:
            raise InvalidRequest(
                f"shared memory region '{self.name}' is no longer usable: '{self.key}': {exc.strerror}"
            ) from None
        if (info.st_dev, info.st_ino) != self._identity:
            raise InvalidRequest(
                f"shared memory region '{self.name}' is no longer usable: '{self.key}' was removed or replaced; "
                "register the region again"
            )
        if self.offset + offset + size > info.st_size:
            raise InvalidRequest(
                f"shared memory region '{self.name}': the object '{self.key}' shrank to {info.st_size} bytes, which "
                f"no longer holds bytes {self.offset + offset}..{self.offset + offset + size} of it"
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
        """Unregistered: unmap now, or when the requests using the region are done."""
        self.retired = True
        if self._users <= 0:
            self.close()

    @property
    def mapped(self) -> bool:
        return self._view is not None

    def close(self) -> None:
        if self._view is None:
            return
        self._view.release()
        self._view = None
        self._map.close()


class _Using:
    __slots__ = ("regions",)

    def __init__(self, regions: Mapping[str, Region]) -> None:
        self.regions = regions

    def __enter__(self) -> Mapping[str, Region]:
        for region in self.regions.values():
            region.acquire()
        return self.regions

    def __exit__(self, *exc_info: object) -> None:
        for region in self.regions.values():
            region.release()


_NOTHING: Final = _Using(MappingProxyType({}))  # the regions of a request that places no output in shared memory


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
    name = key[1:] if key.startswith("/") else key
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name.encode()) > _NAME_MAX:
        raise InvalidRequest(
            f"invalid shared memory key {key!r}: a key is a name such as '/input0' of at most {_NAME_MAX} bytes, "
            "with one leading '/' at most, no other '/' and no NUL"
        )
    return name


def _check_region_name(name: str) -> None:
    if not name:
        raise InvalidRequest("'region name' is necessary to register a system shared memory region")
    if len(name) > _NAME_MAX or _CONTROL.search(name):
        raise InvalidRequest(
            f"invalid shared memory region name {name!r}: at most {_NAME_MAX} characters, no control characters"
        )


@dataclass
class SharedMemory:
    """The registered system shared memory regions of one server."""

    root: Path = ROOT
    regions: dict[str, Region] = field(default_factory=dict)
    enabled: bool = True  # --shared-memory system (True) or off
    prefix: str = ""  # --shared-memory-prefix: only keys that start with it can be registered
    max_regions: int = MAX_REGIONS
    max_bytes: int = MAX_BYTES

    @property
    def available(self) -> bool:
        """Whether the extension is on, and the host has POSIX shared memory where this server looks for it."""
        return self.enabled and self.root.is_dir() and hasattr(os, "O_NOFOLLOW")

    @property
    def mapped_bytes(self) -> int:
        """The bytes mapped for the registered regions (offset included: the mapping starts at the object's start)."""
        return sum(r.offset + r.byte_size for r in self.regions.values())

    def _require(self) -> None:
        if not self.enabled:
            raise Unimplemented("system shared memory is turned off on this server; send tensor data in the request")
        if not self.available:
            raise Unimplemented(
                f"system shared memory is not available on this host (no {self.root}); send tensor data in "
                "the request instead"
            )

    # --- registration ---------------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._require()
        _check_region_name(name)
        if not key:
            raise InvalidRequest(f"shared memory register request for region '{name}' has no 'key' field")
        object_name = _object_name(key)
        prefix = self.prefix[1:] if self.prefix.startswith("/") else self.prefix
        if not object_name.startswith(prefix):
            raise InvalidRequest(
                f"shared memory key {key!r} is refused: this server only registers keys that start with "
                f"'{self.prefix}' (--shared-memory-prefix)"
            )
        if byte_size <= 0:
            raise InvalidRequest(f"failed to register shared memory region '{name}': 'byte_size' must be > 0")
        if offset < 0:
            raise InvalidRequest(f"failed to register shared memory region '{name}': 'offset' must be >= 0")
        if name in self.regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self.regions) >= self.max_regions:
            raise Exhausted(
                f"failed to register shared memory region '{name}': {len(self.regions)} regions are registered, "
                f"the most this server holds (--shared-memory-max-regions); unregister one first"
            )
        mapped = self.mapped_bytes
        if mapped + offset + byte_size > self.max_bytes:
            raise Exhausted(
                f"failed to register shared memory region '{name}': mapping {offset + byte_size} more bytes would "
                f"exceed the {self.max_bytes} bytes this server maps in all (--shared-memory-max-bytes; "
                f"{mapped} mapped now)"
            )
        path = self.root / object_name
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise NotFound(f"unable to open shared memory region: '{key}' does not exist") from None
        except OSError as exc:
            raise InvalidRequest(f"unable to open shared memory region: '{key}': {exc.strerror}") from None
        try:  # the descriptor lives only while the object is checked and mapped
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequest(f"unable to open shared memory region: '{key}' is not a shared memory object")
            if offset + byte_size > info.st_size:
                raise InvalidRequest(
                    f"failed to register shared memory region '{name}': invalid args (offset {offset} + byte_size "
                    f"{byte_size} exceeds the {info.st_size} bytes of '{key}')"
                )
            try:
                mapping = _Mapping(fd, offset + byte_size)
            except (OSError, ValueError) as exc:
                raise InvalidRequest(f"failed to register shared memory region '{name}': {exc}") from None
        finally:
            os.close(fd)
        self.regions[name] = Region(name, key, offset, byte_size, path, (info.st_dev, info.st_ino), mapping)

    def unregister(self, name: str = "") -> None:
        """Unregister the region `name`, or every region when `name` is empty. An unknown name is no error
        (as in Triton); a name that no region can have is (InvalidRequest, as register says)."""
        self._require()
        if name:
            _check_region_name(name)
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
        if not placements:  # most requests: nothing to hold
            return _NOTHING
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
