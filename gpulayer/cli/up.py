"""`gpulayer up` (a TLS control plane and a local worker in one command) and foreground workers.

`up` leaves `$GPULAYER_HOME/client.json` (url, token, ca_file; 0600) so that
`gpulayer submit` and `gl.connect()` on this machine find the server with no
settings, and prints the `gpulayer join ...` line for other machines.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

from contextlib import nullcontext

from gpulayer.cli.local import home_tokens, worker_config, worker_thread, write_private_json
from gpulayer.client.errors import ClientError

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def run_worker_foreground(settings: dict) -> int:
    """Run the agent in this thread until it stops (SIGTERM/Ctrl-C); its exit code."""
    from agent.worker import run_worker
    return int(run_worker(worker_config(settings)) or 0)


def join_address(host: str) -> str:
    """The address other machines should dial: `host`, or this machine's first address for a wildcard."""
    if host not in WILDCARD_HOSTS:
        return host
    from gpulayer.server.security.certs import local_addresses
    ipv4 = [a for a in local_addresses() if ":" not in a]
    return (ipv4 or [socket.gethostname()])[0]


def _url(host: str, port: int) -> str:
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _wait_for_stop(worker: threading.Thread | None, fenced: threading.Event | None = None) -> None:
    """Block until SIGTERM, SIGINT (Ctrl-C), the local worker's end (when there is one), or `fenced`
    (a restore elsewhere took the replica: this control plane must stop writing)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(0.5) and (worker is None or worker.is_alive()) and not (fenced and fenced.is_set()):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_port_free(host: str, port: int) -> None:
    """ClientError when another process listens on host:port, before `up` touches the home.

    A second `up` on the same home would otherwise reissue its certificates and
    extend its leases before failing to listen.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise ClientError(f"port {port} is taken on {host or '0.0.0.0'}: is `gpulayer up` already running? "
                              "(stop it, or pass --port)") from None


def run_up(home: Path, host: str, port: int, parallel: int | None, worker: bool = True,
           worker_settings: dict | None = None, verbose: bool = False, **settings) -> int:
    """Serve a control plane over TLS, with a local worker unless `worker` is False, until stopped; return 0.

    `worker_settings`: more WorkerConfig fields for the local worker (sandbox, run_as, allow_root_tasks,
    name, labels, python). `verbose`: log INFO lines too (else warnings and errors only, so that the banner
    and the join line are what a person sees).
    `settings`: more ControlPlaneConfig fields (log_retention_s, job_retention_s).
    Raises ClientError when the port is taken, HomeInUse when a control plane runs on `home` already.
    """
    from gpulayer.server.homelock import HomeLock
    check_port_free(host, port)  # before the home is made: a taken port changes nothing
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The home's lock before anything is written there: a second `up` must not reissue the
    # certificates, extend the leases or point client.json at itself (HomeInUse names the first).
    with HomeLock(home, "gpulayer up" if worker else "gpulayer up --no-worker") as lock:
        from gpulayer.server.process import configure_logging
        configure_logging(logging.INFO if verbose else logging.WARNING)
        return _serve_up(home, host, port, parallel, worker, lock, settings, worker_settings or {})


def _serve_up(home: Path, host: str, port: int, parallel: int | None, worker: bool, lock, settings: dict,
              worker_settings: dict) -> int:
    """run_up once the home's lock is held."""
    from gpulayer.server.security.certs import ensure_tls
    from gpulayer.server.config import ControlPlaneConfig
    from gpulayer.server.process import new_plane, stamped
    address = join_address(host)
    tls = ensure_tls(home, [address] if host not in WILDCARD_HOSTS else [])
    tokens = home_tokens(home, rotate_unknown=True)
    plane = new_plane(ControlPlaneConfig(home=home, host=host, port=port, tls_cert=Path(tls["cert"]),
                                            tls_key=Path(tls["key"]), **settings), lock=lock)
    plane.start()
    try:
        bound = urlsplit(plane.url).port or port
        local_url = _url("127.0.0.1" if host in WILDCARD_HOSTS else host, bound)
        write_private_json(home / "client.json",
                           {"url": local_url, "token": tokens["client_token"], "ca_file": str(tls["ca"])})
        # The worker dials 127.0.0.1 but is reached, like the control plane, at the join line's address.
        settings = {"url": local_url, "join_token": tokens["join_token"], "ca_file": str(tls["ca"]),
                    "advertise_address": address, "name": socket.gethostname(), "parallel": parallel or os.cpu_count() or 1,
                    "state_dir": home / "worker", "hidden_paths": [str(home)], **worker_settings}
        with worker_thread(settings) if worker else nullcontext() as thread:
            _announce(local_url, _url(address, bound), tokens["join_token"], tls["fingerprint"], home, worker)
            _wait_for_stop(thread, plane.fenced)
            if plane.fenced.is_set():  # as `server start`: exit 3, so a supervisor does not take it for a clean stop
                print(stamped("gpulayer up: another control plane took the replica's lease (a restore): this one "
                              "stops serving"), file=sys.stderr, flush=True)
            print(stamped("stopping the worker and the control plane..." if worker else "stopping the control plane..."),
                  file=sys.stderr, flush=True)
    finally:
        plane.stop()
    return 3 if plane.fenced.is_set() else 0


def _announce(local_url: str, public_url: str, join_token: str, fingerprint: str, home: Path,
              worker: bool = True) -> None:
    """Print where the server is and the line that joins another machine, set apart from the log lines
    (bold on a terminal, between rules)."""
    rule = "=" * 72
    print(f"\n{rule}\n" + _bold(f"GPUlayer control plane on {public_url}") + f" (this machine: {local_url})"
          + ("" if worker else ", no local worker (--no-worker)"))
    print(f"clients here need nothing more ({home / 'client.json'}); try: gpulayer submit --follow -- echo hello")
    print("\nto add a worker on another machine, run there:\n")
    # The token as an environment variable, not an argument: arguments show in every user's `ps`.
    print("  " + _bold(f"GPULAYER_JOIN_TOKEN={join_token} gpulayer join {public_url} --ca-fingerprint {fingerprint}"))
    print("\n" + ("Ctrl-C stops the worker and the control plane." if worker else "Ctrl-C stops the control plane.")
          + " (--verbose: every log line)" + f"\n{rule}\n", flush=True)


def _bold(text: str) -> str:
    """`text` in bold on a terminal that takes colour (NO_COLOR: none), else as it is."""
    import typer
    from gpulayer.cli.common import colour_on
    return typer.style(text, bold=True) if colour_on() else text
