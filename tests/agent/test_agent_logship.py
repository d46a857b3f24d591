"""Log batching: numbering from 0, batches, retries that never renumber."""

import time

from agent.errors import Rejected, Unreachable
from agent.link.logship import LogShipper


class FlakySink:
    def __init__(self, fail_first=0):
        self.fail_first = fail_first
        self.calls = []
        self.stored = {}

    def __call__(self, lines):
        self.calls.append([line["n"] for line in lines])
        if self.fail_first:
            self.fail_first -= 1
            raise Unreachable("down")
        for line in lines:  # the server keeps one line per n
            self.stored.setdefault(line["n"], line)


def test_lines_numbered_from_zero_across_streams_and_batched():
    sink = FlakySink()
    shipper = LogShipper(sink, batch_lines=3, clock=lambda: 42.0)
    for i in range(4):
        shipper.add("stdout", f"o{i}")
    shipper.system("sys")
    shipper.add("stderr", "e")
    assert shipper.flush()
    assert sink.calls == [[0, 1, 2], [3, 4, 5]]
    assert [sink.stored[n]["stream"] for n in range(6)] == ["stdout"] * 4 + ["system", "stderr"]
    assert sink.stored[4] == {"stream": "system", "text": "sys", "at": 42.0, "n": 4}


def test_failed_batches_are_resent_with_the_same_numbers():
    sink = FlakySink(fail_first=2)
    shipper = LogShipper(sink, batch_lines=10, retry_wait_s=0.01)
    for i in range(5):
        shipper.add("stdout", str(i))
    assert shipper.flush()
    assert sink.calls == [[0, 1, 2, 3, 4]] * 3
    assert sorted(sink.stored) == [0, 1, 2, 3, 4]


def test_background_flusher_and_close():
    sink = FlakySink()
    shipper = LogShipper(sink, interval_s=0.02).start()
    shipper.add("stdout", "a")
    deadline = time.time() + 2
    while not sink.stored and time.time() < deadline:
        time.sleep(0.01)
    assert list(sink.stored) == [0]
    shipper.add("stdout", "b")
    assert shipper.close()
    assert sorted(sink.stored) == [0, 1]


def test_close_gives_up_at_the_deadline():
    sink = FlakySink(fail_first=10**6)
    shipper = LogShipper(sink, retry_wait_s=0.01)
    shipper.add("stdout", "lost")
    assert shipper.close(deadline=time.monotonic() + 0.1) is False


def test_rejected_batch_is_dropped_not_retried():
    calls = []

    def reject(lines):
        calls.append(lines)
        raise Rejected(409, "task_not_assigned", "no")

    shipper = LogShipper(reject)
    shipper.add("stdout", "x")
    assert shipper.flush()
    assert len(calls) == 1


def test_overflow_is_counted_and_reported():
    sink = FlakySink()
    shipper = LogShipper(sink, max_pending=2)
    for i in range(5):
        shipper.add("stdout", str(i))
    shipper.flush()
    shipper.add("stdout", "after")
    shipper.flush()
    texts = [sink.stored[n]["text"] for n in sorted(sink.stored)]
    assert texts == ["0", "1", "3 log lines dropped while the control plane was unreachable", "after"]


def test_close_keeping_tail_sends_all_but_the_last_batch():
    sent = []
    shipper = LogShipper(sent.append, batch_lines=3, interval_s=60)
    for i in range(7):
        shipper.add("stdout", f"line {i}")
    tail = shipper.close_keeping_tail()
    assert 0 < len(tail) <= 3
    assert [line["n"] for batch in sent for line in batch] + [line["n"] for line in tail] == list(range(7))
