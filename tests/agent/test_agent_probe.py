"""EndpointProbe with a pinned clock: when it probes, when it reports, when it asks for a restart."""

import http.server
import threading

import pytest

from agent.run.services import EndpointProbe
from agent.run.supervision import TaskHandle
from gpulayer.protocol.jobspec import HealthSpec

HEALTH = HealthSpec(http_path="/healthz", interval_s=10, failures=3)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def server():
    state = {"status": 200, "hits": 0}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            state["hits"] += 1
            self.send_response(state["status"])
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() waits out one poll
    state["port"] = srv.server_address[1]
    yield state
    srv.shutdown()
    srv.server_close()


def test_health_checks_every_interval_and_restart_after_failures_in_a_row(server):
    clock, handle, changes = Clock(), TaskHandle(1), []
    handle.on_change = lambda: changes.append(handle.endpoint)
    probe = EndpointProbe(handle, server["port"], "10.1.2.3", HEALTH,
                          clock=clock)
    assert probe.tick() is None and handle.endpoint == f"10.1.2.3:{server['port']}" and changes == [handle.endpoint]
    clock.now += 9.9
    assert probe.tick() is None and server["hits"] == 1  # not due: no request
    server["status"] = 500
    for n in (1, 2):
        clock.now += 10
        assert probe.tick() is None and probe.failures == n
    server["status"] = 204  # one good answer resets the count
    clock.now += 10
    assert probe.tick() is None and probe.failures == 0
    server["status"] = 503
    reasons = []
    for _ in range(3):
        clock.now += 10
        reasons.append(probe.tick())
    assert reasons[:2] == [None, None]
    assert reasons[2] == "health check failed 3 times in a row (GET /healthz: 503)"
    assert server["hits"] == 7


def test_endpoint_waits_for_a_2xx_health_answer(server):
    clock, handle = Clock(), TaskHandle(2)
    server["status"] = 503
    probe = EndpointProbe(handle, server["port"], "127.0.0.1", HEALTH,
                          clock=clock)
    assert probe.tick() is None and handle.endpoint is None
    assert probe.wait_s() == pytest.approx(0.02)   # the supervisor waits no longer than that
    waits = []
    for _ in range(160):  # probes go 20 ms apart for the first 3 s, then back off to 250 ms
        before = clock.now
        while probe.tick() is None and server["hits"] == len(waits) + 1:
            clock.now = round(clock.now + 0.01, 2)
        waits.append(round(clock.now - before, 2))
    fast = [w for w in waits if w == 0.02]
    assert len(fast) == 151 and waits[:151] == fast   # 3 s of 20 ms
    assert waits[151:] == [0.03, 0.05, 0.07, 0.11, 0.16, 0.23, 0.25, 0.25, 0.25]
    assert handle.endpoint is None
    server["status"] = 200
    clock.now += 0.25
    assert probe.tick() is None and handle.endpoint == f"127.0.0.1:{server['port']}"
