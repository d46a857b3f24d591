"""An in-process control plane, for `gpulayer submit --target local` (cli/submit.py) and the local history.

The control plane runs in this process on 127.0.0.1 (a free port, plain HTTP,
the state file in $GPULAYER_HOME) and a worker agent runs in a thread against
it; `local_control_plane()` yields an ordinary client and stops both on exit.
This module imports nothing else of the CLI, which imports it.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gpulayer.client.api import Client
from gpulayer.client.errors import ClientError
from gpulayer.protocol import plural

LOCAL_TOKENS = "local-tokens.json"  # tokens of a home initialised by `up` or a local run (0600)
WORKER_STOP_S = 30.0
LOCAL_WORKER_WAIT_S = 30.0  # for the local worker to register, before its resources are known
WATCHDOG_STOP_S = 5.0
LOCAL_RUN = "a `--target local` run"  # what a local run's lock file says it is


def write_private_json(path: Path, data: dict) -> None:
    """Write JSON readable by the owner only (created 0600, replaced atomically)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def home_tokens(home: Path, rotate_unknown: bool = False) -> dict:
    """The client and join tokens of `home`, initialising it on first use.

    A home initialised by `gpulayer server init` keeps only token hashes: with
    rotate_unknown the tokens are rotated (and kept here), else ClientError.
    """
    from gpulayer.server.errors import GpulayerError
    from gpulayer.server.process import init_home
    path = home / LOCAL_TOKENS
    if path.exists():
        return json.loads(path.read_text())
    try:
        tokens = init_home(home)
    except GpulayerError:
        if not rotate_unknown:
            raise ClientError(f"{home} was initialised by `gpulayer server init` and its tokens are not "
                              "kept there: use that server (--url, GPULAYER_URL) or another --home") from None
        tokens = init_home(home, force=True)
        print(f"gpulayer: {home} kept no clear tokens (made by `server init`): rotated its client "
              "and join tokens", file=sys.stderr)
    write_private_json(path, tokens)
    return tokens


def worker_config(settings: dict):
    """An agent WorkerConfig from CLI-style settings (None values left to the agent's defaults)."""
    from agent.worker import WorkerConfig
    fields = {k: v for k, v in settings.items() if v is not None}
    if "state_dir" in fields:
        fields["state_dir"] = str(fields["state_dir"])
    return WorkerConfig(**fields)


@contextmanager
def worker_thread(settings: dict) -> Iterator[threading.Thread]:
    """Run the agent in a daemon thread for the duration of the block; stop it after."""
    from agent.worker import run_worker
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(worker_config(settings), stop),
                              name="gpulayer-worker", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(WORKER_STOP_S)


def _local_sandbox() -> str | None:
    """$GPULAYER_WORKER_SANDBOX for the local worker (None: the agent's default, auto); ClientError when bad."""
    mode = os.environ.get("GPULAYER_WORKER_SANDBOX") or None
    if mode not in (None, "auto", "bwrap", "none"):
        raise ClientError(f"GPULAYER_WORKER_SANDBOX={mode}: expected auto, bwrap or none")
    return mode


@contextmanager
def local_control_plane(home: Path) -> Iterator[tuple[Client, dict, dict | None]]:
    """A control plane on 127.0.0.1:0 (plain HTTP) and a local worker, for one block.

    Yields (client, tokens, worker): the local worker as `worker list` shows it once it is online
    (None when it did not come online within LOCAL_WORKER_WAIT_S).
    """
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.homelock import HomeInUse, HomeLock
    from gpulayer.server.process import ControlPlane
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        lock = HomeLock(home, LOCAL_RUN).acquire()  # before anything is written to the home
    except HomeInUse as exc:
        raise ClientError(_in_use(home, exc.holder)) from None
    try:
        tokens = home_tokens(home)
        plane = ControlPlane(ControlPlaneConfig(home=home, host="127.0.0.1", port=0), lock=lock)
        plane.start()
        try:
            settings = dict(url=plane.url, join_token=tokens["join_token"], name=f"local-{socket.gethostname()}",
                            parallel=os.cpu_count() or 1, state_dir=home / "local-worker", hidden_paths=[str(home)],
                            sandbox=_local_sandbox())
            with Client(plane.url, tokens["client_token"]) as client:
                end_earlier_runs(client, plane.deps.scheduler)
                with _task_watchdog(settings["state_dir"]), worker_thread(settings) as thread:
                    yield client, tokens, _online_worker(client, settings["name"], thread)
        finally:
            plane.stop()
    finally:
        lock.release()


@contextmanager
def signals_interrupt() -> Iterator[list[int]]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does, for the block;
    yields the list the signal's number is put in (empty for a Ctrl-C)."""
    import signal
    received: list[int] = []

    def interrupt(signum, _frame):
        if not received:
            received.append(signum)
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def end_earlier_runs(client: Client, scheduler) -> list[int]:
    """End what an earlier local run on this home left active (it was killed: SIGKILL, a crash); the job ids.

    Its jobs are cancelled (events: job cancelled), then its worker, which died with it, is deregistered
    (its tasks lost, event worker_gone), so this run's worker is not told its name is online already.
    The home's lock is held: no other run can be using them. The tasks' processes are the worker's
    leftovers (agent/sandbox/leftovers.py), killed by the task watchdog or this run's worker at its start.
    """
    ended = []
    for state in ("running", "queued", "waiting"):
        for job in client.jobs(state=state, limit=1000):
            if scheduler.cancel(job["id"]):
                ended.append(job["id"])
    for worker in client.workers():
        if worker["state"] != "gone":
            scheduler.deregister(worker["id"])
    if ended:
        print(f"gpulayer: ended {plural(len(ended), 'job')} an earlier `--target local` run on this home left "
              f"running (it was killed): {', '.join(map(str, ended))}", file=sys.stderr)
    return ended


