"""The ingress's caps and its send deadline (docs/access.md, "Ingress"): what one job and one client address may
hold of the control plane and the workers at once, and how long a client may leave its answer unread.

Each request (and each WebSocket) through the ingress is a relay stream, and on the replica's agent a
connection and two threads, until its answer has gone out. So the requests in flight are capped per job
(`max_per_job`: 503 `ingress_full`) and per client address (`max_per_client`: 429 `too_many_requests`), both
with `Retry-After`. The address is the TCP peer's: X-Forwarded-For is not trusted, so behind a reverse proxy
every client shares the proxy's address, and the operator raises the cap.

granian's response transport queues whatever it is given and never waits for the client, so an answer
nobody reads would otherwise be read from the replica whole into the control plane's memory. `SendPacer`
keeps what one answer hands granian within `SEND_WINDOW` of what the client's TCP has acknowledged
(TCP_INFO's bytes_acked of the connection, looked up once the answer passes the window); while it is ahead,
nothing more is read from the replica, whose stream then waits on its credit. A client that acknowledges
nothing for `send_timeout_s` while the answer waits on it is dropped: its connection shut, the replica's
stream closed, its threads on the agent ended.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from gpulayer.server import tcpinfo
from gpulayer.server.errors import GpulayerError

log = logging.getLogger("gpulayer.server.ingress")

#: Bytes of one answer handed to the front end ahead of what the client acknowledged.
SEND_WINDOW = 1 << 20
#: How often a paced answer looks at the client's acknowledgements again, at most.
POLL_S = 0.05
#: Where a paced answer's connection is looked up (a walk of this process's sockets, ~40 ms for 3,000): one
#: thread of its own, so that many at once wait for each other (their answers paused meanwhile), never for
#: the relay's pool, which lets streams in.
_LOOKUPS = ThreadPoolExecutor(1, thread_name_prefix="gpulayer-ingress-lookup")


class TooManyRequests(GpulayerError):
    code = "too_many_requests"
    status = 429


class IngressFull(GpulayerError):
    code = "ingress_full"
    status = 503


class ClientStalled(Exception):
    """The client read nothing of its answer for the send deadline: its connection was shut."""


class ClientGone(ClientStalled):
    """The client's connection can take nothing more (it was closed or shut under the answer)."""


@dataclass
class Limits:
    """The ingress's settings (ControlPlaneConfig's ingress_*)."""

    max_per_job: int = 128
    max_per_client: int = 32
    send_timeout_s: float = 60.0


class Admission:
    """Requests in flight through the ingress, per job and per client address (touched on the loop only)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.by_job: Counter[int] = Counter()
        self.by_client: Counter[str] = Counter()

    @contextmanager
    def held(self, job_id: int, client: str) -> Iterator[None]:
        """A place for one request of `client` ("host:port") to job `job_id` while the block runs;
        TooManyRequests or IngressFull (before the block) when either cap is reached."""
        host = client.rpartition(":")[0].strip("[]") or client
        if self.by_client[host] >= self.limits.max_per_client:
            raise TooManyRequests(
                f"{host} has {self.limits.max_per_client} requests through the ingress in flight already "
                "(the control plane's --ingress-max-requests-per-client); retry when one has ended"
            )
        if self.by_job[job_id] >= self.limits.max_per_job:
            raise IngressFull(
                f"job {job_id}'s ingress has {self.limits.max_per_job} requests in flight already "
                "(the control plane's --ingress-max-requests-per-job); retry when one has ended"
            )
        self.by_client[host] += 1
        self.by_job[job_id] += 1
        try:
            yield
        finally:
            _drop(self.by_client, host)
            _drop(self.by_job, job_id)


def _drop(counter: Counter, key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class SendPacer:
    """One answer's bytes to one client, kept within SEND_WINDOW of what it acknowledged (see the module)."""

    def __init__(self, scope, timeout_s: float):
        self.server, self.client = getattr(scope, "server", "") or "", scope.client
        self.timeout_s = timeout_s
        self.handed = 0
        self.sock: socket.socket | None = None
        self.unknown = False  # the connection was not found (not Linux, or gone): not paced
        self.base_handed = self.base_acked = 0  # what was handed and acknowledged when the connection was found

    async def sent(self, size: int) -> None:
        """`size` more bytes were handed to the front end: return once the client is within the window;
        ClientStalled (its connection shut) when, the answer waiting on it, it acknowledged nothing for the send
        deadline; ClientGone when its connection can take nothing more."""
        self.handed += size
        if self.unknown or (self.sock is None and self.handed <= SEND_WINDOW):
            return
        if self.sock is None and not await self._find():
            return
        assert self.sock is not None
        last, since = -1, 0.0  # what the client had acknowledged at the last look, and since when
        while True:
            acked = tcpinfo.bytes_acked(self.sock)
            if acked is None:
                raise ClientGone(f"the connection from {self.client} is gone")
            if (self.handed - self.base_handed) - (acked - self.base_acked) <= SEND_WINDOW:
                return
            now = time.monotonic()
            if acked != last:  # the first look, or the client read some: the deadline starts again
                last, since = acked, now
            elif now - since >= self.timeout_s:
                log.info("ingress_client_stalled client=%s seconds=%g", self.client, self.timeout_s)
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # granian's connection ends; its sends fail
                except OSError:
                    pass
                raise ClientStalled(f"{self.client} read nothing for {self.timeout_s:g} s")
            await asyncio.sleep(min(POLL_S * 4, max(POLL_S, self.timeout_s / 20)))

    async def _find(self) -> bool:
        loop = asyncio.get_running_loop()
        self.sock = await loop.run_in_executor(_LOOKUPS, tcpinfo.connection, self.server, self.client)
        if self.sock is None:
            self.unknown = True
            return False
        self.base_handed, self.base_acked = self.handed, tcpinfo.bytes_acked(self.sock) or 0
        return True

    def close(self) -> None:
        """Let go of the duplicate of the connection (the connection itself stays)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


__all__ = ["Admission", "ClientGone", "ClientStalled", "IngressFull", "Limits", "SendPacer", "TooManyRequests"]
