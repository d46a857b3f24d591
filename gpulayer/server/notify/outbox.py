"""The delivery loop: every webhook and mailbox is an outbox over the event log.

One thread ticks (`TICK_S`): it folds the finished tries into one write (cursors advanced, deliveries
recorded), runs the alerts that are due, then, for each webhook with events past its cursor and nothing in
flight, reads its next event (a reader connection) and hands the try to a small pool
(`--webhook-concurrency` threads, each try bounded by `--webhook-timeout`). So a slow or dead receiver
holds one pool thread for at most its timeout, never the writer or a request thread.

At-least-once and in order per webhook: a webhook has at most one try in flight, for the first event past
its cursor it wants; the cursor passes that event only in the write after the receiver's 2xx (or once
`--webhook-retry-for` ran out: `failed`). A failed try is `retrying` in `webhook_deliveries`, tried again
after `--webhook-retry-base` × 2^(tries-1) (at most an hour). A SIGKILL between a 2xx and its write
delivers that event again, with the same `webhook-id`.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone

import apsw

from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.notify import alerts, names, send, signing
from gpulayer.server.security.secretbox import SecretBox
from gpulayer.server.store.db import Store
from gpulayer.server.store.queries import one, row, rows

log = logging.getLogger("gpulayer.server.notify")
TICK_S = 0.25
BATCH = 64  # events read per webhook per look
MAX_BACKOFF_S = 3600.0
PRUNE_EVERY_S = 600.0


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z")


def payload_data(event: dict) -> dict:
    data = {"event_id": event["seq"], "kind": event["kind"], "at": event["at"], "actor": event["actor"]}
    for key in ("job_id", "job_name", "project", "owner", "task_id", "worker_id", "worker"):
        if event.get(key) is not None:
            data[key] = event[key]
    for key, value in event["data"].items():
        data.setdefault(key, value)
    return data


def summary(name: str, event: dict) -> str:
    """One line for people (Slack's text, a mail's subject)."""
    d = event["data"]
    job = f"job {event['job_id']}" + (f" ({event['job_name']})" if event.get("job_name") else "")
    if name == "alert.fired":
        return f"GPUlayer alert {d.get('name')}: {d.get('new')} new row(s)"
    if name.startswith("job."):
        verb = name.split(".", 1)[1]
        extra = ""
        if name in ("job.failed", "job.lost") and (d.get("reason") or d.get("exit_code") is not None):
            extra = f" (exit {d.get('exit_code')}, {d.get('reason')})"
        return f"GPUlayer {job} {verb}{extra}"
    if name.startswith("task."):
        return f"GPUlayer {job} task {event['task_id']} {name.split('.', 1)[1]}"
    what = event.get("worker") or f"worker {event['worker_id']}"
    return f"GPUlayer {what}: {name}"


def body_for(fmt: str, name: str, event: dict) -> bytes:
    if fmt == "slack":
        text = summary(name, event)
        if name == "alert.fired":
            text += "\n" + "\n".join(json.dumps(r, default=str) for r in event["data"].get("rows", [])[:20])
        return json.dumps({"text": text}).encode()
    return json.dumps({"type": name, "timestamp": iso(event["at"]), "data": payload_data(event)}, sort_keys=True, default=str).encode()


class Notifier:
    """The delivery thread and its pool, over one control plane's store."""

    def __init__(self, store: Store, config: ControlPlaneConfig, box: SecretBox, clock: Callable[[], float]):
        self.store, self.config, self.box, self.clock = store, config, box, clock
        from explorer.readonly import ReadOnlyDatabase  # at start, as the explorer's own mount

        self.db = ReadOnlyDatabase(str(config.layout.state), time_limit_s=config.alert_time_limit_s, max_rows=alerts.MAX_ROWS)
        self.pool = ThreadPoolExecutor(max(1, config.webhook_concurrency), thread_name_prefix="gpulayer-webhook")
        self.inflight: set[int] = set()
        self._tries: set[Future] = set()
        self._secrets: dict[int, str] = {}
        self._local = threading.local()
        self.finished: queue.SimpleQueue[dict] = queue.SimpleQueue()
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
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop outlives one bad round (the state file busy, ...)
                if self._stop.is_set():
                    return
                log.exception("notify_tick_failed")

    def tick(self) -> None:
        now = self.clock()
        self.flush(now)
        alerts.run_due(self.store, self.db, now)
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_EVERY_S
            self.store.write(lambda conn: row(conn, "prune_deliveries", before=now - self.config.job_retention_s))
        self.dispatch(now)

    # -- handing out tries --------------------------------------------------------

    def dispatch(self, now: float) -> None:
        """Hand each webhook that has something to deliver and nothing in flight its next try."""
        upto = self.store.read_statement(lambda conn: one(conn, "last_event_seq")["seq"])
        advances: list[tuple[int, int]] = []
        capacity = 4 * max(1, self.config.webhook_concurrency)
        windows: dict[tuple, list[dict]] = {}  # one read per (cursor, kinds, job): webhooks share them
        room = capacity - len(self.inflight)
        if room <= 0:
            return
        due = self.store.read(lambda conn: rows(conn, "due_webhooks", upto=upto, now=now, limit=room, inflight=json.dumps(sorted(self.inflight))))
        for hook in due:
            wanted = set(json.loads(hook["events"]))
            key = (hook["cursor"], json.dumps(names.kinds(sorted(wanted))), hook["job_id"])
            if key not in windows:
                windows[key] = self.store.read(_window, *key, upto)
            found = windows[key]
            picked = next(
                (
                    (name, event)
                    for event in found
                    if _in_scope(hook, event)
                    for name in [names.public(event, wanted, bool(event["first_start"]))]
                    if name
                ),
                None,
            )
            if picked is None:
                advances.append((hook["id"], upto if len(found) < BATCH else found[-1]["seq"]))
                continue
            name, event = picked
            if event["seq"] - 1 > hook["cursor"]:
                advances.append((hook["id"], event["seq"] - 1))
            retrying = hook["retry_seq"] == event["seq"]
            self.inflight.add(hook["id"])
            future = self.pool.submit(
                self._try, dict(hook), name, event, hook["attempts"] if retrying else 0, hook["first_try_at"] if retrying else now, self._secret(hook)
            )
            self._tries.add(future)
            future.add_done_callback(self._tries.discard)
        if advances:
            self.store.write(_advance, advances)

    def _secret(self, hook: dict) -> str | None:
        """A webhook's signing secret, opened once (it never changes)."""
        if not hook["secret"]:
            return None
        if hook["id"] not in self._secrets:
            self._secrets[hook["id"]] = self.box.open(hook["secret"])
        return self._secrets[hook["id"]]

    def _try(self, hook: dict, name: str, event: dict, attempts: int, first: float, secret: str | None) -> None:
        """One try (a pool thread): its outcome goes to `finished`, written by the next flush."""
        msg_id = signing.message_id(hook["id"], event["seq"])
        outcome = {
            "id": hook["id"],
            "seq": event["seq"],
            "event": name,
            "attempts": attempts + 1,
            "first_try_at": first,
            "status": None,
            "error": None,
        }
        try:
            if hook["email"]:
                if not self.config.smtp_url:
                    raise send.SendError("this control plane has no --smtp-url")
                text = json.dumps({"type": name, "timestamp": iso(event["at"]), "data": payload_data(event)}, indent=2, sort_keys=True, default=str)
                send.mail(
                    self.config.smtp_url,
                    self.config.smtp_from,
                    hook["email"],
                    summary(name, event),
                    text,
                    msg_id,
                    timeout=self.config.webhook_timeout_s,
                )
                outcome["status"] = 250
            else:
                body = body_for(hook["format"], name, event)
                headers = signing.headers(secret, msg_id, int(time.time()), body) if secret else {}
                outcome["status"] = send.post(
                    hook["url"],
                    body,
                    headers,
                    timeout=self.config.webhook_timeout_s,
                    allow_private=self.config.allow_private_webhooks,
                    keep=self._kept(),
                )
            outcome["ok"] = True
        except send.SendError as e:
            outcome.update(ok=False, status=e.status, error=str(e)[: send.MAX_ERROR])
        except Exception as e:  # noqa: BLE001 - a try that broke is a failed try, not a dead pool thread
            log.exception("webhook_try_failed webhook=%s", hook["id"])
            outcome.update(ok=False, error=f"{type(e).__name__}: {e}"[: send.MAX_ERROR])
        self.finished.put(outcome)

    def _kept(self) -> dict:
        """This pool thread's kept-alive connections (one receiver's, reused across its tries)."""
        kept = getattr(self._local, "kept", None)
        if kept is None:
            kept = self._local.kept = {}
        if len(kept) > 32:  # many receivers: keep none rather than a descriptor each
            for conn in kept.values():
                conn.close()
            kept.clear()
        return kept

    def settle(self, timeout: float | None = None) -> None:
        """Wait until every try handed out has finished (tests, benches), then write their outcomes."""
        wait(list(self._tries), timeout)
        self.flush(self.clock())

    # -- recording outcomes -------------------------------------------------------

    def flush(self, now: float) -> int:
        """Write what the finished tries did, in one transaction; returns how many."""
        done: list[dict] = []
        while True:
            try:
                done.append(self.finished.get_nowait())
            except queue.Empty:
                break
        if not done:
            return 0
        try:
            self.store.write(_record, done, now, self.config.webhook_retry_base_s, self.config.webhook_retry_for_s)
        finally:
            for outcome in done:
                self.inflight.discard(outcome["id"])
        self.delivered += sum(1 for o in done if o["ok"])
        for o in done:
            if not o["ok"]:
                log.info("webhook_try_failed webhook=%s event=%s attempts=%d error=%r", o["id"], o["seq"], o["attempts"], o["error"])
        return len(done)


