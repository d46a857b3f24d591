"""The relay's hub: agents' links and clients' streams, matched and forwarded on granian's asyncio loop.

An agent's link (`GET /v1/worker/relay`, its session token) carries any number of streams; a client's
WebSocket (`GET /v1/jobs/{id}/relay`, a client token) carries the streams it OPENs on that job. For each
stream the hub checks policy before anything reaches the agent (`sessions.target`: the job's owner, its
project's managers, admins; a running task on an online worker whose agent serves the kind), the caps (open
streams per user and per job), writes the session's row, asks the worker's agent to connect when it has no
link yet (`relay: true` in its heartbeat and parked acquire answers) and waits `connect_timeout_s` for it,
then forwards frames both ways rewriting stream ids. It never buffers past the windows: a receiver's WINDOW
goes on to the sender capped per stream and per connection (server/relay/routes.py), so what waits here for a
peer that reads slowly, or not at all, is bounded; a sender past its credit loses its connection.

Rights are checked when they are used: each OPEN authenticates the socket's token again and checks the caller's
right to the job then (a revoked token or a demoted admin opens nothing on an old socket), and when the
authenticator forgets its principals (a revocation, a team change) every open stream's right is checked again
(server/relay/rights.py). A socket that opens no stream within OPEN_TIMEOUT_S, or has had none open for the
idle timeout, is closed.

Everything here runs on the loop; what reads or writes the state file (auth, policy, sessions rows) runs on
a small pool of threads, never on the loop, and only when a stream opens or closes (or rights change).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpulayer.protocol import PROTOCOL, PROTOCOL_HEADER
from gpulayer.protocol import control
from gpulayer.protocol.control import Close, StreamOpen, is_int
from gpulayer.protocol.fields import from_wire, to_wire
from gpulayer.protocol.relay import (
    CLOSE,
    DATA,
    EOF,
    EXT_DATA,
    LARGE_DATA,
    MAX_DATA,
    OPEN,
    RESIZE,
    SETTINGS,
    SIGNAL,
    WINDOW,
    WS_GOING_AWAY,
    WS_POLICY,
    FrameError,
    decode,
    encode,
)
from gpulayer.server.errors import Forbidden, GpulayerError
from gpulayer.server.relay import opens, rights, sshca
from gpulayer.server.relay.routes import AgentLink, ClientConn, Route, bulk, max_data, raw, rewrite
from gpulayer.server.runtime.relay_wants import Wants
from gpulayer.server.scheduler import events, sessions

log = logging.getLogger("gpulayer.server.relay")

JOB_PATH = re.compile(r"/v1/jobs/([0-9]{1,18})/relay")
AGENT_PATH = "/v1/worker/relay"
#: Seconds a client's socket may stay open before its first OPEN (then: the idle timeout with no stream open).
OPEN_TIMEOUT_S = 10.0
#: Control frames (SIGNAL, RESIZE, EOF, ...) a client may send on a stream before its agent's end exists.
MAX_PENDING_CONTROL = 64


class TooManyStreams(GpulayerError):
    code = "too_many_streams"
    status = 429


class RelayTimeout(GpulayerError):
    code = "relay_timeout"
    status = 504


@dataclass
class Settings:
    """The relay's caps and deadlines (ControlPlaneConfig's relay_* settings)."""

    max_streams_per_user: int = 16
    max_streams_per_job: int = 32
    idle_timeout_s: float = 3600.0
    connect_timeout_s: float = 10.0


class Hub:
    """The RSGI WebSocket handler (`await hub(scope, proto)`), bound to the scheduler and its authenticator."""

    def __init__(self, scheduler, auth, clock=time.time, settings: Settings | None = None):
        self.scheduler, self.auth, self.clock = scheduler, auth, clock
        self.settings = settings or Settings()
        self.state: Wants = scheduler.relay
        self.links: dict[int, AgentLink] = {}
        self.waiting: dict[int, list[asyncio.Future]] = {}
        self.by_user: Counter[str] = Counter()
        self.by_job: Counter[int] = Counter()
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="gpulayer-relay")
        self._sweeper: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clients: set[ClientConn] = set()
        self.rights = rights.Watch(self)

    async def __call__(self, scope, proto) -> None:
        self.started()
        try:
            await self._serve(scope, proto)
        except Exception:
            # granian drops a connection whose handler raised, with no answer and no log line: the client
            # would read "no valid HTTP response". Log it, and answer 500 (before the upgrade) or 1011.
            log.exception("relay_failed path=%s", scope.path)
            try:
                proto.close(500)
            except Exception:
                pass

    async def _serve(self, scope, proto) -> None:
        path = scope.path.rstrip("/")
        sent = scope.headers.get(PROTOCOL_HEADER.lower())
        if sent is not None and sent != str(PROTOCOL):
            return self._refuse_handshake(proto, 426, "protocol_mismatch")
        if path == AGENT_PATH:
            return await self._agent(scope, proto)
        match = JOB_PATH.fullmatch(path)
        if match is None:
            return self._refuse_handshake(proto, 404, "not_found")
        return await self._client(scope, proto, int(match[1]))

    def started(self) -> None:
        """On the loop: note it and start the idle sweep (the first WebSocket, or the first ingress request)."""
        if self._sweeper is None:
            self.loop = asyncio.get_running_loop()
            self._sweeper = asyncio.ensure_future(self._sweep())

    def stop(self) -> None:
        """The control plane stops (any thread): every link and client connection is closed (1001) now, so that
        granian's stop does not wait for them; their streams end with an `error`."""
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._close_all)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _close_all(self) -> None:
        for conn in [*self.links.values(), *self.clients]:
            conn.close(WS_GOING_AWAY, "the control plane is stopping")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- off the loop ----------------------------------------------------------------------------

    async def _run(self, actor: str, fn, *args):
        """fn(*args) on the relay's pool, its events recorded as `actor`'s."""

        def call():
            events.ACTOR.set(actor)
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    async def _principal(self, scope):
        """The caller of a handshake and its bearer token (Unauthorized for none or a bad one)."""
        header = scope.headers.get("authorization") or ""
        scheme, _, token = header.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        return await self._run("system", self.auth.authenticate, token or None, self.clock()), token

    def _refuse_handshake(self, proto, status: int, code: str) -> None:
        self.state.refused[code] += 1
        log.info("relay_refused code=%s status=%d", code, status)
        proto.close(status)

    # -- agents ----------------------------------------------------------------------------------

    async def _agent(self, scope, proto) -> None:
        try:
            principal, _ = await self._principal(scope)
        except GpulayerError as exc:
            return self._refuse_handshake(proto, exc.status, exc.code)
        if principal.kind != "worker":
            return self._refuse_handshake(proto, 403, "forbidden")
        if principal.worker_state == "gone":
            return self._refuse_handshake(proto, 401, "unauthorized")
        worker_id = principal.worker_id
        link = AgentLink(await proto.accept(), worker_id, max_data(scope))
        old = self.links.get(worker_id)
        if old is not None:
            self._drop_link(old, "the worker's agent connected a new link")
        self.links[worker_id] = link
        self.state.links = len(self.links)
        log.info("relay_link_opened worker_id=%d", worker_id)
        for waiter in self.waiting.pop(worker_id, []):
            if not waiter.done():
                waiter.set_result(link)
        try:
            await link.pump(lambda raw: self._from_agent(link, raw))
        finally:
            self._drop_link(link, f"worker {worker_id}'s agent link closed ({link.closing or 'lost'})")
            proto.close(link.close_code)

    def _drop_link(self, link: AgentLink, why: str) -> None:
        if self.links.get(link.worker_id) is link:
            del self.links[link.worker_id]
            self.state.links = len(self.links)
            log.info("relay_link_closed worker_id=%d reason=%s", link.worker_id, why)
        link.close(WS_GOING_AWAY, why)
        for route in list(link.routes.values()):
            self._end(route, why, error=why, tell_agent=False)

    def _from_agent(self, link: AgentLink, message: bytes | str) -> None:
        found = bulk(message)
        if found is not None and self._bulk_forward(link.routes.get(found[0]), found[1], message, up=False):
            return
        try:
            frame = decode(message, LARGE_DATA)
            route = link.routes.get(frame.stream_id)
            if route is None:
                if frame.type == OPEN:  # agents open no stream (yet): say so on that stream
                    link.send(encode(frame.stream_id, CLOSE, to_wire(Close(error="the control plane opens streams, not agents"))))
                return  # a frame of a stream that ended meanwhile
            if frame.type in (DATA, EXT_DATA):
                route.carried(frame.cost(), self.state, up=False)
            elif frame.type == WINDOW:
                return route.granted(frame.credit, up=True)
            elif frame.type == OPEN:
                raise FrameError(f"OPEN on stream {frame.stream_id}, which is open already")
            if frame.type == CLOSE:
                closed = from_wire(Close, frame.fields)
                self._end(
                    route,
                    str(closed.reason or closed.error or "ended on the worker"),
                    exit_code=closed.exit_code if is_int(closed.exit_code) else None,
                    error=closed.error if isinstance(closed.error, str) else None,
                    tell_agent=False,
                    closing=rewrite(raw(message), route.client_sid),
                )
                return
            route.client.send(rewrite(raw(message), route.client_sid))
        except FrameError as exc:
            log.warning("relay_link_protocol_error worker_id=%d error=%s", link.worker_id, exc)
            self._drop_link(link, f"worker {link.worker_id}'s agent broke the relay protocol: {exc}")
            link.close(WS_POLICY, str(exc))

    def _bulk_forward(self, route: Route | None, size: int, message: bytes | str, *, up: bool) -> bool:
        """A DATA frame of `size` bytes on the bulk path (header read, nothing decoded): forwarded, or dropped for
        a stream that ended meanwhile (True); False leaves it to the full path (past its credit, which is a
        protocol error there, or a stream whose agent end is not there yet)."""
        if route is None:
            return True
        peer, credit = (route.agent, route.up.credit) if up else (route.client, route.down.credit)
        if peer is None or size > credit.left or size > (route.up_data if up else route.down_data):
            return False
        route.carried(size, self.state, up=up)
        peer.send(rewrite(raw(message), route.agent_sid if up else route.client_sid))
        return True

    async def _link_for(self, route: Route, to: sessions.Target) -> AgentLink:
        """The worker's link, asking its agent to connect when there is none; RelayTimeout past the deadline."""
        link = self.links.get(to.worker_id)
        if link is not None and link.closing is None:
            return link
        waiter = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(to.worker_id, []).append(waiter)
        await self._run("system", self.state.want, to.worker_id)
        # A busy worker (no parked acquire) hears it in its next heartbeat answer: one interval and more.
        deadline = max(self.settings.connect_timeout_s, 1.5 * self.scheduler.cadence.interval_s(to.worker_id) + 2)
        try:
            return await asyncio.wait_for(waiter, deadline)
        except asyncio.TimeoutError:
            raise RelayTimeout(
                f"worker {to.worker_name}'s agent did not connect to the relay within "
                f"{deadline:g} s (agent version {to.version}): it may be "
                "overloaded, or cut off from the control plane"
            ) from None
        finally:
            self.state.done(to.worker_id)
            left = [w for w in self.waiting.get(to.worker_id, []) if w is not waiter]
            if left:
                self.waiting[to.worker_id] = left
            else:
                self.waiting.pop(to.worker_id, None)

    # -- clients ---------------------------------------------------------------------------------

    async def _client(self, scope, proto, job_id: int) -> None:
        try:
            principal, token = await self._principal(scope)
            if principal.kind != "client":
                raise Forbidden(f"a {principal.kind} token cannot open a relay stream")
            index, kind = opens.query(scope.query_string)
        except GpulayerError as exc:
            return self._refuse_handshake(proto, exc.status, exc.code)
        conn = ClientConn(await proto.accept(), principal, token, job_id, index, kind, max_data(scope))
        self.clients.add(conn)
        try:
            await conn.pump(lambda message: self._from_client(conn, message))
        finally:
            self.clients.discard(conn)
            for route in list(conn.routes.values()):
                self._end(route, "the client went away", tell_client=False)
            proto.close(conn.close_code)

    def _from_client(self, conn: ClientConn, message: bytes | str) -> None:
        found = bulk(message)
        if found is not None and self._bulk_forward(conn.routes.get(found[0]), found[1], message, up=True):
            return
        try:
            frame = decode(message, LARGE_DATA)
            sid = frame.stream_id
            route = conn.routes.get(sid)
            if frame.type == OPEN:
                if route is not None:
                    raise FrameError(f"OPEN on stream {sid}, which is open already")
                self._open(conn, sid, frame.fields)
                return
            if route is None:
                return  # a frame of a stream that ended meanwhile
            if frame.type in (DATA, EXT_DATA):
                route.carried(frame.cost(), self.state, up=True)
            elif frame.type == WINDOW:
                return route.granted(frame.credit, up=False)
            elif frame.type not in (EOF, SIGNAL, RESIZE, CLOSE):
                return
            if route.agent is None:
                _hold(route, raw(message), frame.type)
            else:
                route.agent.send(rewrite(raw(message), route.agent_sid))
            if frame.type == CLOSE:
                self._end(route, "closed by the client", tell_client=False, tell_agent=False)
        except FrameError as exc:
            log.info("relay_client_protocol_error client=%s error=%s", conn.label, exc)
            why = f"the client broke the relay protocol: {exc}"
            for route in list(conn.routes.values()):  # each stream's CLOSE says why before the socket closes
                self._end(route, why, error=why, status=400, code="bad_frame")
            conn.close(WS_POLICY, why)

    def _open(self, conn: ClientConn, sid: int, fields: dict) -> None:
        kind = fields.get("kind") or conn.kind
        user = conn.principal.actor
        route = Route(conn, sid, kind if isinstance(kind, str) else "?", user, conn.job_id)
        conn.routes[sid] = route
        conn.idle_since, conn.opened = None, True
        self.by_user[user] += 1
        self.by_job[conn.job_id] += 1
        asyncio.ensure_future(self._connect(route, fields))

    async def _connect(self, route: Route, fields: dict) -> None:
        """Check, record and hand the stream to the agent; a refusal is a CLOSE with the error."""
        conn = route.client
        try:
            admitted = await self._admit(route, fields)
        except GpulayerError as exc:
            self.state.refused[exc.code] += 1
            log.info("relay_refused code=%s job_id=%d user=%s message=%s", exc.code, route.job_id, route.user, exc.message)
            self._end(route, exc.message, error=exc.message, status=exc.status, code=exc.code)
            if exc.status == 401:  # the socket's token is dead: nothing more opens on it
                rights.cut(self, conn, exc.message)
            return
        except Exception:
            log.exception("relay_open_failed job_id=%d", route.job_id)
            why = "the control plane hit an unexpected error; see its log"
            return self._end(route, why, error=why, status=500, code="internal_error")
        if admitted is None or route.ended:
            return
        to, detail, link = admitted
        # Frame sizes: each way, what its receiver said it takes. The client hears its own in a SETTINGS frame
        # only when it announced (so it knows the type); the agent in the OPEN (an older one ignores the field).
        route.down_data = conn.max_data
        route.up_data = link.max_data if conn.max_data > MAX_DATA else MAX_DATA
        log.info(
            "relay_stream_opened session_id=%s job_id=%d task_id=%d worker_id=%d kind=%s user=%s",
            route.session_id, to.job_id, to.task_id, to.worker_id, route.kind, route.user,
        )
        opening = {
            "session_id": route.session_id,
            **detail,
            **self._secret(route.kind, to),
            **({"max_data": route.down_data} if route.down_data > MAX_DATA else {}),
        }
        self._attach(route, link, to, opening)
        if route.up_data > MAX_DATA:
            conn.send(encode(route.client_sid, SETTINGS, to_wire(control.Settings(max_data=route.up_data))))
        for frame in route.pending:
            link.send(rewrite(frame, route.agent_sid))
        route.pending.clear()
        route.release(up=False)  # what the client granted before the agent's end existed

    async def _admit(self, route: Route, fields: dict) -> tuple[sessions.Target, dict, AgentLink] | None:
        """A client's stream checked (its OPEN's fields, the caps, its token and its right to the job now),
        recorded (the session's row) and its worker's link; None when the client closed it meanwhile;
        GpulayerError for a refusal."""
        conn = route.client
        detail = opens.detail(route.kind, fields)
        if self.by_user[route.user] > self.settings.max_streams_per_user:
            raise TooManyStreams(
                f"{route.user} has {self.settings.max_streams_per_user} relay streams open "
                "already (the control plane's --relay-max-streams-per-user)"
            )
        if self.by_job[route.job_id] > self.settings.max_streams_per_job:
            raise TooManyStreams(
                f"job {route.job_id} has {self.settings.max_streams_per_job} relay streams "
                "open already (the control plane's --relay-max-streams-per-job)"
            )
        conn.principal = await rights.current(self, conn)
        to = await self._run(route.user, self.scheduler.store.read, sessions.target, conn.principal, route.job_id, conn.index, route.kind)
        route.session_id = await self._run(
            route.user, self.scheduler.session_opened, to, route.user, route.kind, detail, self.clock()
        )
        if route.ended:
            self._record_close(route, "closed by the client", None)
            return None
        return to, detail, await self._link_for(route, to)

    def _attach(self, route: Route, link: AgentLink, to: sessions.Target, fields: dict) -> None:
        """The stream's agent end: an id on the worker's link, and the OPEN that asks the agent for it."""
        route.agent, route.agent_sid = link, link.next_sid()
        link.routes[route.agent_sid] = route
        self.state.open[route.kind] += 1
        opening = StreamOpen(kind=route.kind, job_id=to.job_id, task_id=to.task_id, index=to.index, **fields)
        link.send(encode(route.agent_sid, OPEN, to_wire(opening)))

    async def open_stream(self, conn, sid: int, to: sessions.Target, kind: str, detail: dict, user: str) -> Route:
        """A stream the control plane opens itself (the ingress, server/relay/ingress.py) into task `to`, checked
        by its caller: `conn` holds the client's end (`routes`, `send(frame)`, `close(code, why)`), frames from
        it go through `client_frame`. Outside the per-user and per-job caps, no sessions row (the caller writes
        one when it wants). RelayTimeout when the worker's agent does not connect in time."""
        route = Route(conn, sid, kind, user, to.job_id, counted=False)
        conn.routes[sid] = route
        try:
            link = await self._link_for(route, to)
        except BaseException:
            self._end(route, "the agent did not connect", tell_client=False)
            raise
        if not route.ended:
            self._attach(route, link, to, detail)
            route.release(up=False)
        return route

    def client_frame(self, conn, raw: bytes) -> None:
        """A frame from a client's end the control plane holds (open_stream's `conn`), as a WebSocket's."""
        self._from_client(conn, raw)

    def _secret(self, kind: str, to: sessions.Target) -> dict:
        """What an OPEN carries that the session's row must not: an `ssh` stream's host key and certificate."""
        if kind != "ssh":
            return {}
        key, cert = sshca.for_home(self.scheduler.config.home).issue(sshca.principals(to.job_id, to.index))
        return {"host_key": key, "host_cert": cert}

    # -- endings ---------------------------------------------------------------------------------

    def _end(
        self,
        route: Route,
        reason: str,
        *,
        exit_code: int | None = None,
        error: str | None = None,
        tell_client: bool = True,
        tell_agent: bool = True,
        status: int | None = None,
        code: str | None = None,
        closing: bytes | None = None,
    ) -> None:
        """The stream is over: both ends told (CLOSE), its counts dropped, its row closed."""
        if route.ended:
            return
        route.ended = True
        conn = route.client
        if conn.routes.get(route.client_sid) is route:
            del conn.routes[route.client_sid]
        if route.counted:
            self.by_user[route.user] -= 1
            if self.by_user[route.user] <= 0:
                del self.by_user[route.user]
            self.by_job[route.job_id] -= 1
            if self.by_job[route.job_id] <= 0:
                del self.by_job[route.job_id]
        if route.agent is not None:
            self.state.open[route.kind] -= 1
            route.agent.routes.pop(route.agent_sid, None)
            if tell_agent:
                route.agent.send(encode(route.agent_sid, CLOSE, to_wire(Close(reason=reason))))
        if tell_client:
            if closing is not None:
                conn.send(closing)
            else:
                message = Close(reason=reason) if error is None else Close(
                    reason=reason, error=error, code=code or "relay_closed", status=status or 502)
                conn.send(encode(route.client_sid, CLOSE, to_wire(message)))
        if isinstance(conn, ClientConn) and not conn.routes:
            conn.idle_since = time.monotonic()
        route.forget()
        if route.session_id is not None:
            self._record_close(route, reason, exit_code)

    def _record_close(self, route: Route, reason: str, exit_code: int | None) -> None:
        session_id, route.session_id = route.session_id, None
        log.info(
            "relay_stream_closed session_id=%s job_id=%d bytes_in=%d bytes_out=%d exit_code=%s reason=%s",
            session_id,
            route.job_id,
            route.bytes_in,
            route.bytes_out,
            exit_code,
            reason,
        )
        future = asyncio.ensure_future(
            self._run(
                route.user,
                self.scheduler.session_closed,
                session_id,
                route.bytes_in,
                route.bytes_out,
                exit_code,
                reason[:1000],
                self.clock(),
            )
        )
        future.add_done_callback(_logged)

    async def _sweep(self) -> None:
        """Every few seconds: end the streams idle past `idle_timeout_s`, and close the client sockets that opened
        no stream within OPEN_TIMEOUT_S or have had none open for `idle_timeout_s`."""
        idle = self.settings.idle_timeout_s
        while True:
            await asyncio.sleep(max(0.2, min(idle / 4, OPEN_TIMEOUT_S / 4, 5.0)))
            now = time.monotonic()
            for link in list(self.links.values()):
                for route in list(link.routes.values()):
                    if now - route.active_at >= idle:
                        why = f"idle for {idle:g} s (the control plane's --relay-idle-timeout)"
                        self._end(route, why, error=why, status=408, code="idle_timeout")
            for conn in list(self.clients):
                limit = idle if conn.opened else OPEN_TIMEOUT_S
                if conn.idle_since is not None and now - conn.idle_since >= limit:
                    log.info("relay_socket_idle client=%s seconds=%g", conn.label, limit)
                    conn.close(1000, f"no stream open for {limit:g} s")


def _hold(route: Route, frame: bytes, kind: int) -> None:
    """A client's frame for a stream whose agent end is not there yet, kept until it is: its DATA within the
    initial window, at most MAX_PENDING_CONTROL other frames (FrameError past either)."""
    route.pending.append(frame)
    if kind not in (DATA, EXT_DATA) and sum(held[4] not in (DATA, EXT_DATA) for held in route.pending) > MAX_PENDING_CONTROL:
        raise FrameError(f"more than {MAX_PENDING_CONTROL} control frames before the stream opened")
    if len(route.pending) > 4096:
        raise FrameError("too many frames before the stream opened")


def _logged(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("relay_session_write_failed error=%r", future.exception())


__all__ = ["Hub", "Settings", "TooManyStreams", "RelayTimeout"]
