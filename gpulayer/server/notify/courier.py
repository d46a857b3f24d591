"""The delivery process: where the tries run (HTTP, TLS, signing, mail), apart from the server's process.

A try is mostly waiting, but what it does compute (a connection, TLS, the body, its HMAC, parsing the
answer) is Python, and a pool of threads in the server's process took the GIL from the request threads
for it: heartbeat p99 rose 1.5-2x while 1,000 webhooks delivered (docs/benchmarks/issue-28.md, "Webhooks: the tries
in a delivery process"). So the control plane's delivery thread (outbox.py) keeps the outbox (its reads and writes, per tick) and
hands the tries to this child process, `python -m gpulayer.server.notify.courier`, over two pipes:

- down its stdin, one line of settings, then a line per tick: `{"events": {seq: event}, "tries": [...]}`,
  each try a webhook's (id, event seq, public name, url or email, format, signing secret), the events
  once per batch (1,000 webhooks told of one event carry it once);
- up its stdout, a line of JSON per outcome (`{"id", "seq", "ok", "status", "error"}`), which the
  delivery thread reads at its next tick, never blocking on it.

Here a pool of `concurrency` threads runs the tries, each bounded by a total deadline of `timeout` (send.py), each thread keeping its
receivers' connections alive, at a lower CPU priority than the server (`NICE`): where the cores are
short, the request threads get them first and deliveries go slower, never the other way round. The
process holds nothing that matters: what was tried is the server's rows. It exits when its stdin ends
(the server stopped, or died: the kernel closes the pipe) or its parent changes. A try whose outcome
did not come back (this process killed or crashed mid-batch) is recorded by the server as a failed
try and tried again, with the same `webhook-id`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from gpulayer.server.notify import payloads, send, signing

log = logging.getLogger("gpulayer.server.notify")
MAX_KEPT = 32  # receivers' connections one thread keeps; past it none
NICE = 10  # the delivery process yields the CPU to the server's request threads (nice(2): their weight is ~10x)


# -- the server's end ---------------------------------------------------------------


class Courier:
    """The delivery process as the server sees it: started when there is a try to send, fed one batch a
    tick, its outcomes read without blocking. Used from one thread (the notifier's)."""

    def __init__(self, settings: dict):
        self.settings = settings  # concurrency, timeout, allow_private, smtp_url, smtp_from
        self.proc: subprocess.Popen | None = None
        self.started_at = -math.inf  # time.monotonic() of the last start
        self.starts = 0
        self.exit_code: int | None = None  # of the last process that ended
        self._partial = b""

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        # Its own stdin and stdout, our stderr (its rare log lines go where the server's go). The pipes are
        # not inherited by anything else the server starts (close_fds, PEP 446): when the server dies its
        # stdin ends.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpulayer.server.notify.courier"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._partial = b""
        self.started_at = time.monotonic()
        self.starts += 1
        self._write(json.dumps(self.settings).encode() + b"\n")
        log.info("webhook_courier_started pid=%d", self.proc.pid)

    def send(self, events: dict[int, dict], tries: list[dict]) -> bool:
        """Hand one batch over; False when the process is gone (the next read() reports it ended)."""
        line = json.dumps({"events": events, "tries": tries}, default=str).encode() + b"\n"
        return self._write(line)

    def _write(self, data: bytes) -> bool:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def read(self, timeout: float = 0.0) -> tuple[list[dict], bool]:
        """The outcomes written since the last read (waiting at most `timeout` for some), and whether the
        process has ended (its stdout closed: it exited or was killed; it is reaped)."""
        if self.proc is None:
            return [], False
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if timeout > 0:
            select.select([fd], [], [], timeout)
        chunks, ended = [], False
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
        lines = (self._partial + b"".join(chunks)).split(b"\n")
        self._partial = lines.pop()
        found = [json.loads(line) for line in lines if line]
        if ended:
            self._reap()
        return found, ended

    def kill(self) -> None:
        """SIGKILL it (a try stuck far past its timeout); the next read() reports it ended."""
        if self.proc is not None:
            self.proc.kill()

    def _reap(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            self.exit_code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stdout closed but alive: not ours to keep
            proc.kill()
            self.exit_code = proc.wait()
        log.warning("webhook_courier_exited pid=%d code=%s", proc.pid, self.exit_code)

    def stop(self, timeout: float = 5.0) -> None:
        """End it: its stdin closed, it exits (tries still running are cut: the server tries them again)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# -- the delivery process -----------------------------------------------------------


def deliver(settings: dict, attempt: dict, event: dict, local: threading.local) -> dict:
    """Make one try (a pool thread): its outcome, never an exception."""
    outcome = {"id": attempt["id"], "seq": attempt["seq"], "ok": False, "status": None, "error": None}
    name = attempt["name"]
    msg_id = signing.message_id(attempt["id"], attempt["seq"])
    try:
        if attempt.get("email"):
            if not settings.get("smtp_url"):
                raise send.SendError("this control plane has no --smtp-url")
            send.mail(
                settings["smtp_url"],
                settings["smtp_from"],
                attempt["email"],
                payloads.summary(name, event),
                payloads.mail_text(name, event),
                msg_id,
                timeout=settings["timeout"],
            )
            outcome["status"] = 250
        else:
            body = payloads.body_for(attempt["format"], name, event)
            secret = attempt.get("secret")
            headers = signing.headers(secret, msg_id, int(time.time()), body) if secret else {}
            outcome["status"] = send.post(
                attempt["url"], body, headers, timeout=settings["timeout"], allow_private=settings["allow_private"], keep=_kept(local)
            )
        outcome["ok"] = True
    except send.SendError as e:
        outcome.update(status=e.status, error=str(e)[: send.MAX_ERROR])
    except Exception as e:  # noqa: BLE001 - a try that broke is a failed try, not a dead pool thread
        log.exception("webhook_try_failed webhook=%s", attempt["id"])
        outcome["error"] = f"{type(e).__name__}: {e}"[: send.MAX_ERROR]
    return outcome


def _kept(local: threading.local) -> dict:
    """This pool thread's kept-alive connections (one receiver's, reused across its tries)."""
    kept = getattr(local, "kept", None)
    if kept is None:
        kept = local.kept = {}
    if len(kept) > MAX_KEPT:  # many receivers: keep none rather than a descriptor each
        for conn in kept.values():
            conn.close()
        kept.clear()
    return kept


def _write_outcomes(outcomes: queue.SimpleQueue, sink: IO[bytes]) -> None:
    """Write the outcomes as they come, those ready together in one write; exit when nobody reads."""
    while True:
        ready = [outcomes.get()]
        while True:
            try:
                ready.append(outcomes.get_nowait())
            except queue.Empty:
                break
        try:
            sink.write(b"".join(json.dumps(o).encode() + b"\n" for o in ready))
            sink.flush()
        except (OSError, ValueError):
            os._exit(0)


def _watch_parent(parent: int) -> None:
    """Exit when the server is gone though our stdin did not end (its pipe held by something else)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's: it stops us by closing stdin
    try:
        os.nice(NICE)  # deliveries are background work: on a busy machine heartbeats come first
    except OSError:
        pass
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s courier: %(message)s")
    parent = os.getppid()
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    first = source.readline()
    if not first:
        return 0
    settings = json.loads(first)
    outcomes: queue.SimpleQueue[dict] = queue.SimpleQueue()
    threading.Thread(target=_write_outcomes, args=(outcomes, sink), name="courier-out", daemon=True).start()
    threading.Thread(target=_watch_parent, args=(parent,), name="courier-parent", daemon=True).start()
    pool = ThreadPoolExecutor(max(1, int(settings["concurrency"])), thread_name_prefix="courier")
    local = threading.local()

    def run(attempt: dict, event: dict) -> None:
        outcomes.put(deliver(settings, attempt, event, local))

    for line in source:  # ends when the server closes the pipe or dies
        batch = json.loads(line)
        events = batch["events"]
        for attempt in batch["tries"]:
            pool.submit(run, attempt, events[str(attempt["seq"])])
    os._exit(0)  # tries still running are cut: the server did not record them, it tries them again


if __name__ == "__main__":
    raise SystemExit(main())
