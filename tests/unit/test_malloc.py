"""gpulayer/proc/malloc.py: with the thresholds set, a thread that streams 256 KiB buffers reuses freed
memory instead of faulting fresh pages in (page faults counted, not time), and the environment's own
settings are left alone."""

from __future__ import annotations

import subprocess
import sys

from gpulayer.testing import clean_env

CHURN = r"""
import collections, resource, sys, threading
from gpulayer.proc.malloc import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None

def churn():  # a bulk stream's buffers: 16 frames of about 256 KiB in flight, each made, used once, freed
    window = collections.deque()
    for i in range(4000):
        window.append(bytes(bytearray(262144 + (i % 7) * 1000)))
        if len(window) > 16:
            window.popleft()

before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
thread = threading.Thread(target=churn)
thread.start()
thread.join()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], env=clean_env(**env), capture_output=True, text=True, timeout=60, check=True)
    kept, faults = out.stdout.split()
    return kept, int(faults)


def test_streaming_buffers_reuse_freed_memory():
    kept, tuned = _faults("keep")
    if kept != "True":  # not glibc: nothing to tune
        return
    _, plain = _faults("plain")
    assert tuned * 3 < plain, (tuned, plain)


def test_the_environments_thresholds_win():
    kept, _ = _faults("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert kept == "False"

