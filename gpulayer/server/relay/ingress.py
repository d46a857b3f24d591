"""Service ingress: `/ingress/<job id>/...` on the control plane, proxied to the service's ready replicas through
the relay (docs/access.md, "Ingress").

granian's bridge (frontends/granian_bridge.py) hands every request under `/ingress/` here, on its asyncio loop,
never to falcon's threads. Per request: the job's ingress and its serving replicas are read off the loop
(scheduler/ingress.py, cached `CACHE_S`, read again at once after a worker reports an endpoint), the caller is
let in by its access (a token that may read the job, the service's key, or anyone for `public`), a replica is
chosen by least outstanding requests (one that refused a connection is skipped for `DOWN_S`), and a `tcp` stream
to its port is opened through the hub (`Hub.open_stream`; the agent connects in the task's network view). The
request goes up as HTTP/1.1 (h11), its body streamed within the stream's credit; the response streams back through granian's
`response_stream` as it arrives (server-sent events token by token). One stream per request, `Connection:
close` upstream: no keep-alive pool. A replica that fails before the first byte of its answer gets one retry
on another replica for an idempotent method whose body was read whole (at most `RETRY_BODY_BYTES`); else
502. No replica serving: 503 with Retry-After, but for a service scaled to zero (`service.autoscale.min` 0),
whose requests are held while a replica starts (cold_start.py). A draining replica (scheduler/service_drain.py)
gets no new request. A WebSocket upgrade is accepted here and spoken to the replica
over one stream (websockets' sans-I/O client). Nothing here writes to the state file per request; requests
and bytes are counted in memory (`gpulayer_ingress_*` in GET /metrics).

Requests in flight are capped per job and per client address, and an answer goes to its client no faster
than the client reads it, a client that reads nothing being dropped at the send deadline (ingress_limits.py).
The streams' client ends are upstream.py's; what the replica is sent (headers, target) is forwarding.py's.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import re
import time
from urllib.parse import parse_qsl, quote, urlencode

import h11

from gpulayer.server.errors import GpulayerError, NotFound, Unauthorized, error_body
from gpulayer.server.relay import forwarding
from gpulayer.server.relay.cold_start import ColdStartFull, ColdStarts, ColdStartTimeout, serving
from gpulayer.server.relay.forwarding import COOKIE, HOP_BY_HOP, PREFIX, SAFE_PATH, cookie_token, upstream_headers
from gpulayer.server.relay.hub import Hub, RelayTimeout
from gpulayer.server.relay.ingress_limits import Admission, ClientGone, ClientStalled, IngressFull, Limits, SendPacer, TooManyRequests
from gpulayer.server.relay.upstream import Body, Ends, Upstream, UpstreamFailed, next_event
from gpulayer.server.scheduler import ingress as ingress_reads
from gpulayer.server.scheduler.ingress import Ingress, canary_share

log = logging.getLogger("gpulayer.server.ingress")

CACHE_S = 1.0  # a job's ingress and replicas, and an access decision, are read again after this
DOWN_S = 5.0  # a replica that refused a connection is passed over this long (while another serves)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
PATH = re.compile(r"/ingress/([0-9]{1,18})(/.*)?", re.DOTALL)


class NoReplica(GpulayerError):
    code = "no_replica"
    status = 503


class BadGateway(GpulayerError):
    code = "bad_gateway"
    status = 502


class IngressProxy:
    """The RSGI handler for `/ingress/...` (HTTP and WebSocket), over the relay's hub."""

    def __init__(self, hub: Hub, secure_cookies: bool = True, limits: Limits | None = None):
        self.hub = hub
        self.limits = limits or Limits()
        self.admission = Admission(self.limits)
        self.store = hub.scheduler.store
        self.counters = hub.scheduler.ingress
        self.secure_cookies = secure_cookies
        self.ends = Ends()
        self.outstanding = self.counters.outstanding  # requests in flight per replica (task id)
        self.down: dict[int, float] = {}  # task id: until when it is passed over
        self._ingress: dict[int, tuple[float, Ingress | None, int]] = {}  # (expires, read, Counters.endpoints_seen)
        self._allowed: dict[tuple[int, str], tuple[float, bool]] = {}
        self.cold = ColdStarts(self.counters, self._fresh, self._wake)

    async def __call__(self, scope, proto) -> None:
        self.hub.started()
        if scope.proto == "ws":
            return await self._websocket(scope, proto)
        try:
            await self._http(scope, proto)
        except Exception:
            log.exception("ingress_failed path=%s", scope.path)
            try:
                _answer(proto, 500, "internal_error", "the control plane hit an unexpected error; see its log")
            except Exception:
                pass

    # -- what a request may reach -----------------------------------------------------------------

    async def _lookup(self, job_id: int) -> Ingress | None:
        now = time.monotonic()
        cached = self._ingress.get(job_id)
        seen = self.counters.endpoints_seen
        if cached is not None and cached[0] > now and cached[2] == seen and not self._drained_since(cached[1]):
            return cached[1]
        found = await self.hub._run("system", self.store.read, ingress_reads.lookup, job_id)
        if len(self._ingress) > 10_000:
            self._ingress.clear()
        self._ingress[job_id] = (now + CACHE_S, found, seen)
        return found

    async def _fresh(self, job_id: int) -> Ingress | None:
        """The job's ingress read now (the cache refreshed): a service at zero's held requests poll it."""
        self._ingress.pop(job_id, None)
        return await self._lookup(job_id)

    async def _wake(self, job_id: int) -> object:
        """A request for service `job_id` at zero: the scheduler places a replica now (cold_start.py)."""
        return await self.hub._run("system", self.hub.scheduler.wake_service, job_id)

    def _drained_since(self, found: Ingress | None) -> bool:
        """Whether a replica of a cached `found` began draining since it was read: the replicas are read again
        then (once: the new read leaves it out), so that the replica a rolling update made ready in its place,
        which the cached copy may not hold yet, is seen at once, not after CACHE_S with nothing left to pick."""
        draining = self.counters.draining
        return found is not None and bool(draining) and any(r.task_id in draining for r in found.replicas)

    async def _may_read(self, token: str, job_id: int) -> bool:
        """Whether client token `token` may read job `job_id` (cached CACHE_S); Unauthorized for a bad token."""
        key = (job_id, hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest())
        now = time.monotonic()
        cached = self._allowed.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        principal = await self.hub._run("system", self.hub.auth.authenticate, token, self.hub.clock())
        allowed = await self.hub._run("system", self.store.read, ingress_reads.may_read, principal, job_id)
        if len(self._allowed) > 10_000:
            self._allowed.clear()
        self._allowed[key] = (now + CACHE_S, allowed)
        return allowed

    async def _admit(self, scope, job_id: int) -> tuple[Ingress, bool, str | None]:
        """The job's ingress, whether the caller's credentials are to be stripped before the request goes up,
        and a token given as `?token=` (to be set as a cookie); NotFound, Unauthorized."""
        found = await self._lookup(job_id)
        if found is None:
            raise NotFound(f"no service with an ingress at {PREFIX}{job_id}/")
        if found.access == "public":
            return found, False, None
        header = scope.headers.get("authorization") or ""
        scheme, _, bearer = header.partition(" ")
        bearer = bearer.strip() if scheme.lower() == "bearer" else ""
        if bearer and found.key_sha256 is not None:
            digest = hashlib.sha256(bearer.encode("utf-8", "surrogateescape")).hexdigest()
            if hmac.compare_digest(digest, found.key_sha256):
                return found, True, None
        query_token = dict(parse_qsl(scope.query_string or "")).get("token")
        token = bearer or query_token or cookie_token(scope.headers.get("cookie"))
        if not token:
            raise Unauthorized(
                f"the ingress of job {job_id} needs a token that may read the job (Authorization: "
                "Bearer <token>, or ?token= once in a browser)" + (" or the service's key" if found.access == "key" else "")
            )
        if not await self._may_read(token, job_id):
            raise NotFound(f"no service with an ingress at {PREFIX}{job_id}/")
        return found, True, query_token if not bearer and query_token == token else None

    def _pick(self, found: Ingress, tried: set[int]) -> int | None:
        """The index of the replica to use: least outstanding requests, one that failed lately last."""
        now = time.monotonic()
        draining = self.counters.draining  # leaving the service (service_drain.py): nothing new
        left = [i for i, r in enumerate(found.replicas) if r.task_id not in tried and r.task_id not in draining]
        if not left:
            return None
        left = canary_share(found, left, random.random())  # a canary's share of requests (rollout.py)
        return min(left, key=lambda i: (self.down.get(found.replicas[i].task_id, 0) > now, self.outstanding[found.replicas[i].task_id], i))

    async def _open(self, found: Ingress, i: int) -> Upstream:
        target = found.replicas[i]
        sid = self.ends.next_sid()
        upstream = Upstream(self.hub, self.ends, sid)
        self.ends.streams[sid] = upstream
        try:
            await self.hub.open_stream(self.ends, sid, target, "tcp", {"port": found.ports[i]}, "ingress")
        except (RelayTimeout, GpulayerError) as exc:
            self.ends.streams.pop(sid, None)
            raise UpstreamFailed(exc.message) from None
        return upstream

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _http(self, scope, proto) -> None:
        match = PATH.fullmatch(scope.path)
        if match is None:
            return _answer(proto, 404, "not_found", f"no such path: {scope.path}")
        job_id, rest = int(match[1]), match[2]
        if rest is None:  # /ingress/7 -> /ingress/7/: relative links resolve under the prefix
            location = f"{PREFIX}{job_id}/" + (f"?{scope.query_string}" if scope.query_string else "")
            return proto.response_empty(308, [("location", location)])
        try:
            found, strip, query_token = await self._admit(scope, job_id)
        except GpulayerError as exc:
            return _refuse(proto, exc)
        if query_token is not None:  # a browser's first visit: the token into a cookie, out of the URL
            return self._to_cookie(scope, proto, job_id, rest, query_token)
        try:
            with self.admission.held(job_id, scope.client):
                if found.cold_start is not None and not serving(found, self.counters.draining):
                    found = await self.cold.wait(found) or found  # scaled to zero: held while a replica starts
                if not found.replicas:
                    raise NoReplica(f"job {job_id} has no replica serving now (state {found.state})")
                await self._proxy(scope, proto, found, job_id, rest, strip)
        except (NoReplica, BadGateway, TooManyRequests, IngressFull, ColdStartTimeout, ColdStartFull) as exc:
            self.counters.requests[(job_id, f"{exc.status // 100}xx")] += 1
            return _refuse(proto, exc)

    def _to_cookie(self, scope, proto, job_id: int, rest: str, token: str) -> None:
        query = urlencode([(k, v) for k, v in parse_qsl(scope.query_string or "", keep_blank_values=True) if k != "token"])
        location = quote(f"{PREFIX}{job_id}{rest}", safe=SAFE_PATH) + (f"?{query}" if query else "")
        cookie = f"{COOKIE}={token}; Path={PREFIX}{job_id}/; HttpOnly; SameSite=Lax" + ("; Secure" if self.secure_cookies else "")
        proto.response_empty(303, [("location", location), ("set-cookie", cookie), ("cache-control", "no-store")])

    async def _proxy(self, scope, proto, found: Ingress, job_id: int, rest: str, strip: bool) -> None:
        """The request to a replica, and its answer back; NoReplica or BadGateway when none answered."""
        method = scope.method.upper()
        headers, body_framing = upstream_headers(scope, job_id, strip)
        target = forwarding.target(rest, scope.query_string, strip)
        try:
            request = h11.Request(method=method, target=target, headers=headers)
        except h11.LocalProtocolError as exc:  # a header HTTP/1.1 cannot carry (granian took it over HTTP/2)
            return _answer(proto, 400, "invalid_request", f"the request cannot be passed on as HTTP/1.1: {exc}")
        body = Body(proto if body_framing else None)
        tried: set[int] = set()
        error = "no replica"
        while True:
            i = self._pick(found, tried)
            if i is None:
                break
            task_id = found.replicas[i].task_id
            tried.add(task_id)
            self.outstanding[task_id] += 1
            try:
                status = await self._exchange(scope, proto, found, i, method, request, body, job_id)
                self.counters.requests[(job_id, f"{status // 100}xx")] += 1
                return
            except UpstreamFailed as exc:
                if exc.answered:
                    log.info("ingress_upstream_broke job_id=%d task_id=%d error=%s", job_id, task_id, exc)
                    self.counters.requests[(job_id, "broken")] += 1
                    return
                self.down[task_id] = time.monotonic() + DOWN_S
                log.info("ingress_upstream_failed job_id=%d task_id=%d error=%s", job_id, task_id, exc)
                error = str(exc)
                if method not in IDEMPOTENT or not body.replayable():
                    break
                self.counters.retries[job_id] += 1
            finally:
                self.outstanding[task_id] -= 1
                if self.outstanding[task_id] <= 0:
                    del self.outstanding[task_id]
        stopped = not tried
        if tried:
            # the replicas came from a read up to CACHE_S old: read them again, so a service that has just
            # stopped answers 503 (come back later), not 502 (its replicas broke)
            self._ingress.pop(job_id, None)
            fresh = await self._lookup(job_id)
            stopped = fresh is None or not fresh.replicas
        if stopped:
            raise NoReplica(f"job {job_id} has no replica serving now")
        raise BadGateway(f"the replica of job {job_id} failed before answering: {error}" if len(tried) == 1
                         else f"{len(tried)} replicas of job {job_id} failed before answering; the last: {error}")

    def _dropped(self, job_id: int, exc: ClientStalled) -> None:
        """An answer ended early because its client stalled (counted) or went away (not: as any client gone)."""
        if not isinstance(exc, ClientGone):
            self.counters.requests[(job_id, "stalled")] += 1

    async def _exchange(self, scope, proto, found: Ingress, i: int, method: str, request: h11.Request, body: Body, job_id: int) -> int:
        """One try on replica `i`: the request up, the answer back; its status. UpstreamFailed when it broke."""
        upstream = await self._open(found, i)
        conn = h11.Connection(h11.CLIENT)
        pump = None
        try:
            await upstream.write(conn.send(request))
            pump = asyncio.ensure_future(self._send_body(conn, upstream, body, job_id))
            response = await next_event(conn, upstream, (h11.Response,))
            headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in response.headers if n.decode("latin-1").lower() not in HOP_BY_HOP]
            if method == "HEAD" or response.status_code in (204, 304):
                proto.response_empty(response.status_code, headers)
                return response.status_code
            transport = proto.response_stream(response.status_code, headers)
            pacer = SendPacer(scope, self.limits.send_timeout_s)
            try:
                return await self._answer_body(conn, upstream, transport, pacer, response.status_code, job_id)
            finally:
                pacer.close()
        finally:
            if pump is not None:
                pump.cancel()
            upstream.close()

    async def _answer_body(self, conn: h11.Connection, upstream: Upstream, transport, pacer: SendPacer, status: int, job_id: int) -> int:
        """The replica's answer's body to the client as it arrives, paced by what the client reads; the status."""
        while True:
            try:
                event = await next_event(conn, upstream, (h11.Data, h11.EndOfMessage))
            except UpstreamFailed as exc:
                exc.answered = True
                raise
            if isinstance(event, h11.EndOfMessage):
                return status
            self.counters.bytes_out[job_id] += len(event.data)
            try:
                await transport.send_bytes(bytes(event.data))
                await pacer.sent(len(event.data))
            except ClientStalled as exc:
                self._dropped(job_id, exc)
                return status
            except Exception as exc:  # the client went away: nothing to answer it
                log.debug("ingress_client_gone job_id=%d error=%r", job_id, exc)
                return status

    async def _send_body(self, conn: h11.Connection, upstream: Upstream, body: Body, job_id: int) -> None:
        try:
            async for chunk in body.chunks():
                self.counters.bytes_in[job_id] += len(chunk)
                await upstream.write(conn.send(h11.Data(data=chunk)))
            await upstream.write(conn.send(h11.EndOfMessage()))
        except (UpstreamFailed, h11.LocalProtocolError, asyncio.CancelledError):
            pass
        except Exception as exc:  # the client went away mid-body
            log.debug("ingress_body_failed error=%r", exc)
            upstream.close()

    # -- WebSocket ----------------------------------------------------------------------------------

    async def _websocket(self, scope, proto) -> None:
        match = PATH.fullmatch(scope.path)
        if match is None or match[2] is None:
            proto.close(404)
            return
        job_id, rest = int(match[1]), match[2]
        try:
            found, strip, _ = await self._admit(scope, job_id)
        except GpulayerError as exc:
            proto.close(exc.status)
            return
        i = self._pick(found, set())
        if i is None:
            proto.close(NoReplica.status)
            return
        try:
            with self.admission.held(job_id, scope.client):
                await self._websocket_to(scope, proto, found, i, job_id, rest, strip)
        except (TooManyRequests, IngressFull) as exc:  # a cap (raised before the block ran)
            proto.close(exc.status)

    async def _websocket_to(self, scope, proto, found: Ingress, i: int, job_id: int, rest: str, strip: bool) -> None:
        """The upgrade passed on to replica `i`, then messages both ways until either side closes."""
        from websockets.client import ClientProtocol
        from websockets.frames import Opcode
        from websockets.http11 import Response
        from websockets.typing import Subprotocol
        from websockets.uri import parse_uri

        try:
            upstream = await self._open(found, i)
        except UpstreamFailed:
            proto.close(BadGateway.status)
            return
        headers, _ = upstream_headers(scope, job_id, strip, websocket=True)
        path = forwarding.target(rest, scope.query_string, strip)
        offered = [p.strip() for p in (scope.headers.get("sec-websocket-protocol") or "").split(",") if p.strip()]
        ws = ClientProtocol(parse_uri(f"ws://replica{path}"), subprotocols=[Subprotocol(p) for p in offered] or None, max_size=None)
        handshake = ws.connect()
        for name, value in headers:
            if name.lower() not in ("host",):
                handshake.headers[name] = value
        del handshake.headers["Host"]
        handshake.headers["Host"] = scope.headers.get("host") or scope.authority or "localhost"
        ws.send_request(handshake)
        task_id = found.replicas[i].task_id
        self.outstanding[task_id] += 1
        try:
            for chunk in ws.data_to_send():
                await upstream.write(chunk)
            answer = None
            while answer is None:
                got = await upstream.read()
                if not got:
                    raise UpstreamFailed("the replica closed the connection during the WebSocket handshake")
                ws.receive_data(got)
                for event in ws.events_received():
                    if isinstance(event, Response):
                        answer = event
            if answer.status_code != 101 or ws.handshake_exc is not None:
                proto.close(answer.status_code if answer.status_code >= 400 else BadGateway.status)
                return
            transport = await proto.accept()
            self.counters.requests[(job_id, "ws")] += 1
            pacer = SendPacer(scope, self.limits.send_timeout_s)
            try:
                await self._splice(transport, upstream, ws, Opcode, job_id, pacer)
            finally:
                pacer.close()
        except UpstreamFailed as exc:
            log.info("ingress_websocket_failed job_id=%d error=%s", job_id, exc)
            proto.close(BadGateway.status)
        finally:
            self.outstanding[task_id] -= 1
            if self.outstanding[task_id] <= 0:
                del self.outstanding[task_id]
            upstream.close()

    async def _splice(self, transport, upstream: Upstream, ws, Opcode, job_id: int, pacer: SendPacer) -> None:
        """Messages both ways until either side closes (or the client reads nothing for the send deadline)."""

        async def up() -> None:
            while True:
                message = await transport.receive()
                kind = int(message.kind)
                if kind == 0:
                    ws.send_close()
                elif kind == 1:
                    ws.send_binary(bytes(message.data))
                else:
                    ws.send_text(message.data.encode() if isinstance(message.data, str) else bytes(message.data))
                for chunk in ws.data_to_send():
                    self.counters.bytes_in[job_id] += len(chunk)
                    await upstream.write(chunk)
                if kind == 0:
                    return

        async def down() -> None:
            parts: list[bytes] = []
            text = False
            while True:
                got = await upstream.read()
                if not got:
                    return
                self.counters.bytes_out[job_id] += len(got)
                ws.receive_data(got)
                for frame in ws.events_received():
                    if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                        parts, text = [frame.data], frame.opcode == Opcode.TEXT
                    elif frame.opcode == Opcode.CONT:
                        parts.append(frame.data)
                    else:
                        if frame.opcode == Opcode.CLOSE:
                            return
                        continue
                    if frame.fin:
                        whole = b"".join(parts)
                        if text:
                            await transport.send_str(whole.decode("utf-8", "replace"))
                        else:
                            await transport.send_bytes(whole)
                        try:
                            await pacer.sent(len(whole))
                        except ClientStalled as exc:
                            self._dropped(job_id, exc)
                            return
                for chunk in ws.data_to_send():  # pongs, the close's answer
                    await upstream.write(chunk)

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass


def _answer(proto, status: int, code: str, message: str, extra: list | None = None) -> None:
    proto.response_bytes(status, [("content-type", "application/json"), *(extra or [])], error_body(code, message))


def _refuse(proto, exc: GpulayerError) -> None:
    """A refusal in the error shape: 401 says how to authenticate, 429 and 503 when to come back."""
    extra = []
    if exc.status == 401:
        extra.append(("www-authenticate", 'Bearer realm="gpulayer ingress"'))
    elif exc.status in (429, 503):
        extra.append(("retry-after", "1"))
    _answer(proto, exc.status, exc.code, exc.message, extra)


__all__ = ["IngressProxy", "PREFIX"]
