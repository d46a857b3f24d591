"""The writer process's end of the RPC: front ends' writes run in its group commits, and what it tells them.

Each front end holds one connection to the Unix socket. Its requests (codec.py's frames):

- `("write", id, fn, args, kwargs, options, actor)`: the scheduler's `_write(fn, *args, **options, **kwargs)`
  on the writer's scheduler (so in the Store's group transaction, with the cascade steps it asks for), under
  the caller's actor; answered `("ok", id, result, outs)` (`outs`: the list arguments the write changed, such
  as acquire's `ahead`) or `("err", id, error)`;
- `("notes", id, renewals, samples)`: the front end's renewal notes and GPU samples since its last tick,
  merged into the writer's before its expiry transaction; answered with the online fleet (the cadence) and,
  in a restored home while its reconciliation rules apply, their state (the front end's heartbeats then take
  the write path, where the writer applies them: its own `restored` and its `_adopting` of start and finish);
- `("drain", id, job_id)`: run job `job_id`'s cascade steps until it has none (a submit's, a cancel's);
- `("forget", id)`: principals changed there (a revocation): the writer forgets its own, and every front end.

What the writer tells every front end, unasked, coalesced: `("push", kinds)` with `wake` (something may have
become placeable: parked acquires look again), `written` (after any write: log followers look again) and
`forget`.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpulayer.server.multiproc import codec
from gpulayer.server.scheduler import events, lifecycle

log = logging.getLogger("gpulayer.server.multiproc.rpc")
WRITE_THREADS = 64   # writes of all front ends in progress at once (each waits for its group's COMMIT)


class _Peer:
    """One front end's connection: its socket and the lock its answers and pushes are sent under."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, frame: bytes) -> None:
        try:
            with self.lock:
                self.sock.sendall(frame)
        except OSError:
            pass  # gone: its reader sees the end of the stream and drops it


