"""agent/run/chunks.py: the local queue of elements leased ahead and finishes sent in batches, against a
recording transport (the real control plane's side: tests/api/test_finish_many.py,
tests/integration/test_array_chunks.py)."""
from __future__ import annotations

import threading

from agent.run.chunks import Chunks
from agent.errors import Rejected
from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.finish import FinishItem


class Recorder:
    """A transport that records each call and answers from `answers` (a callable of path and body)."""

    def __init__(self, answer=None):
        self.calls: list[tuple[str, dict]] = []
        self.answer = answer or (lambda path, body: {"results": [], "task": None, "more": [], "dropped": []})
        self.sent = threading.Event()

    def call(self, method, path, body=None, timeout=None):
        self.calls.append((path, body))
        self.sent.set()
        return self.answer(path, body)


def element(task_id: int, job_id: int = 7) -> Assignment:
    return Assignment.from_wire({"task_id": task_id, "job_id": job_id, "command": ["true"], "index": task_id,
                                 "array_index": task_id, "array_size": 100})


def chunks_with(transport, launched=None, slots=2):
    launched = launched if launched is not None else []
    return Chunks(transport, slots=slots, free_slots=lambda: 0, want_next=lambda: True, running_ids=lambda: [],
                  hand_over=lambda task, asked: launched.append(task.task_id), queued_more=lambda: None,
                  fatal=lambda exc: None)


def finish(task_id: int) -> FinishItem:
    return FinishItem(task_id=task_id, attempt=1, exit_code=0, outcome="succeeded")


def test_a_lone_finish_goes_at_once_and_several_go_together_while_elements_are_queued():
    transport = Recorder()
    chunks = chunks_with(transport)
    chunks.finish(finish(1))
    assert chunks.flush(5)
    assert [(p, [f["task_id"] for f in b["finishes"]]) for p, b in transport.calls] == [("/worker/finish-many", [1])]
    chunks.add([element(i) for i in range(10, 16)], stopping=False)  # more than the slots: finishes wait a little
    for task_id in (2, 3, 4):
        chunks.finish(finish(task_id))
    assert chunks.flush(5)
    sent = [[f["task_id"] for f in b["finishes"]] for _, b in transport.calls[1:]]
    assert sum(sent, []) == [2, 3, 4] and len(sent) < 3
    assert all(b["prefetch"] is True for _, b in transport.calls)
    assert set(range(10, 16)) <= set(transport.calls[-1][1]["held"])  # what it holds, not to be sent again
    chunks.close()


def test_answers_queue_elements_once_and_drop_what_the_server_says():
    ahead = [{"task_id": i, "job_id": 7, "command": ["true"], "index": i} for i in (20, 22)]
    transport = Recorder(lambda path, body: {"results": [{"task_id": 1, "accepted": True}], "task": None, "more": [],
                                             "dropped": [21], "ahead": ahead})
    chunks = chunks_with(transport)
    chunks.add([element(21), element(22)], stopping=False)
    chunks.finish(finish(1))
    assert chunks.flush(5)
    assert [chunks.take().task_id for _ in range(chunks.queued())] == [22, 20]  # 21 dropped; 22 not twice
    chunks.close()


def test_queued_elements_are_given_back_by_job():
    transport = Recorder()
    chunks = chunks_with(transport)
    chunks.add([element(30, job_id=1), element(31, job_id=2), element(32, job_id=1)], stopping=False)
    chunks.give_back(1)
    assert chunks.flush(5)
    assert transport.calls[-1][1]["release"] == [30, 32] and chunks.queued() == 1
    chunks.close()


def test_an_older_control_plane_gets_each_finish_alone():
    def answer(path, body):
        if path == "/worker/finish-many":
            raise Rejected(404, "not_found", "no such route")
        return {"accepted": True}
    transport = Recorder(answer)
    chunks = chunks_with(transport)
    chunks.finish(finish(1))
    assert chunks.flush(5)
    chunks.finish(finish(2))
    assert chunks.flush(5)
    paths = [p for p, _ in transport.calls]
    assert paths == ["/worker/finish-many", "/worker/tasks/1/finish", "/worker/tasks/2/finish"]
    assert "task_id" not in transport.calls[1][1] and transport.calls[1][1]["outcome"] == "succeeded"
    chunks.close()