def _window(conn: apsw.Connection, cursor: int, kinds: str, job_id: int | None, upto: int) -> list[dict]:
    found = rows(conn, "events_after", cursor=cursor, upto=upto, kinds=kinds, job_id=job_id, limit=BATCH)
    for event in found:
        event["data"] = json.loads(event["data"])
    return found


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


def _advance(conn: apsw.Connection, advances: list[tuple[int, int]]) -> None:
    for webhook_id, seq in advances:
        row(conn, "advance_webhook", id=webhook_id, seq=seq)


def _record(conn: apsw.Connection, done: list[dict], now: float, base_s: float, retry_for_s: float) -> None:
    for o in done:
        if o["ok"]:
            status, next_try, seq = "delivered", None, o["seq"]
        elif now - o["first_try_at"] >= retry_for_s:
            status, next_try, seq = "failed", None, o["seq"]
        else:
            wait = min(MAX_BACKOFF_S, base_s * 2 ** (o["attempts"] - 1))
            status, next_try, seq = "retrying", now + wait, o["seq"] - 1
        row(
            conn,
            "delivery_done",
            id=o["id"],
            seq=o["seq"],
            event=o["event"],
            status=status,
            attempts=o["attempts"],
            first_try_at=o["first_try_at"],
            now=now,
            next_try_at=next_try,
            http_status=o["status"],
            error=o["error"],
        )
        row(conn, "advance_webhook", id=o["id"], seq=seq)