class WriterServer:
    """The writer's Unix socket, serving the front ends' requests on `scheduler` (the writer's own)."""

    def __init__(self, path: Path, scheduler):
        self.path = Path(path)
        self.scheduler = scheduler
        self.shared = {"scheduler": scheduler, "secret_box": scheduler.secret_box}
        self._peers: set[_Peer] = set()
        self._peers_lock = threading.Lock()
        self._pending: set[str] = set()
        self._push = threading.Condition()
        self._stopping = False
        self._pool = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="gpulayer-rpc-write")
        self._listener: socket.socket | None = None
        self._wire_pushes()

    def _wire_pushes(self) -> None:
        """The writer's wake-ups, log writes and forgotten principals reach every front end too."""
        scheduler, wake, written = self.scheduler, self.scheduler.wake, self.scheduler.log_followers.written

        def pushing_wake() -> None:
            wake()
            self.push("wake")

        def pushing_written() -> None:
            written()
            self.push("written")
        scheduler.wake = pushing_wake
        scheduler.log_followers.written = pushing_written
        scheduler.auth.on_invalidate(lambda: self.push("forget"))

    def start(self) -> None:
        if self.path.exists():
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))   # 0600: the owner's alone
        finally:
            os.umask(old)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, name="gpulayer-rpc-accept", daemon=True).start()
        threading.Thread(target=self._pusher, name="gpulayer-rpc-push", daemon=True).start()
        log.info("writer_rpc_listening socket=%s", self.path)

    def stop(self) -> None:
        """Stop taking requests; front ends see the end of the stream (their writes answer 503 until a writer
        is back). The writes in progress finish first."""
        self._stopping = True
        with self._push:
            self._push.notify_all()
        if self._listener is not None:
            self._listener.close()
        self._pool.shutdown(wait=True)
        with self._peers_lock:
            peers, self._peers = list(self._peers), set()
        for peer in peers:
            try:
                peer.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait_for_front_ends(self, timeout: float) -> None:
        """Until every front end has hung up, or `timeout` seconds: a SIGTERM to the whole process group (systemd's
        default, `timeout`) reaches the writer with its front ends, whose last writes and notes come first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._peers_lock:
                if not self._peers:
                    return
            time.sleep(0.05)

    def push(self, kind: str) -> None:
        with self._push:
            self._pending.add(kind)
            self._push.notify()

    def _pusher(self) -> None:
        while True:
            with self._push:
                while not self._pending and not self._stopping:
                    self._push.wait()
                if self._stopping:
                    return
                kinds, self._pending = frozenset(self._pending), set()
            frame = codec.dumps(("push", kinds), self.shared)
            with self._peers_lock:
                peers = list(self._peers)
            for peer in peers:
                peer.send(frame)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            peer = _Peer(sock)
            with self._peers_lock:
                self._peers.add(peer)
            threading.Thread(target=self._serve, args=(peer,), name="gpulayer-rpc-peer", daemon=True).start()

    def _serve(self, peer: _Peer) -> None:
        try:
            while True:
                payload = codec.read_frame(peer.sock)
                if payload is None:
                    return
                try:
                    message = codec.loads(payload, self.shared)
                except Exception as exc:  # noqa: BLE001 - a refused frame fails its request, not the link
                    log.error("writer_rpc_refused error=%r", exc)
                    continue
                if message[0] == "forget":
                    self.scheduler.auth.invalidate()
                    continue
                self._pool.submit(self._answer, peer, message)
        except (OSError, ConnectionError):
            return
        finally:
            with self._peers_lock:
                self._peers.discard(peer)
            peer.sock.close()

    def _answer(self, peer: _Peer, message: tuple) -> None:
        kind, rid = message[0], message[1]
        try:
            if kind == "write":
                answer = ("ok", rid, *self._write(*message[2:]))
                self.push("written")  # log lines, or a job's end: parked log follows in every front end look
            elif kind == "notes":
                answer = ("ok", rid, self._notes(*message[2:]), [])
            elif kind == "drain":
                self.scheduler.cascades.drive([], until_ended=message[2], inline=0)
                answer = ("ok", rid, None, [])
            else:
                answer = ("err", rid, codec.error_out(ValueError(f"unknown request {kind!r}")))
        except BaseException as exc:  # noqa: BLE001 - sent to the caller, as Store.write raises it
            answer = ("err", rid, codec.error_out(exc))
        try:
            frame = codec.dumps(answer, self.shared)
        except Exception as exc:  # noqa: BLE001 - a result that cannot travel: the caller gets the failure
            frame = codec.dumps(("err", rid, codec.error_out(exc)), self.shared)
        peer.send(frame)

    def _write(self, fn, args: tuple, kwargs: dict, options: dict, actor: str) -> tuple:
        restored = self.scheduler.restored  # a restored home's reconciliation rules are the writer's to apply
        if "restored" in kwargs:
            kwargs = {**kwargs, "restored": restored}
        if restored is not None and fn in (lifecycle.start, lifecycle.finish):
            fn = self.scheduler._adopting(fn)
        token = events.ACTOR.set(actor)
        try:
            before = [(i, list(arg)) for i, arg in enumerate(args) if isinstance(arg, list)]
            result = self.scheduler._write(fn, *args, **options, **kwargs)
            return result, [(i, args[i]) for i, old in before if args[i] != old]
        finally:
            events.ACTOR.reset(token)

    def _notes(self, renewals: dict[int, float], samples: list) -> dict:
        for worker_id, at in renewals.items():
            self.scheduler.renewals.note(worker_id, at)
        if samples:
            self.scheduler.gpu_samples.put_back(samples)
        restored, restoring = self.scheduler.restored, None
        if restored is not None and restored.active():  # the front ends' heartbeats take the write path meanwhile
            restoring = {"paused": restored.paused(), "describe": restored.describe()}
        return {"workers": self.scheduler.cadence.workers, "restoring": restoring}
