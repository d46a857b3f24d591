"""`python -m gpulayer.server.multiproc.child ROLE FD`: one process of `--front-ends N` (supervisor.py).

ROLE is `writer` or `front-end`; the settings, the writer's socket, the port and the log level come pickled on stdin from the
supervisor (its own child: trusted). Once serving it writes b"1" to FD; it serves until SIGTERM (SIGINT is the
supervisor's to handle: Ctrl-C reaches the whole process group), or its parent's death (polled).
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from pathlib import Path

def main(argv: list[str]) -> int:
    from gpulayer.server.process import configure_logging
    role, ready_fd = argv[1], int(argv[2])
    parent = os.getppid()  # not PR_SET_PDEATHSIG: that fires when the supervisor's thread that started us ends
    config, socket_path, port, level = pickle.load(sys.stdin.buffer)
    configure_logging(level)  # the supervisor's (`up`: warnings only, unless --verbose)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if role == "writer":
        from gpulayer.server.multiproc.writer import WriterPlane
        plane = WriterPlane(config, Path(socket_path), port)
    else:
        from gpulayer.server.multiproc.frontend import FrontEnd
        plane = FrontEnd(config, Path(socket_path), port)  # type: ignore[assignment]  # the same start/stop
    fenced = getattr(plane, "fenced", threading.Event())
    try:
        plane.start()
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        while not stopping.wait(0.5):
            if os.getppid() != parent:  # the supervisor died (SIGKILL): stop, so nothing holds the port
                return 0
            if fenced.is_set():
                return 3
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
