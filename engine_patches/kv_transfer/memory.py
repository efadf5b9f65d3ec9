"""Freed KV page buffers, given back to the operating system.

Every transfer reads or writes its pages through buffers of a few MB, of varying
size, in the transfer's own thread. glibc keeps what such threads free in its arenas
rather than returning it, so a long-running server's RSS creeps up with no live
object behind it (``make soak``: the prefill scheduler +11% in 25 minutes).
:func:`trim_after_transfer` calls ``malloc_trim(0)`` — which hands every arena's free
pages back — at most once per ``TRIM_EVERY_S``, from the transfer thread that just
finished, never from the scheduler's. (A fixed ``MALLOC_MMAP_THRESHOLD_`` stopped the
growth too, but made every large torch temporary of every forward a fresh mapping:
decode's inter-token latency rose 23%.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

TRIM_EVERY_S = 5.0

_lock = threading.Lock()
_last = 0.0
_libc_name = ctypes.util.find_library("c")
_malloc_trim = getattr(ctypes.CDLL(_libc_name), "malloc_trim", None) if _libc_name else None


def trim_after_transfer(now: float | None = None) -> bool:
    """Return freed heap pages to the OS unless that was done in the last
    ``TRIM_EVERY_S`` (or the C library has no ``malloc_trim``). True if it trimmed."""
    global _last
    if _malloc_trim is None:
        return False
    now = time.monotonic() if now is None else now
    with _lock:
        if now - _last < TRIM_EVERY_S:
            return False
        _last = now
    _malloc_trim(0)
    return True
