"""Request framing under `/ingress/` (issue 36 item 11): the checks /v1 has hold before any dispatch.

granian's bridge handed a path under a prefix (the ingress) to its handler before it checked the framing, so a
`Transfer-Encoding: identity, chunked` (or `chunked, chunked`, ...) request to a service's ingress was read as
chunked, and a second request hidden after its body was answered on the same connection: smuggled past a
proxy that reads the length the other way. Raw sockets against a real `server start` (granian, then cheroot),
a real worker and a real service behind a `public` ingress; the same framings as test_security_framing.py.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from gpulayer.testing import ControlPlaneProcess

from test_security_framing import CASES, TAIL, _exchange, assert_not_smuggled
from test_security_ingress_flood import REPLICA

pytestmark = pytest.mark.timeout(180)

FRONT_ENDS = [pytest.param("granian", marks=pytest.mark.skipif(importlib.util.find_spec("granian") is None, reason="no granian")),
              "cheroot"]


@pytest.fixture(scope="module", params=FRONT_ENDS)
def plane(request, tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp(f"framing-{request.param}"), heartbeat_interval=0.5,
                             args=["--http", request.param]) as plane:
        plane.front_end = request.param
        plane.start_worker("framing-w", timeout=60)
        done = plane.cli("submit", "--service", "--ingress", "public", "--", sys.executable, "-c", REPLICA, timeout=180)
        assert done.returncode == 0, done.stderr + plane.logs()
        plane.service = int(done.stdout.split()[0])
        yield plane


@pytest.mark.parametrize("case", list(CASES))
def test_ambiguous_framing_to_an_ingress_is_refused_and_nothing_is_smuggled(plane, case):
    head = b"POST /ingress/%d/echo HTTP/1.1\r\nHost: x\r\n" % plane.service + CASES[case] + b"\r\n"
    assert_not_smuggled(plane.front_end, case, _exchange(plane, head + TAIL))


def test_plain_lengths_and_chunked_bodies_still_reach_the_replica(plane):
    if plane.front_end == "cheroot":
        pytest.skip("the ingress needs granian (cheroot answers 501)")
    sized = b"POST /ingress/%d/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" % plane.service
    chunked = (b"POST /ingress/%d/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               b"5\r\nworld\r\n0\r\n\r\n" % plane.service)
    answer = _exchange(plane, sized + chunked)
    assert answer.count(b"HTTP/1.1 200 ") == 2 and b"hello" in answer and b"world" in answer, answer
