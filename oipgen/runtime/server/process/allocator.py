"""glibc's allocator, tuned for the server's buffers (`tune_allocator`)."""

from __future__ import annotations

import ctypes
import os
from typing import Final

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

# glibc's malloc serves every allocation of 128 KiB and more with fresh pages from mmap and unmaps them on free,
# so each request with large tensors page-faults its bodies and buffers in again: measured on 1M-element FP32
# identities, 4 MB over REST binary cost 7 ms of CPU per inference, 80% of it in the kernel, against 2 ms with
# the memory kept for reuse (and 117 against 89 ms over REST JSON). Allocations up to 32 MiB (glibc's upper
# bound) come from the heap instead, and up to 128 MiB of freed heap is kept for the next request. One heap
# (arena) for all threads: the buffers grpc's thread frees are reused by the event loop's (peak memory of a 4 MB
# gRPC raw identity: +30 MiB over a fresh server with one arena, +38 MiB with two, +60 MiB with glibc's default
# of 8 per core; small requests cost the same).
MMAP_THRESHOLD: Final = 32 * 1024 * 1024
TRIM_THRESHOLD: Final = 128 * 1024 * 1024
ARENA_MAX: Final = 1


def tune_allocator() -> bool:
    """Keep large buffers on the C heap between requests, in one arena (glibc only; the
    MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ and MALLOC_ARENA_MAX environment variables, when set, win).
    Whether it was done."""
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8  # <malloc.h>
    return all(
        mallopt(option, value)
        for option, value in ((m_arena_max, ARENA_MAX), (m_mmap_threshold, MMAP_THRESHOLD),
                              (m_trim_threshold, TRIM_THRESHOLD))
    )
