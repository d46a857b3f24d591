"""Elements leased ahead and finishes sent in batches (docs/protocol.md "Elements leased ahead").

The control plane may lease an agent more elements of an array job than it has free slots
(`prefetch`); they wait here, in a local queue, and start the moment a slot frees, with no round trip
in between. Finishes go out together in one ``POST /worker/finish-many``: at once when nothing is
queued here (a lone task's finish waits for nothing), else when the oldest has waited BATCH_S or the
queue runs low; each answer tops the queue up. One request is in flight at a time. Against a control
plane without finish-many (404) each finish is sent alone, as before.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.fields import names, to_wire
from gpulayer.protocol.finish import Finish, Finished, FinishItem, FinishMany

from ..errors import AgentError, Rejected, Unreachable
from ..events import log_event
from ..link.transport import Transport
from .reports import acquired

#: How long a finish may wait for others to go with it while elements are queued here.
BATCH_S = 0.025
#: Finishes (and task ids) in one request, the control plane's cap.
MAX_BATCH = 1024
#: After a second stop signal, the finishes still unsent get this long, no more.
HURRIED_FLUSH_S = 2.0
#: A finish's own fields: those of a FinishItem but its task_id, attempt and run_s (a finish sent alone).
FINISHED = names(Finished)


class Chunks:
    """The local queue of elements leased ahead, and the finishes waiting to be sent."""

    def __init__(self, transport: Transport, *, slots: int, free_slots: Callable[[], int],
                 want_next: Callable[[], bool], running_ids: Callable[[], list[int]],
                 hand_over: Callable[[Assignment, float], None], queued_more: Callable[[], None],
                 fatal: Callable[[AgentError], None], answered_ids: Callable[[set[int]], None] = lambda ids: None):
        self.transport = transport
        self.slots = max(1, slots)
        self.free_slots = free_slots
        self.want_next = want_next
        self.running_ids = running_ids
        self.hand_over = hand_over
        self.queued_more = queued_more  # called when elements were queued: start them if slots are free
        self.fatal = fatal
        #: Called (outside this queue's lock) with the tasks whose finishes were just answered or given up.
        self.answered_ids = answered_ids
        self.cond = threading.Condition()
        self.queue: deque[Assignment] = deque()
        self.pending: list[tuple[FinishItem, float]] = []  # (a finish with its task_id and attempt, when added)
        #: The heartbeat entries of the tasks whose finish is not answered yet: reported as held until it is
        #: (a control plane restored from a replica loses what a worker stops reporting).
        self.reporting: dict[int, dict] = {}
        self.in_flight: set[int] = set()
        self.release: list[int] = []
        self.supported = True  # finish-many; False after a 404: finishes go alone
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name="finishes", daemon=True)
        self.thread.start()

    # -- the local queue -----------------------------------------------------
    def add(self, tasks: list[Assignment], stopping: bool) -> None:
        """Queue elements leased ahead (once each); a stopping agent gives them back instead."""
        with self.cond:
            known = {t.task_id for t in self.queue} | set(self.running_ids()) | self.in_flight
            known |= {item.task_id for item, _ in self.pending}
            fresh = [t for t in tasks if t.task_id not in known]
            if stopping:
                self.release += [t.task_id for t in fresh]
            else:
                self.queue.extend(fresh)
            if fresh:
                self.cond.notify_all()
        if fresh and not stopping:
            self.queued_more()

    def take(self) -> Assignment | None:
        """The next element to start, or None."""
        with self.cond:
            task = self.queue.popleft() if self.queue else None
            if task is not None and len(self.queue) <= self.slots:
                self.cond.notify_all()  # running low: the sender may ask for more
            return task

    def queued(self) -> int:
        with self.cond:
            return len(self.queue)

    def give_back(self, job_id: int | None = None) -> None:
        """Give back the queued elements (of one job: a cancel of it arrived), to be requeued at once."""
        with self.cond:
            back = [t for t in self.queue if job_id is None or t.job_id == job_id]
            if not back:
                return
            self.queue = deque(t for t in self.queue if t not in back)
            self.release += [t.task_id for t in back]
            self.cond.notify_all()
        log_event("ahead_given_back", tasks=len(back), job_id=job_id)

    def held(self) -> list[int]:
        """What this agent may hold leased ahead and not reported ended: for `held` of a request."""
        with self.cond:
            ids = {t.task_id for t in self.queue} | set(self.running_ids()) | self.in_flight
            ids |= {item.task_id for item, _ in self.pending}
        return sorted(ids)[:MAX_BATCH]

    # -- finishes ------------------------------------------------------------
    def finish(self, item: FinishItem, entry: dict | None = None) -> None:
        """Send this finish (fenced by its ``attempt``) soon, with others; until it is answered, the
        heartbeat reports the task as ``entry`` (its TaskHandle's)."""
        with self.cond:
            self.pending.append((item, time.monotonic()))
            if entry is not None:
                self.reporting[item.task_id] = entry
            self.cond.notify_all()

    def heartbeat_entries(self) -> list[dict]:
        """The tasks that ended here and whose finish is not answered yet, as heartbeat entries."""
        with self.cond:
            return list(self.reporting.values())

    def flush(self, timeout: float, hurry: threading.Event | None = None) -> bool:
        """Wait until every finish was sent and answered (True), or `timeout` passed; once `hurry` is set (a
        second stop signal, even while this waits), for HURRIED_FLUSH_S more at most."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self.cond.notify_all()
            while self.pending or self.in_flight or self.release:
                if hurry is not None and hurry.is_set():
                    deadline, hurry = min(deadline, time.monotonic() + HURRIED_FLUSH_S), None
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    def _due(self) -> float | None:
        """Seconds until a batch is due (0: now), None when there is nothing to send. Under the lock."""
        if self.release:
            return 0.0
        if not self.pending:
            return None
        if not self.queue or len(self.queue) <= self.slots or len(self.pending) >= MAX_BATCH:
            return 0.0
        return max(0.0, self.pending[0][1] + BATCH_S - time.monotonic())

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.closing:
                    due = self._due()
                    if due == 0.0:
                        break
                    self.cond.wait(due)
                if self.closing and not self.pending and not self.release:
                    return
                batch = [item for item, _ in self.pending[:MAX_BATCH]]
                del self.pending[:len(batch)]
                release, self.release = self.release[:MAX_BATCH], self.release[MAX_BATCH:]
                self.in_flight = {item.task_id for item in batch}
            try:
                if self.supported:
                    self._send(batch, release)
                else:
                    self._send_alone(batch)
            finally:
                with self.cond:
                    done, self.in_flight = self.in_flight, set()
                    for task_id in done:
                        self.reporting.pop(task_id, None)
                    self.cond.notify_all()
                if done:
                    self.answered_ids(done)

    def _send(self, batch: list[FinishItem], release: list[int]) -> None:
        free = max(0, self.free_slots() - self.queued())
        want = bool(free) and self.want_next()
        body = to_wire(FinishMany(finishes=batch, prefetch=True, held=self.held(), release=release, next=want,
                                  max_tasks=free if want else None))
        asked = time.monotonic()
        try:
            answer = self.transport.call("POST", "/worker/finish-many", body)
        except Rejected as exc:
            if exc.status in (404, 405):  # an older control plane: each finish alone from now on
                log_event("finish_many_unsupported", error=str(exc))
                self.supported = False
                self._send_alone(batch)
                return
            log_event("finish_many_rejected", error=str(exc), tasks=len(batch))
            return
        except Unreachable as exc:
            log_event("finish_many_failed", error=str(exc), tasks=len(batch))
            return
        except AgentError as exc:
            self.fatal(exc)
            return
        self.answered(answer, asked, {item.task_id: item for item in batch})

    def answered(self, answer: dict, asked: float, sent: dict[int, FinishItem] | None = None) -> None:
        """Apply an answer of finish-many or acquire: results logged, the queue trimmed and topped up,
        assignments to start now handed over."""
        for result in answer.get("results") or []:
            item = (sent or {}).get(result.get("task_id"))
            log_event("task_finished", task_id=result.get("task_id"), outcome=item.outcome if item else None,
                      exit_code=item.exit_code if item else None, accepted=bool(result.get("accepted")))
            if not result.get("accepted"):
                log_event("task_result_late", task_id=result.get("task_id"), error=result.get("error"))
        dropped = {int(t) for t in answer.get("dropped") or []}
        if dropped:
            with self.cond:
                self.queue = deque(t for t in self.queue if t.task_id not in dropped)
        for task in acquired(answer):
            self.hand_over(task, asked)
        ahead = leased_ahead(answer)
        if ahead:
            self.add(ahead, stopping=not self.want_next())

    def _send_alone(self, batch: list[FinishItem]) -> None:
        for i, item in enumerate(batch):
            want = i == len(batch) - 1 and self.want_next()
            single = Finish(**{name: getattr(item, name) for name in FINISHED}, next=want,
                            max_tasks=max(1, self.free_slots()) if want else None)
            asked = time.monotonic()
            try:
                answer = self.transport.call("POST", f"/worker/tasks/{item.task_id}/finish", to_wire(single))
            except (Rejected, Unreachable) as exc:
                log_event("task_finish_failed", task_id=item.task_id, outcome=item.outcome, error=str(exc))
                continue
            except AgentError as exc:
                self.fatal(exc)
                return
            log_event("task_finished", task_id=item.task_id, outcome=item.outcome,
                      exit_code=item.exit_code, accepted=bool(answer.get("accepted")))
            for task in acquired(answer):
                self.hand_over(task, asked)


def leased_ahead(answer: dict) -> list[Assignment]:
    """The elements leased ahead an answer carries (`ahead`); none (and a log line) when one is unreadable."""
    try:
        return [Assignment.from_wire(task) for task in answer.get("ahead") or []]
    except TypeError as exc:
        log_event("assignment_unreadable", level=logging.WARNING, error=str(exc))
        return []
