"""`gpulayer port-forward` and `Job.port_forward`: a local TCP listener whose connections each become a `tcp`
stream to a port in the job's task, through the control plane's relay (docs/access.md, "Port-forward").

One relay WebSocket (`GET /v1/jobs/{id}/relay?kind=tcp`) carries every connection, each its own stream with
its own flow control; when that WebSocket is lost (the control plane restarted) the next connection opens a
new one. The listener stays whatever happens to a connection: when the task's agent reconnects, the
connections open then end with the error the control plane gives, and new ones work once its link is back.
EOF either way is a half-close: a local client that shuts its write side still gets the server's answer.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from urllib.parse import urlencode

from gpulayer.client.errors import ClientError, ConnectionFailed
from gpulayer.client.relay import RelayClient, _handshake_error
from gpulayer.protocol.control import TcpOpen
from gpulayer.protocol.fields import to_wire
from gpulayer.relaylink.pipe import SocketPipe, shutdown
from gpulayer.relaylink.streams import Link, LinkLost, Stream, connect

READ_BYTES = 64 * 1024
BACKLOG = 128


def parse_ports(spec: str) -> tuple[int, int]:
    """kubectl's `[LOCAL:]REMOTE`: (local, remote); `8888` is 8888:8888, `:8888` and `0:8888` pick a free local
    port (0). ValueError with the reason."""
    local_text, colon, remote_text = spec.rpartition(":")
    if not colon:
        local_text = remote_text
    remote = _port(remote_text, "REMOTE", zero=False)
    return (0 if local_text == "" else _port(local_text, "LOCAL", zero=True)), remote


def _port(text: str, name: str, *, zero: bool) -> int:
    if not text.isascii() or not text.isdigit() or not (0 if zero else 1) <= int(text) <= 65535:
        raise ValueError(f"{name} port {text!r}: must be a whole number from {0 if zero else 1} to 65535")
    return int(text)


def refuse_unless_running(job: dict, index: int | None = None) -> None:
    """ClientError naming the job and its state when nothing of `job` (the wire's Job, of element `index`
    when given, as GET /v1/jobs/{id}?index= answers it) runs: port-forward refuses at once, as exec does,
    rather than listen for connections that can only fail."""
    tasks = [t for t in job.get("tasks") or [] if index is None or t.get("index") == index]
    if any(t.get("state") == "running" for t in tasks):
        return
    states = sorted({str(t.get("state")) for t in tasks if t.get("attempt") == job.get("attempt")})
    what = f"job {job['id']}" + (f" has no element {index} running" if index is not None else " has no task running")
    raise ClientError(f"{what} (job {job.get('state')}, tasks: {', '.join(states) or 'none'}): "
                      "port-forward reaches a running task only")


class PortForward:
    """Connections to `address`:`local` go to `remote` in job `job_id`'s task (element `index`).

    start() binds (OSError when the address is taken) and accepts on a thread; close() stops accepting and
    ends every connection. A context manager. `on_event(text)` hears each connection's error (the CLI prints
    them); `local_port` is the port bound (the free one picked for 0).
    """

    def __init__(
        self,
        client: RelayClient,
        job_id: int,
        remote: int,
        local: int = 0,
        *,
        address: str = "127.0.0.1",
        index: int | None = None,
        on_event: Callable[[str], None] | None = None,
    ):
        self.client, self.job_id, self.remote, self.local = client, int(job_id), int(remote), int(local)
        self.address, self.index = address, index
        self.on_event = on_event or (lambda text: None)
        self.listener: socket.socket | None = None
        self.lock = threading.Lock()
        self.link: Link | None = None
        self.connections: set[socket.socket] = set()
        self.closed = threading.Event()
        self.served = 0

    @property
    def local_port(self) -> int:
        assert self.listener is not None, "start() first"
        return self.listener.getsockname()[1]

    def start(self) -> PortForward:
        """Open the relay (ApiError: refused; ConnectionFailed), bind and listen (OSError), then accept."""
        self._link()  # a bad token or an unreachable control plane fails here, not at the first connection
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.address, self.local))
            listener.listen(BACKLOG)
        except OSError:
            listener.close()
            self._drop_link()
            raise
        self.listener = listener
        threading.Thread(target=self._accept, name=f"port-forward-{self.remote}", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop accepting and end every connection (their streams CLOSE), then the relay connection."""
        if self.closed.is_set():
            return
        self.closed.set()
        if self.listener is not None:
            shutdown(self.listener)
            self.listener.close()
        with self.lock:
            left = list(self.connections)
        for conn in left:
            shutdown(conn)
        self._drop_link()

    def __enter__(self) -> PortForward:
        return self.start() if self.listener is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the relay connection ----------------------------------------------------------------------

    def _link(self) -> Link:
        """The relay connection, opened anew when there is none or it was lost."""
        with self.lock:
            if self.link is not None and not self.link.closed.is_set():
                return self.link
            query = {"kind": "tcp", **({"index": str(self.index)} if self.index is not None else {})}
            url = f"{self.client.url}/v1/jobs/{self.job_id}/relay?{urlencode(query)}"
            token = (self.client.session.headers.get("Authorization") or "").removeprefix("Bearer ")
            try:
                ws = connect(url, token, self.client.session.verify)
            except Exception as exc:
                raise _handshake_error(exc, self.client.url) from None
            self.link = Link(ws)
            self.link.start()
            return self.link

    def _drop_link(self) -> None:
        with self.lock:
            link, self.link = self.link, None
        if link is not None:
            link.close()

    def _open(self) -> Stream:
        fields = to_wire(TcpOpen(port=self.remote))
        try:
            return self._link().open(fields)
        except LinkLost:  # lost between the check and the OPEN: once more, on a new connection
            try:
                return self._link().open(fields)
            except LinkLost as exc:
                raise ConnectionFailed(f"the relay connection to {self.client.url} failed: {exc}") from None

    # -- connections -------------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self.listener is not None
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                if self.closed.is_set():
                    return
                self.closed.wait(0.1)  # out of descriptors, say: try again soon, not in a tight loop
                continue
            self.served += 1
            with self.lock:
                self.connections.add(conn)
            threading.Thread(target=self._serve, args=(conn, self.served), name=f"port-forward-conn-{self.served}", daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        try:
            try:
                stream = self._open()
            except ClientError as exc:
                self.on_event(f"connection {number}: {exc.message}")
                return
            pipe = SocketPipe(stream, conn, "the local client", ends_stream=False, read_bytes=READ_BYTES)
            error = pipe.run()
            if error is not None and not pipe.broke_here and not self.closed.is_set():
                self.on_event(f"connection {number}: {error}")
        finally:
            with self.lock:
                self.connections.discard(conn)
            conn.close()


__all__ = ["PortForward", "parse_ports"]
