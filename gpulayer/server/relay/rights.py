"""Rights on relay sockets that outlive them: checked when they are used, not when the socket opened.

A client's WebSocket is authenticated at its handshake, but it may stay open for hours and open a stream at any
time. So each OPEN authenticates the socket's token again (`current`: the authenticator's cache, which forgets
every principal on each revocation, removal and team change), and `Watch` listens to that forgetting: on each
`invalidate()` every client socket's token is authenticated again (a dead one closes the socket: `cut`) and
each of its streams' right to its job (`manage`: the owner, its project's managers, admins) is checked again
(a stream that lost it ends with the error a new OPEN would get).
"""

from __future__ import annotations

import asyncio
import logging

from gpulayer.protocol.relay import WS_POLICY
from gpulayer.server.errors import GpulayerError
from gpulayer.server.scheduler import teams

log = logging.getLogger("gpulayer.server.relay")


async def current(hub, conn):
    """The socket's caller as of now: its token authenticated again; Unauthorized (401) once the token was
    revoked or expired or its user removed."""
    return await hub._run("system", hub.auth.authenticate, conn.token, hub.clock())


def cut(hub, conn, why: str) -> None:
    """A socket whose token no longer authenticates: its streams end with `why` (401) and it closes (1008)."""
    log.info("relay_socket_cut client=%s reason=%s", conn.label, why)
    for route in list(conn.routes.values()):
        hub._end(route, why, error=why, status=401, code="unauthorized")
    conn.close(WS_POLICY, why)


class Watch:
    """Every client socket's rights checked again after each of the authenticator's invalidate()s (coalesced:
    one pass at a time, and one more when another came during it)."""

    def __init__(self, hub):
        self.hub = hub
        self.running = self.again = False
        hub.auth.on_invalidate(self.changed)

    def changed(self) -> None:
        """The authenticator forgot its principals (any thread)."""
        loop = self.hub.loop
        if loop is None or loop.is_closed():
            return  # no socket yet
        try:
            loop.call_soon_threadsafe(self._start)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _start(self) -> None:
        if self.running:
            self.again = True
            return
        self.running = True
        asyncio.ensure_future(self._passes()).add_done_callback(_logged)

    async def _passes(self) -> None:
        try:
            while True:
                self.again = False
                for conn in list(self.hub.clients):
                    if conn.closing is None:
                        await self._check(conn)
                if not self.again:
                    return
        finally:
            self.running = False

    async def _check(self, conn) -> None:
        try:
            principal = await current(self.hub, conn)
        except GpulayerError as exc:
            return cut(self.hub, conn, f"{exc.message} (the relay socket's token no longer authenticates)")
        conn.principal = principal
        for route in list(conn.routes.values()):
            if route.ended:
                continue
            try:
                await self.hub._run(route.user, self.hub.scheduler.store.read, teams.check_job, principal, route.job_id, "manage")
            except GpulayerError as exc:
                why = f"{exc.message} (the caller's rights changed while the stream was open)"
                log.info("relay_stream_cut job_id=%d user=%s code=%s", route.job_id, route.user, exc.code)
                self.hub._end(route, why, error=why, status=exc.status, code=exc.code)


def _logged(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("relay_rights_check_failed error=%r", future.exception())
