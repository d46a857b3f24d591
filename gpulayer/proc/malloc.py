"""Keep freed memory for the next buffer: glibc's malloc tuned for processes that stream (the agent, the CLI).

A relay stream moves 256 KiB frames through a few buffers each (a socket read, a frame, its mask): allocated,
used once and freed, thousands per second. glibc hands the top of a thread's heap back to the kernel whenever
more than its trim threshold is free there (twice the mmap threshold, which starts at 128 KiB and follows the
largest freed block), so the next frame's buffer is fresh memory, faulted in and zeroed page by page. Measured
(docs/benchmarks/issue-26.md, "Port-forward: freed memory kept"): the port-forward client took 390,000 page faults per
512 MiB each way and spent 30% of its CPU on them. Fixing both thresholds (blocks under MMAP_THRESHOLD come from
the heaps; a heap keeps up to TRIM_THRESHOLD free at its top) takes that to a few hundred.

`MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` in the environment win (glibc reads them at start; this
leaves a process that has them alone). A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heaps, whatever was freed before (a frame and its copies are 256 KiB).
MMAP_THRESHOLD = 4 * 1024 * 1024
#: The most free memory a heap keeps at its top: a bulk stream's 4 MiB window in flight, and room.
TRIM_THRESHOLD = 16 * 1024 * 1024

_done = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (once); False where nothing was set."""
    global _done
    if _done:
        return True
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done


__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]
