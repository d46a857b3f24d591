"""Watching a running task: cancel requests, timeouts, silence, and the handle the heartbeat reads."""

import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from gpulayer.protocol import parse_signal, signal_number

from ..sandbox.process import TaskProcess

POLL_S = 0.05
MIN_POLL_S = 0.005  # the shortest wait for a tick that is due (never a spin)


class TaskRunnerView(Protocol):
    """What exec reads of a task's runner (agent/run/runner.py TaskRunner): its place, environment and sandbox."""

    task_id: int
    image: Any
    ctx: Any
    assignment: Any
    extra_env: dict[str, str]
    #: --pin-cpus: the CPUs its processes run on (what exec, shell and SSH start there run on too); None: unpinned
    cpus: frozenset[int] | None

    @property
    def workdir(self) -> Any: ...

    @property
    def holder(self) -> Any: ...

    def environment(self, extra: dict[str, str]) -> dict[str, str]: ...

    def image_place(self, env: dict[str, str]) -> tuple[dict[str, str], str]: ...


class TaskHandle:
    """What the worker knows of a task while it runs; shared by its runner and the heartbeat."""

    def __init__(self, task_id: int):
        self.task_id = task_id
        self.state = "running"
        self._endpoint: str | None = None
        self.restarts = 0
        #: Called when the endpoint changes, so the worker reports it now rather than a heartbeat later.
        self.on_change: Callable[[], None] = lambda: None
        self.cancel_reason: str | None = None
        #: True when the worker itself stopped the task (SIGTERM, revocation), not the control plane.
        self.by_worker = False
        #: SIGTERM-to-SIGKILL grace the control plane asked for (a preemption's); None: the worker's own.
        self.grace_s: float | None = None
        #: Why it is stopped, as a `task_signalled` event says it: cancelled, preempted, drained.
        self.why = "cancelled"
        #: The signals sent to the task's process ({signal, why, at}), for its finish (`signals`).
        self.signals: list[dict] = []
        #: Whether this attempt's `--signal` warning was sent (once per attempt, a service's restarts included).
        self.warned = False
        self._cancel = threading.Event()
        #: Set once the control plane heard the task's start (or the task ended): until then acquire
        #: answers with this same task again, so the worker asks for the next one only after it.
        self.start_sent = threading.Event()
        #: The Assignment's job_id, attempt and gpus, echoed in heartbeats (a restored control plane checks them).
        self.assignment: dict = {}
        #: The time limit enforced now (seconds from the run's start, None: none), once a run started
        #: (`time_limit_known`): the Assignment's, or the one a heartbeat answer told (`job update --time`).
        self.time_limit: float | None = None
        self.time_limit_known = False
        #: The task's runner and its process while it runs: where `gpulayer exec` enters (agent/relay/exec.py).
        self.runner: TaskRunnerView | None = None
        self.process: TaskProcess | None = None
        #: A fractional task's memory share on a time-slicing worker (MiB; None: not watched), and why it is
        #: stopped once NVML saw its processes use more (agent/gpu/sharing.py, the heartbeat's watch).
        self.gpu_memory_limit_mb: int | None = None
        self.over_share: str | None = None

    @property
    def endpoint(self) -> str | None:
        """``host:port`` once the replica answers; None while it (re)starts."""
        return self._endpoint

    @endpoint.setter
    def endpoint(self, value: str | None) -> None:
        changed = value != self._endpoint
        self._endpoint = value
        if changed:
            self.on_change()

    def cancel(self, reason: str, by_worker: bool = False, grace_s: float | None = None, why: str | None = None) -> None:
        """Ask the runner to stop the task (the first reason is kept); ``by_worker``: the worker is stopping;
        ``grace_s``: SIGKILL this long after SIGTERM instead of the worker's own grace; ``why``: what a
        `task_signalled` event says (default: drained for the worker's own stop, else cancelled)."""
        if not self._cancel.is_set():
            self.cancel_reason, self.by_worker, self.grace_s = reason, by_worker, grace_s
            self.why = why or ("drained" if by_worker else "cancelled")
            self._cancel.set()

    def stop_reason(self) -> str:
        """Why the run stops, as its log says it: `cancelled: ...`, or the requeue's own words (`requeued: ...`)."""
        return str(self.cancel_reason) if self.why == "requeued" else f"cancelled: {self.cancel_reason}"

    def limit_from(self, timeout_s: float | None) -> float | None:
        """The time limit to enforce: the one told since the first run started, else ``timeout_s`` (the
        Assignment's), which is then the one enforced."""
        if not self.time_limit_known:
            self.time_limit, self.time_limit_known = timeout_s, True
        return self.time_limit

    def change_time_limit(self, timeout_s: float | None) -> bool:
        """The control plane changed the job's time limit (a heartbeat's `time_limits`); False when it is the
        one enforced already. The running attempt's deadline becomes its start plus the new limit."""
        if self.time_limit_known and timeout_s == self.time_limit:
            return False
        self.time_limit, self.time_limit_known = timeout_s, True
        return True

    def note_signal(self, name: str, why: str) -> None:
        """A signal was sent to the task's process: its finish reports it (`task_signalled`)."""
        self.signals.append({"signal": f"SIG{name}", "why": why, "at": round(time.time(), 3)})

    @property
    def cancelled(self) -> bool:
        """True once a cancel was asked for."""
        return self._cancel.is_set()

    def wait_cancel(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True as soon as a cancel is asked for."""
        return self._cancel.wait(timeout_s)

    def heartbeat_entry(self) -> dict:
        """The task's entry in a heartbeat's ``tasks`` list."""
        entry = {"task_id": self.task_id, "state": self.state, "endpoint": self.endpoint, "restarts": self.restarts,
                 **self.assignment}
        if self.time_limit_known:  # the control plane answers `time_limits` when the job's limit is not this
            entry["timeout_seconds"] = self.time_limit
        return entry


@dataclass
class Limits:
    """A task's time limits, in seconds (None: no limit); ``since`` is a monotonic start."""

    timeout_s: float | None
    silence_s: float | None
    since: float


@dataclass
class StopRule:
    """How a job's process is stopped (the Assignment's `signal` and `grace_seconds`): the signal of a
    planned stop and to whom, its grace (None: the worker's own rule), and the warning's lead before the
    time limit (None: no warning)."""

    name: str = "TERM"
    batch: bool = False
    grace_s: float | None = None
    warn_before_s: float | None = None

    @classmethod
    def of(cls, signal_text: str | None, grace_s: float | None) -> "StopRule":
        """The rule an Assignment's `signal` (`[B:]SIG@SECONDS`, or None) and `grace_seconds` make."""
        if not signal_text:
            return cls(grace_s=grace_s)
        batch, name, before = parse_signal(signal_text)
        return cls(name, batch, grace_s, float(before))

    @property
    def signum(self) -> int:
        return signal_number(self.name)


@dataclass
class Stop:
    """Why the agent ended a run: ``kind`` is "cancelled", "timed_out", "restart" or "gpu_memory" (over its
    memory share of a time-sliced GPU: the run fails)."""

    kind: str
    reason: str


@dataclass
class TaskResult:
    """How a task ended; ``exit_code`` is None when the command never ran."""

    exit_code: int | None
    outcome: str
    reason: str | None = None


def result_of(stop: Stop | None, exit_code: int) -> TaskResult:
    """The result of a run the agent stopped (``stop``) or that ended by itself."""
    if stop is None:
        if exit_code == 0:
            return TaskResult(0, "succeeded")
        return TaskResult(exit_code, "failed", f"exit code {exit_code}")
    outcome = "timed_out" if stop.kind == "timed_out" else "cancelled" if stop.kind == "cancelled" else "failed"
    return TaskResult(exit_code, outcome, stop.reason)


#: Called every poll while the process runs; returns a restart reason or None.
Tick = Callable[[], str | None]


def check_limits(limits: Limits, last_output: float, now: float) -> Stop | None:
    """The timeout that has passed at ``now``, if any (pure: the clock is a parameter)."""
    if limits.timeout_s is not None and now - limits.since >= limits.timeout_s:
        return Stop("timed_out", f"timeout: ran longer than timeout_seconds={limits.timeout_s:g}")
    if limits.silence_s is not None and now - last_output >= limits.silence_s:
        return Stop("timed_out", f"silence timeout: no output for silence_timeout_seconds={limits.silence_s:g}")
    return None


def supervise(
    proc: TaskProcess,
    handle: TaskHandle,
    limits: Limits,
    system_line: Callable[[str], None],
    kill_grace_s: float,
    on_tick: Tick | None = None,
    rule: StopRule | None = None,
    tick_in: Callable[[], float] | None = None,
) -> Stop | None:
    """Wait for the process to end; stop its group on cancel, timeout or a tick's restart.

    ``rule`` (the job's `signal` and `grace_seconds`): its warning goes SECONDS before the time limit,
    once per attempt; a cancel (preemption, requeue, a drain) sends its signal, the time limit SIGTERM,
    and SIGKILL follows after its grace (without one: a preemption's grace, else ``kill_grace_s``).
    Returns None when the process ended by itself (left-over group members are killed too), else why
    the agent ended it. ``tick_in``: seconds until ``on_tick`` is due (a replica's probe): the loop waits no
    longer than that (at least MIN_POLL_S), else POLL_S.
    """
    handle.process = proc
    rule = rule or StopRule()
    limits.timeout_s = handle.limit_from(limits.timeout_s)
    while True:
        if handle.time_limit != limits.timeout_s:
            _new_limit(handle, limits, rule, system_line)
        if proc.poll() is not None:
            if proc.group_alive():
                system_line("the command exited; killing processes it left running in its process group")
                proc.kill_group(kill_grace_s)
            return None
        if rule.warn_before_s is not None and limits.timeout_s is not None and not handle.warned \
                and time.monotonic() - limits.since >= limits.timeout_s - rule.warn_before_s:
            handle.warned = True
            if proc.send(rule.signum, rule.batch):
                handle.note_signal(rule.name, "time_limit")
                system_line(f"SIG{rule.name} sent {rule.warn_before_s:g} s before the time limit "
                            f"(timeout_seconds={limits.timeout_s:g})")
        stop = _next_stop(proc, handle, limits, on_tick)
        if stop is not None:
            _stop(proc, handle, stop, rule, kill_grace_s, system_line)
            return stop
        try:  # wakes as soon as the leader exits (a trivial command ends in a millisecond, not a poll period)
            proc.popen.wait(timeout=POLL_S if tick_in is None else min(POLL_S, max(MIN_POLL_S, tick_in())))
        except subprocess.TimeoutExpired:
            pass


def _new_limit(handle: TaskHandle, limits: Limits, rule: StopRule, system_line: Callable[[str], None]) -> None:
    """The job's time limit changed while the run goes on (`job update --time`): its deadline is its start plus
    the new limit. A limit moved past its warning's time sends the warning again before the new one."""
    before, limits.timeout_s = limits.timeout_s, handle.time_limit
    ran = time.monotonic() - limits.since
    if handle.warned and rule.warn_before_s is not None and limits.timeout_s is not None \
            and ran < limits.timeout_s - rule.warn_before_s:
        handle.warned = False
    said = "none" if limits.timeout_s is None else f"{limits.timeout_s:g} s"
    was = "none" if before is None else f"{before:g} s"
    system_line(f"time limit changed to {said} (was {was}; this run started {ran:.0f} s ago)")


def _stop(proc: TaskProcess, handle: TaskHandle, stop: Stop, rule: StopRule, kill_grace_s: float,
          system_line: Callable[[str], None]) -> None:
    """The stop sequence: the stop's signal, its grace, SIGKILL (TaskProcess.kill_group)."""
    if rule.grace_s is not None:
        grace_s = rule.grace_s
    else:
        grace_s = handle.grace_s if stop.kind == "cancelled" and handle.grace_s is not None else kill_grace_s
    name, batch = (rule.name, rule.batch) if stop.kind == "cancelled" else ("TERM", False)
    why = handle.why if stop.kind == "cancelled" else stop.kind if stop.kind == "gpu_memory" else \
        "restart" if stop.kind != "timed_out" else \
        "silence_timeout" if stop.reason.startswith("silence") else "time_limit"
    system_line(f"{stop.reason}; stopping the process group (SIG{name}, SIGKILL after {grace_s:g} s)")
    if proc.poll() is None or proc.group_alive():
        handle.note_signal(name, why)
    proc.kill_group(grace_s, signal_number(name) if name != "TERM" else signal.SIGTERM, batch)


def _next_stop(proc: TaskProcess, handle: TaskHandle, limits: Limits, on_tick: Tick | None) -> Stop | None:
    if handle.cancelled:
        return Stop("cancelled", handle.stop_reason())
    if handle.over_share:  # a time-slicing worker's memory share: it fails, saying so
        return Stop("gpu_memory", handle.over_share)
    stop = check_limits(limits, max(proc.last_output, proc.started), time.monotonic())
    if stop is not None:
        return stop
    if on_tick is not None:
        why = on_tick()
        if why:
            return Stop("restart", why)
    return None
