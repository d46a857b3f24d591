"""The delivery loop: every webhook and mailbox is an outbox over the event log.

One thread ticks (`TICK_S`, or sooner when a try's outcome comes back: `MIN_TICK_S`): it reads the
outcomes the delivery process wrote since the last tick and folds them into one write (cursors advanced,
deliveries recorded: deliveries.py, through the Scheduler's door), runs the alerts that are due, then, for each webhook with events past its cursor
and nothing in flight, reads its next event (a reader connection) and hands the tries, one batch a tick,
to the delivery process (courier.py: a child process with a pool of `--webhook-concurrency` threads, each
try bounded by a total deadline, send.Deadline). So a slow or dead receiver holds one of its threads for
at most that deadline, never the writer or a request thread, and the HTTP, TLS, signing and mail of the
tries take no CPU, and no GIL, from the server's process. One owner has at most half the threads' worth
of tries in flight (`per_owner`): its slow receivers never hold up another owner's deliveries.

A webhook delivers what its owner may read at the time of the try: due_webhooks reads the owner's rights
now (admin, removed, its roles), and each event is checked against them (`may_read`, the rules of a job
read); a webhook whose owner was removed is disabled, with a `webhook_disabled` event.

At-least-once and in order per webhook: a webhook has at most one try in flight, for the first event past
its cursor it wants; the cursor passes that event only in the write after the receiver's 2xx (or once
`--webhook-retry-for` ran out: `failed`). A failed try is `retrying` in `webhook_deliveries`, tried again
after `--webhook-retry-base` × 2^(tries-1) (at most an hour). A SIGKILL between a 2xx and its write
delivers that event again, with the same `webhook-id`; so does a delivery process that died (or was
killed) with tries in it: those tries are recorded as failed, and it is started again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

import apsw

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.notify import alerts, names
from gpulayer.server.notify.courier import Courier
from gpulayer.server.scheduler import teams
from gpulayer.server.scheduler.notifications import Notifications
from gpulayer.server.store.queries import one, rows
from gpulayer.server.store.readonly_sql import ReadOnlyDatabase

log = logging.getLogger("gpulayer.server.notify")
TICK_S = 0.25
MIN_TICK_S = 0.05  # the soonest a try's outcome brings the next tick (each tick writes the outcomes once)
BATCH = 64  # events read per webhook per look
PRUNE_EVERY_S = 600.0
RESTART_GAP_S = 1.0  # a delivery process that ended is started again no sooner than this after its start


class Notifier:
    """The delivery thread, and the delivery process it feeds, over one control plane's scheduler: it reads the
    store, and writes through the scheduler's door (its notification calls: deliveries.py's transactions)."""

    def __init__(self, scheduler: Notifications, config: ControlPlaneConfig, clock: Callable[[], float]):
        self.scheduler, self.config, self.clock = scheduler, config, clock
        self.store, self.box = scheduler.store, scheduler.secret_box
        self.db = ReadOnlyDatabase(str(config.layout.state), time_limit_s=config.alert_time_limit_s, max_rows=alerts.MAX_ROWS)
        self.courier = Courier(
            {
                "concurrency": max(1, config.webhook_concurrency),
                "timeout": config.webhook_timeout_s,
                "allow_private": config.allow_private_webhooks,
                "smtp_url": config.smtp_url,
                "smtp_from": config.smtp_from,
            }
        )
        # A try past this in the delivery process is stuck (its threads each wait at most the timeout, and
        # the tries queued there are at most 4 × the threads): the process is killed and started again.
        self.stuck_s = max(60.0, 10 * config.webhook_timeout_s)
        self.inflight: set[int] = set()  # webhooks with a try out, or an outcome not yet written
        self.owners: dict[int, int] = {}  # of those, webhook id -> its owner's user id
        # Tries one owner may have at once: its slow receivers (each try bounded by its deadline) hold
        # at most half the delivery process's threads, and never delay another owner's tries.
        self.per_owner = max(1, config.webhook_concurrency // 2)
        self.sent: dict[int, dict] = {}  # webhook id -> its try in the delivery process, no outcome yet
        self.finished: list[dict] = []  # outcomes read, written by the next flush
        self._secrets: dict[str, str] = {}  # sealed -> opened
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_prune = 0.0
        self.delivered = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpulayer-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.courier.stop()

    def _run(self) -> None:
        while not self._pause():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop outlives one bad round (the state file busy, ...)
                if self._stop.is_set():
                    return
                log.exception("notify_tick_failed")

    def _pause(self) -> bool:
        """Wait for the next tick (True: stop). A tick comes TICK_S after the last one, or as soon as a try's
        outcome comes back (but not within MIN_TICK_S of the last): an owner's next try goes out when one of
        its few in flight ends, not up to a quarter second later, so the per-owner cap bounds how many
        tries are in flight at once, not how many a second a fast receiver gets."""
        if self._stop.wait(MIN_TICK_S):
            return True
        if not self.sent or not self.courier.running:
            return self._stop.wait(TICK_S - MIN_TICK_S)
        self.collect(TICK_S - MIN_TICK_S)
        return self._stop.is_set()

    def tick(self) -> None:
        now = self.clock()
        self.collect()
        self.flush(now)
        alerts.run_due(self.store, self.db, now, self.scheduler.alert_ran)
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_EVERY_S
            self.scheduler.prune_deliveries(now - self.config.job_retention_s)
        self.dispatch(now)

    # -- handing out tries --------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Hand each webhook that has something to deliver and nothing in flight its next try: one batch
        to the delivery process (started here when it is not running)."""
        if not self.courier.running and time.monotonic() - self.courier.started_at < RESTART_GAP_S:
            return  # it ended just after it started: not again at once
        upto = self.store.read_statement(lambda conn: one(conn, "last_event_seq")["seq"])
        advances: list[tuple[int, int]] = []
        capacity = 4 * max(1, self.config.webhook_concurrency)
        windows: dict[tuple, list[dict]] = {}  # one read per (cursor, kinds, job): webhooks share them
        room = capacity - len(self.inflight)
        if room <= 0:
            return
        busy = json.dumps(Counter(self.owners.values()))
        due = self.store.read(
            lambda conn: rows(
                conn, "due_webhooks", upto=upto, now=now, limit=room, inflight=json.dumps(sorted(self.inflight)), busy=busy, per_owner=self.per_owner
            )
        )
        events: dict[int, dict] = {}
        tries: list[dict] = []
        gone: list[dict] = []
        for hook in due:
            if hook["owner_gone"]:
                gone.append(hook)
                continue
            wanted = set(json.loads(hook["events"]))
            key = (hook["cursor"], json.dumps(names.kinds(sorted(wanted))), hook["job_id"])
            if key not in windows:
                windows[key] = self.store.read(_window, *key, upto)
            found = windows[key]
            picked = _pick(hook, wanted, found)
            if picked is None:
                advances.append((hook["id"], upto if len(found) < BATCH else found[-1]["seq"]))
                continue
            name, event = picked
            if event["seq"] - 1 > hook["cursor"]:
                advances.append((hook["id"], event["seq"] - 1))
            events[event["seq"]] = event
            tries.append(self._hand_out(hook, name, event, now))
        if tries:
            if not self.courier.running:
                self.courier.start()
            self.courier.send(events, tries)  # a process gone meanwhile: the next collect says so
        if advances:
            self.scheduler.advance_webhooks(advances)
        if gone:
            self.scheduler.disable_webhooks(gone, now)

    def _hand_out(self, hook: dict, name: str, event: dict, now: float) -> dict:
        """The try of `event` for `hook` (its public `name`), counted in flight."""
        retrying = hook["retry_seq"] == event["seq"]
        self.inflight.add(hook["id"])
        self.owners[hook["id"]] = hook["user_id"]
        self.sent[hook["id"]] = {
            "id": hook["id"],
            "seq": event["seq"],
            "event": name,
            "attempts": (hook["attempts"] if retrying else 0) + 1,
            "first_try_at": hook["first_try_at"] if retrying else now,
            "sent_at": time.monotonic(),
        }
        return {
            "id": hook["id"],
            "seq": event["seq"],
            "name": name,
            "url": hook["url"],
            "email": hook["email"],
            "format": hook["format"],
            "secret": self._secret(hook),
        }

    def _secret(self, hook: dict) -> str | None:
        """A webhook's signing secret, opened once, kept by its sealed value (a secret that is no one's
        any more is simply never asked for again)."""
        sealed = hook["secret"]
        if not sealed:
            return None
        if sealed not in self._secrets:
            if len(self._secrets) > 10_000:
                self._secrets.clear()
            self._secrets[sealed] = self.box.open(sealed)
        return self._secrets[sealed]

    # -- reading outcomes ---------------------------------------------------------

    def collect(self, timeout: float = 0.0) -> int:
        """Read the outcomes the delivery process wrote (waiting at most `timeout` for some) into
        `finished`. When it has ended, each try it held without an outcome is a failed try (its receiver
        may have had it: it is sent again with the same webhook-id). Returns how many outcomes."""
        if not self.courier.running:
            return 0
        if self.sent and time.monotonic() - min(t["sent_at"] for t in self.sent.values()) > self.stuck_s:
            log.warning("webhook_courier_stuck pid=%s tries=%d: killed", self.courier.pid, len(self.sent))
            self.courier.kill()
            timeout = max(timeout, 5.0)
        found, ended = self.courier.read(timeout)
        for _ in range(50):  # it exited: read what it wrote, to the end of its pipe
            if ended or self.courier.proc is None or self.courier.proc.poll() is None:
                break
            more, ended = self.courier.read(0.1)
            found += more
        n = 0
        for outcome in found:
            sent = self.sent.get(outcome["id"])
            if sent is None or sent["seq"] != outcome["seq"]:
                continue  # not a try of this process (cannot happen: one process, one try per webhook)
            del self.sent[outcome["id"]]
            self.finished.append(_outcome(sent, ok=outcome["ok"], status=outcome["status"], error=outcome["error"]))
            n += 1
        if ended:
            error = f"the delivery process exited ({self.courier.exit_code}) before this try's outcome came back"
            for sent in self.sent.values():
                self.finished.append(_outcome(sent, ok=False, status=None, error=error))
            n += len(self.sent)
            self.sent.clear()
        return n

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every try handed out has an outcome (tests, benches), then write them."""
        deadline = time.monotonic() + timeout
        while self.sent and self.courier.running and time.monotonic() < deadline:
            self.collect(min(0.1, max(0.0, deadline - time.monotonic())))
        self.flush(self.clock())

    # -- recording outcomes -------------------------------------------------------

    def flush(self, now: float) -> int:
        """Write what the finished tries did, in one transaction; returns how many."""
        done, self.finished = self.finished, []
        if not done:
            return 0
        try:
            self.scheduler.record_deliveries(done, now)
        finally:
            for outcome in done:
                self.inflight.discard(outcome["id"])
                self.owners.pop(outcome["id"], None)
        self.delivered += sum(1 for o in done if o["ok"])
        for o in done:
            if not o["ok"]:
                log.info("webhook_try_failed webhook=%s event=%s attempts=%d error=%r", o["id"], o["seq"], o["attempts"], o["error"])
        return len(done)


def _outcome(sent: dict, *, ok: bool, status: int | None, error: str | None) -> dict:
    return {k: sent[k] for k in ("id", "seq", "event", "attempts", "first_try_at")} | {"ok": ok, "status": status, "error": error}


def _window(conn: apsw.Connection, cursor: int, kinds: str, job_id: int | None, upto: int) -> list[dict]:
    found = rows(conn, "events_after", cursor=cursor, upto=upto, kinds=kinds, job_id=job_id, limit=BATCH)
    for event in found:
        event["data"] = json.loads(event["data"])
    return found


def _pick(hook: dict, wanted: set[str], found: list[dict]) -> tuple[str, dict] | None:
    """The first event of `found` for `hook` (in its scope, one it wants, its owner may read now) with its
    public name; None when there is none."""
    roles = json.loads(hook["owner_roles"] or "{}")
    for event in found:
        if not (_in_scope(hook, event) and may_read(hook, roles, event)):
            continue
        name = names.public(event, wanted, bool(event["first_start"]))
        if name:
            return name, event
    return None


def may_read(hook: dict, roles: dict[str, str], event: dict) -> bool:
    """May the webhook's owner read `event` now (its rights as due_webhooks read them this tick, not as
    they were when the webhook was added)? A job's event: whoever may read the job's logs (teams.level:
    its owner, its project's managers, members of a `project`-visible project, admins). Worker and GPU
    events: admins. An alert's: while the alert's adder is an admin (its rows are the whole file's)."""
    if event["kind"] == "alert_fired":
        return bool(event["alert_admin"])
    if event["job_id"] is None:
        return bool(hook["owner_admin"])
    owner = SimpleNamespace(admin=bool(hook["owner_admin"]), user_id=hook["user_id"])
    job = {"user_id": event["user_id"], "role": roles.get(str(event["project_id"])), "visibility": event["visibility"]}
    return teams.LEVELS.get(teams.level(owner, job) or "", 0) >= teams.LEVELS["read"]




def _in_scope(hook: dict, event: dict) -> bool:
    """Is `event` the webhook's: an alert's for the alert that names it, else within its scope."""
    if event["kind"] == "alert_fired":
        return event["data"].get("webhook_id") == hook["id"]
    scope = hook["scope"]
    return (
        scope == "all"
        or (scope == "job" and event["job_id"] == hook["job_id"])
        or (scope == "project" and event["project_id"] == hook["project_id"])
        or (scope == "user" and event["user_id"] == hook["user_id"])
    )
