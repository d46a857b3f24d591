"""The credit the relay's hub passes on (gpulayer/server/relay/routes.py; issue 36 item 3), without sockets: a
receiver's grant is banked and goes on within the stream's cap, the connection's cap and its queue, and what is
held back goes on as the queue drains. The attack itself, on real processes: tests/security/test_relay_bounds.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpulayer.protocol.relay import INITIAL_WINDOW, MAX_STREAM_ID, WINDOW, FrameError, data, decode
from gpulayer.server.relay.routes import CONN_CREDIT, STREAM_CREDIT, AgentLink, ClientConn, Route
from gpulayer.server.runtime.relay_wants import Wants


def _pair(streams: int = 1) -> tuple[ClientConn, AgentLink, list[Route]]:
    client = ClientConn(None, SimpleNamespace(actor="user:a"), "glc_x", 1, None, "exec")
    link = AgentLink(None, 1)
    routes = []
    for n in range(streams):
        route = Route(client, 2 * n + 1, "exec", "user:a", 1, agent=link, agent_sid=n + 1)
        client.routes[route.client_sid], link.routes[route.agent_sid] = route, route
        routes.append(route)
    return client, link, routes


def _windows(link: AgentLink) -> list[int]:
    """The WINDOW grants queued towards the agent (and empties its queue)."""
    found = []
    while not link.outbox.empty():
        frame = decode(link.outbox.get_nowait())
        if frame.type == WINDOW:
            found.append(frame.credit)
    link.queued = 0
    return found


def _arrive(route: Route, size: int) -> None:
    """`size` bytes of DATA from the agent, queued towards the client (which reads nothing)."""
    while size:
        chunk = min(size, 65536)
        route.carried(chunk, Wants(lambda: None), up=False)
        route.client.send(data(route.client_sid, b"x" * chunk))
        size -= chunk


def test_a_huge_grant_goes_on_only_up_to_the_streams_cap():
    client, link, (route,) = _pair()
    route.granted(MAX_STREAM_ID - INITIAL_WINDOW, up=False)
    assert _windows(link) == [STREAM_CREDIT - INITIAL_WINDOW]
    assert route.down.credit.left == STREAM_CREDIT and route.down.banked == MAX_STREAM_ID - STREAM_CREDIT
    with pytest.raises(FrameError, match="over 2\\*\\*32"):
        route.granted(1, up=False)


def test_a_client_that_reads_nothing_holds_at_most_its_connections_credit():
    client, link, routes = _pair(4)
    for route in routes:
        route.granted(1 << 30, up=False)
    for _ in range(20):  # the agents send all they may; the client reads nothing
        for route in routes:
            _arrive(route, route.down.credit.left)
            client.drained()
        _windows(link)
    outstanding = sum(route.down.credit.left for route in routes)
    assert client.queued <= CONN_CREDIT + 4 * INITIAL_WINDOW + 65536, client.queued
    assert outstanding == 0 and client.closing is None  # everything granted arrived; nothing more goes on
    # The client reads: as its queue drains, the banked credit goes on again.
    while not client.outbox.empty():
        client.queued -= len(client.outbox.get_nowait())
    client.drained()
    assert sum(_windows(link)) > 0


def test_streams_holding_credit_never_starve_a_new_one():
    client, link, routes = _pair(5)
    for route in routes[:4]:  # four bulk streams take the connection's credit and send nothing
        route.granted(STREAM_CREDIT, up=False)
    _windows(link)
    last = routes[4]
    _arrive(last, INITIAL_WINDOW)  # the fifth spends its initial window; its client reads it and grants it back
    while not client.outbox.empty():
        client.queued -= len(client.outbox.get_nowait())
    last.granted(INITIAL_WINDOW, up=False)
    assert _windows(link) == [INITIAL_WINDOW]


def test_a_queue_past_its_hard_limit_drops_the_connection():
    client, _, _ = _pair()
    assert client.hard_limit is not None
    client.send(bytes(client.hard_limit + 1))
    assert client.closing is not None and "does not read" in client.closing  # the hub ends its streams then
