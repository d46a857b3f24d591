"""A worker's registration: the relay link and the inventory it offers, register, and register again (rejoin).

Also what comes before its first register: the tasks a killed agent on the same state dir left running.
"""

import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from gpulayer.protocol.control import StreamOpen
from gpulayer.protocol.fields import to_wire
from gpulayer.protocol.registration import Register

from . import __version__
from .errors import AgentError, Forbidden, Rejected, Unauthorized, Unreachable
from .events import log_event
from .gpu import sharing, topology
from .gpu.health import GpuHealth
from .gpu.inventory import Inventory, detect, nvml_devices
from .gpu.nvml import Nvml
from .gpu.stats import GpuStats
from .link.addresses import local_address_towards
from .link.backoff import retry_delay
from .link.transport import Transport
from .relay import exec as relay_exec, shell as relay_shell, ssh as relay_ssh, tcp as relay_tcp
from .relay.link import Handler, Relay
from .sandbox.leftovers import RunningTasks
from .worker_state import WorkerState

REJOIN_MIN_S = 5.0  # a session refused again this soon after registering again is not retried


class Registration(WorkerState):
    """Register with the control plane (and again after a heartbeat's 401), with what this worker offers."""

    def _relay(self, base_url: str, verify: bool | str, transport: Transport) -> Relay | None:
        """The relay link (agent/relay/link.py), opened when the control plane asks; None under GPULAYER_AGENT_RELAY=off
        (an agent as before the relay: tests of older agents)."""
        if os.environ.get("GPULAYER_AGENT_RELAY") == "off":
            return None
        token = lambda: (transport.headers.get("Authorization") or "").removeprefix("Bearer ")  # noqa: E731
        handlers: dict[str, Handler] = {"exec": self._exec, "shell": self._shell, "tcp": self._tcp}
        if relay_ssh.available():  # asyncssh (a base dependency) is importable: ssh streams
            handlers["ssh"] = self._ssh
        return Relay(base_url, verify, token, handlers, self.stop_event, no_exec=self.config.no_exec)

    def _exec(self, stream, opened: StreamOpen) -> None:
        relay_exec.serve(stream, opened, self._handle_of)

    def _shell(self, stream, opened: StreamOpen) -> None:
        relay_shell.serve(stream, opened, self._handle_of)

    def _tcp(self, stream, opened: StreamOpen) -> None:
        relay_tcp.serve(stream, opened, self._handle_of)

    def _ssh(self, stream, opened: StreamOpen) -> None:
        relay_ssh.serve(stream, opened, self._handle_of)

    def _inventory(self) -> Inventory:
        """Detect what this worker offers, and where NVML answers, start watching its GPUs' health
        (with --gpus N too: the count is the operator's, the devices' health NVML's)."""
        config = self.config
        if config.gpu_probe is not None:
            return self._shared(detect(probe=config.gpu_probe, cpus=config.cpus, gpus=config.gpus, ram_mb=config.ram_mb))
        nvml = Nvml.open() if config.gpus != 0 else None
        if nvml is not None:
            self._opened.callback(nvml.close)
            self.nvml = nvml
        inventory = detect(probe=nvml.devices if nvml else lambda: [], cpus=config.cpus, gpus=config.gpus,
                           ram_mb=config.ram_mb)
        if nvml is not None and config.gpus is not None:  # detect left NVML's devices out: map them here
            inventory.nvml_devices = nvml_devices(inventory.device_ids, nvml.devices())
        if nvml is not None and inventory.nvml_devices:
            self.gpu_health = GpuHealth(nvml, inventory.nvml_devices, on_change=self.beat_now.set)
            self.gpu_health.start()
            self._opened.callback(self.gpu_health.stop)  # before NVML closes
            self.gpu_stats = GpuStats(nvml, inventory.nvml_devices, lambda: self.interval_s)
            self.gpu_stats.start()
            self._opened.callback(self.gpu_stats.stop)
            totals = [u.memory_total_mb for u in map(nvml.usage, sorted({d.gpu for d in inventory.nvml_devices.values()}))
                      if u is not None and u.memory_total_mb]
            inventory.gpu_memory_mb = min(totals) if totals else 0
            inventory.gpu_topology = topology.read(nvml, inventory.nvml_devices)
            if config.pin_cpus:
                inventory.gpu_cpus = topology.local_cpus(nvml, inventory.nvml_devices)
        return self._shared(inventory)

    def _shared(self, inventory: Inventory) -> Inventory:
        """The inventory with the sharing mode offered: `--gpu-sharing` as asked, or off (said at start) where
        MPS is asked without its daemon installed, or the worker has no GPU."""
        mode, why = sharing.resolve(self.config.gpu_sharing)
        if mode != "off" and not inventory.gpus:
            mode, why = "off", f"--gpu-sharing {mode}: this worker offers no GPU"
        if why:
            print(f"gpulayer worker: {why}", file=sys.stderr, flush=True)
            log_event("gpu_sharing_off", level=logging.WARNING, message=why)
        inventory.gpu_sharing = mode
        return inventory

    def _kill_leftovers(self, state_dir: Path) -> None:
        """Kill the tasks a killed agent on this state dir left running (the control plane lost them)."""
        for name, pgid in RunningTasks(state_dir).reap():
            log_event("leftover_task_killed", task=name, pgid=pgid)
            if not self.config.keep_task_dirs:
                shutil.rmtree(state_dir / "tasks" / name, ignore_errors=True)

    def _register(self, transport: Transport, inventory: Inventory, joiner: Transport | None = None) -> dict | None:
        """POST register (through `joiner` where given), retried while unreachable; `transport` then carries the
        session token. None if stopped before it answered."""
        config = self.config
        body = to_wire(Register(
            name=config.name or socket.gethostname(), labels=dict(config.labels), resources=inventory.resources(),
            version=__version__, slots=max(1, int(config.parallel)), isolation=self.sandbox.isolation(),
            # additive: an older control plane ignores it
            relay=self.relay.register_field() if self.relay is not None else None,
            # so that no task is placed on a GPU already broken
            gpus=self.gpu_health.report() if self.gpu_health is not None else None,
            # how its GPUs are wired: placement keeps a multi-GPU task on one NVLink set (additive)
            gpu_topology=inventory.gpu_topology or None,
            # none: the control plane takes the address it sees
            advertise_address=config.advertise_address or local_address_towards(config.url) or None))
        via = joiner or transport
        via.set_token(config.join_token)
        failures = 0
        while not self.stop_event.is_set():
            try:
                answer = via.request("POST", "/workers/register", body)
                break
            except Unreachable as exc:
                failures += 1
                log_event("register_retry", failures=failures, error=str(exc))
                self.stop_event.wait(retry_delay(failures))
            except Unauthorized:
                raise AgentError("the control plane refused the join token (401 unauthorized): check $GPULAYER_JOIN_TOKEN") from None
            except Forbidden as exc:
                if exc.code == "forbidden":  # a valid token of the wrong kind
                    raise AgentError("the control plane refused this token for registering (403 forbidden): use a join token (glj_...)") from None
                raise AgentError(f"the control plane refused to register this worker: {exc.code}: {exc.message}") from None
            except Rejected as exc:
                raise AgentError(f"the control plane refused to register this worker: {exc.code}: {exc.message}") from None
        else:
            return None
        transport.set_token(answer["session_token"])
        self.interval_s = float(answer.get("heartbeat_interval_s") or 2.0)
        self.requests_renew = answer.get("requests_renew_lease") is True
        log_event("worker_registered", worker_id=answer.get("worker_id"), name=answer.get("name") or body["name"],
                  labels=answer.get("labels", body["labels"]), slots=body["slots"],
                  advertise_address=answer.get("advertise_address"), heartbeat_interval_s=self.interval_s)
        for warning in answer.get("warnings") or []:
            log_event("register_warning", level=logging.WARNING, message=warning)
        return answer

    def _rejoin(self, refused: str | None) -> bool:
        """Register again after a heartbeat's 401 (which a revoked worker never gets: it hears `revoked`).

        A control plane restored from a replica may have lost this worker's
        registration (made in the window the replica had not caught). The join
        token registers it again; running tasks carry on and the next heartbeat
        reports them (the control plane adopts those it has queued). False when
        the join token is refused too, or when this session was just made.
        """
        session = self.session
        with self.rejoin_lock:
            if session.transport.headers.get("Authorization") != refused:
                return True  # registered again meanwhile
            if not self.config.join_token or time.monotonic() - self.rejoined_at < REJOIN_MIN_S:
                return False
            self.rejoined_at = time.monotonic()
            log_event("worker_rejoining", reason="the control plane does not know this session (401)")
            joiner = session.new_transport()  # tasks keep sending with the session token meanwhile
            try:
                return self._register(session.transport, session.inventory, joiner) is not None
            except AgentError as exc:
                log_event("worker_rejoin_refused", error=str(exc))
                return False
            finally:
                joiner.close()
