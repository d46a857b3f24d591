"""The writer process: the control plane of process.py without its HTTP front end, serving the writer RPC.

It owns the state file's write connection (the Store's writer thread and its group commits), upkeep,
notifications' delivery, provisioning and replication, exactly as one process does; the front ends' writes
reach its scheduler through rpc.WriterServer. The home's lock is the supervisor's (it outlives a writer that
dies), so this process takes none.
"""
from __future__ import annotations

from pathlib import Path

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.multiproc.rpc import WriterServer
from gpulayer.server.process import ControlPlane


FRONT_ENDS_STOP_S = 8.0   # how long a stopping writer waits for front ends stopping beside it (their requests: 5 s)


class HeldByParent:
    """The home's lock as a child sees it: held by the supervisor for the plane's whole life."""

    def acquire(self) -> "HeldByParent":
        return self

    def note(self, **fields) -> None:
        pass

    def release(self) -> None:
        pass


class WriterPlane(ControlPlane):
    """The writer process's plane: `_serve` serves the RPC on `socket_path`; the front ends serve `port`."""

    def __init__(self, config: ControlPlaneConfig, socket_path: Path, port: int):
        super().__init__(config, lock=HeldByParent())  # type: ignore[arg-type]  # the supervisor holds the lock
        self.socket_path, self.port = Path(socket_path), port
        self.rpc: WriterServer | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.config.tls_cert else 'http'}://{host}:{self.port}"

    def _serve(self) -> None:
        self.rpc = WriterServer(self.socket_path, self.deps.scheduler)
        self.rpc.start()

    def stop(self) -> None:
        """The RPC first (the writes in progress finish), then what ControlPlane.stop stops."""
        if self.rpc is not None:
            self.rpc.wait_for_front_ends(FRONT_ENDS_STOP_S)
            self.rpc.stop()
        super().stop()
