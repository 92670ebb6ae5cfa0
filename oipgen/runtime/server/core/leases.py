"""Which model instances requests hold (`Leases`), so that an instance is unloaded only once none does.

A request holds its model instance from the moment it is leased to its end (`accounting.Inference`). Retiring an
instance (a reload replaced it, or its version is unloaded) waits until the requests that hold it are done; an
instance once retired is never leased again, so a request that found it just before it was replaced (a gRPC
thread, between `ModelRepository.get` and its lease) is given the instance that replaced it instead
(`ModelRepository.acquire`). Requests run on the event loop and in gRPC threads: the counts are guarded by a lock.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from ..model import Model

__all__ = ["Leases"]


class Leases:
    """The requests holding each model instance, by the instance's id."""

    def __init__(self) -> None:
        self._held: dict[int, int] = {}  # id(model) -> requests holding it
        # Retirements waiting for an instance's requests to finish, with the loop each waits on.
        self._drained: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        # Retired instances, by id (weak: an id is reused once its instance is gone, never before; a dead reference
        # matches no instance). A plain dict, not a WeakValueDictionary: every request looks here, and that one's
        # lookup runs in Python.
        self._retired: dict[int, weakref.ref[Model]] = {}
        self._lock = threading.Lock()

    def hold(self, model: Model) -> bool:
        """Count one more request on `model`; False (nothing counted) when `model` is retired."""
        key = id(model)
        with self._lock:
            retired = self._retired.get(key)
            if retired is not None and retired() is model:
                return False
            self._held[key] = self._held.get(key, 0) + 1
        return True

    def admit(self, model: Model) -> None:
        """Lease `model` again (an instance added from Python is loaded again after an unload)."""
        key = id(model)
        with self._lock:
            retired = self._retired.get(key)
            if retired is not None and retired() is model:
                del self._retired[key]

    def release(self, model: Model) -> None:
        """One request on `model` is done (it held it)."""
        key = id(model)
        with self._lock:
            count = self._held[key] - 1
            if count:
                self._held[key] = count
                return
            del self._held[key]
            waiting = self._drained.pop(key, None)
        if waiting is not None:
            loop, event = waiting
            loop.call_soon_threadsafe(event.set)

    def held(self) -> dict[int, int]:
        """The requests holding each instance that some request holds, by the instance's id."""
        with self._lock:
            return dict(self._held)

    async def retire(self, model: Model) -> None:
        """Lease `model` no more, and wait until no request holds it."""
        key = id(model)
        with self._lock:
            # The entries of instances gone since go now (a reload is rare; a request never waits for this).
            self._retired = {known: ref for known, ref in self._retired.items() if ref() is not None}
            self._retired[key] = weakref.ref(model)
            event = (self._drained.setdefault(key, (asyncio.get_running_loop(), asyncio.Event()))[1]
                     if key in self._held else None)
        if event is not None:
            await event.wait()
