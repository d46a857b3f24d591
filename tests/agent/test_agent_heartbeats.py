"""The agent's heartbeats against a server that renews leases on any request (`requests_renew_lease`) and one
that does not (an older server): an idle worker parked on acquire skips its beats only on the former; a busy
one never does (cancels come in heartbeat answers); a changed `heartbeat_interval_s` in an answer is honoured."""

import sys
import time

from fake_control_plane import assignment
from test_agent_worker import wait_for

PY = sys.executable


def beats_in(plane, seconds: float) -> int:
    before = len(plane.heartbeats)
    time.sleep(seconds)
    return len(plane.heartbeats) - before


def test_an_idle_worker_beats_every_interval_against_an_older_server(plane, start_worker):
    start_worker(acquire_wait_s=5)  # parked on acquire, as an idle worker is
    wait_for(lambda: plane.heartbeats)
    assert beats_in(plane, 1.5) >= 5  # interval 0.2 s


def test_an_idle_parked_worker_skips_its_beats_and_a_busy_one_does_not(plane, start_worker):
    plane.heartbeat_terms = {"requests_renew_lease": True}
    start_worker(acquire_wait_s=5)
    wait_for(lambda: plane.heartbeats and plane.acquires)  # the first beat is never skipped
    assert beats_in(plane, 1.5) == 0  # its acquire is parked: the server counts it as seen
    plane.submit(assignment(7, [PY, "-c", "import time; print('ready', flush=True); time.sleep(600)"]))
    wait_for(lambda: "ready" in plane.log_texts(7))
    assert beats_in(plane, 1.0) >= 3  # it holds a task: a beat every interval, to hear cancels
    asked = time.monotonic()
    plane.cancel.add(7)
    assert plane.wait_finish(7)["outcome"] == "cancelled"
    assert time.monotonic() - asked < 5


def test_a_changed_interval_in_a_heartbeat_answer_is_honoured(plane, start_worker):
    start_worker(acquire_wait_s=5)
    wait_for(lambda: len(plane.heartbeats) >= 2)
    plane.heartbeat_terms = {"heartbeat_interval_s": 1.0}
    time.sleep(0.5)  # the next answer carries it
    assert beats_in(plane, 2.5) <= 4  # 0.2 s before: 12 or so