@contextmanager
def _task_watchdog(state_dir: Path) -> Iterator[None]:
    """A child process that kills this run's task process groups once this process dies, however it
    dies (SIGKILL included): it waits for the end of a pipe that only this process holds.

    In its own session, so the SIGHUP of a closed terminal and a Ctrl-C reach it no more than the
    tasks (which lead their own sessions).
    """
    import subprocess
    from agent.sandbox.leftovers import WATCH_DONE
    watchdog = subprocess.Popen([sys.executable, "-m", "agent.sandbox.leftovers", str(state_dir), str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        yield
    finally:
        pipe = watchdog.stdin  # a pipe: stdin=PIPE
        try:
            if pipe is not None:
                pipe.write(WATCH_DONE)  # the worker stopped its tasks: nothing to kill
                pipe.close()
        except OSError:
            pass
        try:
            watchdog.wait(WATCHDOG_STOP_S)
        except subprocess.TimeoutExpired:
            watchdog.kill()


def _online_worker(client: Client, name: str, thread: threading.Thread) -> dict | None:
    """The local worker's listing once it has registered (it is the only one a local run has)."""
    deadline = time.monotonic() + LOCAL_WORKER_WAIT_S
    while thread.is_alive() and time.monotonic() < deadline:
        found = [w for w in client.workers() if w["name"] == name and w["state"] == "online"]
        if found:
            return max(found, key=lambda w: w["id"])
        time.sleep(0.05)
    return None


def unmet(spec: dict, worker: dict) -> str | None:
    """What `spec` asks that this machine's worker can never give (a local run has no other); None when
    it fits. Values of a wrong type are left to the control plane's check of the spec."""
    res = worker.get("resources") or {}
    try:
        gpus = int(spec["gpus"]) if spec.get("gpus") is not None else (1 if spec.get("accelerator") == "cuda" else 0)
        asked = [("GPU", gpus, int(res.get("gpus") or 0)), ("CPU", float(spec.get("cpus") or 0), res.get("cpus")),
                 ("MB of memory", int(spec.get("memory_mb") or 0), res.get("memory_mb")),
                 ("node", int(spec.get("nodes") or 1), 1)]
    except (TypeError, ValueError):
        return None
    for noun, want, have in asked:
        nouns = noun if noun.startswith("MB") else None
        if have is not None and want > have:
            return f"this machine has {plural(have, noun, nouns)}; the job asks for {plural(want, noun, nouns)}"
    asked_labels = spec.get("labels")
    labels = asked_labels if isinstance(asked_labels, dict) else {}
    for key, value in sorted(labels.items()):
        if key == "gpu_model" and value in (res.get("gpu_models") or []):
            continue
        if (worker.get("labels") or {}).get(key) != value:
            has = f"no GPU of model {value}" if key == "gpu_model" else f"no label {key}={value}"
            return f"this machine's worker has {has}; the job asks for it"
    return None


def _in_use(home: Path, holder: dict) -> str:
    """Why a local run cannot use `home`: another local run, or a control plane serving it."""
    pid = holder.get("pid", "?")
    if holder.get("what") == LOCAL_RUN:
        return (f"another `--target local` run (pid {pid}) is using {home}: wait for it to end, or give this "
                "one another GPULAYER_HOME (`gpulayer up` runs several jobs at once)")
    where = f" on {holder['url']}" if holder.get("url") else ""
    return (f"{holder.get('what') or 'a control plane'} (pid {pid}) serves {home}{where}: send the job there "
            "(without --target local), or give this run another GPULAYER_HOME")


def history_client(home: Path, on_close) -> Client | None:
    """A Client over the jobs that `--target local` ran in `home`, or None when it ran none.

    Starts the home's control plane in this process with no worker (so nothing
    queued there runs) and hands `plane.stop` to `on_close`: `gpulayer job
    logs|outputs|list|status` then work for local jobs as for remote ones.
    """
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.homelock import HomeInUse, HomeLock
    from gpulayer.server.process import ControlPlane
    tokens_path = home / LOCAL_TOKENS
    if not tokens_path.exists() or not (home / "state.db").exists():
        return None
    tokens = json.loads(tokens_path.read_text())
    plane = ControlPlane(ControlPlaneConfig(home=home, host="127.0.0.1", port=0),
                         lock=HomeLock(home, "`gpulayer job ...` reading the local jobs"))
    try:
        plane.start()
    except HomeInUse as exc:  # a local run (or a plain loopback server) has the home: ask it instead
        url = exc.holder.get("url") or ""
        if not url.startswith("http://127.0.0.1:"):
            raise ClientError(f"{exc.message}; or give its --url") from None
        return Client(url, tokens["client_token"])
    on_close(plane.lock.release)  # an exit stack calls them last in, first out: after the stop
    on_close(plane.stop)
    return Client(plane.url, tokens["client_token"])


def quiet_logs() -> None:
    """Only warnings from the in-process server and agent: the job's output is what matters here."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="gpulayer: %(levelname)s %(message)s")

