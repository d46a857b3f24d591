"""Task processes that a killed agent left running, and the agent that kills them on its next start.

An agent that is SIGKILLed (or OOM-killed, or whose host rebooted its service)
cannot stop its tasks: their process groups live on, holding GPUs and memory
while the control plane retries the work elsewhere, or hands the same GPUs to
the restarted agent. So each running task's process group is recorded under
``<state-dir>/running/<task_id>-<attempt>.json`` with the agent that owns it,
and an agent starting on that state dir kills the groups whose agent is gone.
An agent still alive (another one sharing the state dir) keeps its tasks.
Records hold process start times, so a reused pid is never mistaken for them.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

from .process import live_group_members

#: SIGTERM first; SIGKILL what is left after this many seconds.
LEFTOVER_GRACE_S = 2.0
#: How long the watchdog waits, once its pipe closed, for the agent's process to be gone.
WATCH_EXIT_S = 30.0
#: What an agent's process writes to its watchdog before a clean end.
WATCH_DONE = b"done"


def start_time(pid: int, proc_root: str = "/proc", *, live: bool = False) -> int | None:
    """The process's start time (clock ticks since boot), None when there is no such process
    (with ``live``, also when it is a zombie: it has died, its parent has not reaped it yet)."""
    try:
        with open(f"{proc_root}/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        if live and fields[0] in ("Z", "X"):
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


class RunningTasks:
    """The records of one state dir's running tasks."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir) / "running"
        #: (pid, start time) of the agent that made self.dir, once: a task's record is on its launch's path.
        self._agent: tuple[int, int | None] | None = None

    def add(self, name: str, pgid: int) -> None:
        """Record that task ``name`` runs as process group ``pgid`` of this agent (written whole, then renamed:
        a reaper never reads half a record)."""
        if self._agent is None or self._agent[0] != os.getpid():
            self.dir.mkdir(parents=True, exist_ok=True)
            self._agent = (os.getpid(), start_time(os.getpid()))
        record = f'{{"pgid": {int(pgid)}, "start": {json.dumps(start_time(pgid))}, "agent": {self._agent[0]}, ' \
                 f'"agent_start": {json.dumps(self._agent[1])}}}'
        tmp = os.path.join(self.dir, f".{name}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:  # the directory went away meanwhile
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, record.encode())
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(self.dir, f"{name}.json"))

    def remove(self, name: str) -> None:
        (self.dir / f"{name}.json").unlink(missing_ok=True)

    def reap(self, grace_s: float = LEFTOVER_GRACE_S) -> list[tuple[str, int]]:
        """Kill the groups of records whose agent is gone; drop those records. Returns (name, pgid) killed."""
        killed = []
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                record = json.loads(path.read_text())
                pgid, agent = int(record["pgid"]), int(record["agent"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if start_time(agent, live=True) is not None and start_time(agent) == record.get("agent_start"):
                continue  # its agent runs: another agent on this state dir
            if _group_is_the_recorded_one(pgid, record.get("start")):
                _kill_group(pgid, grace_s)
                killed.append((path.stem, pgid))
            path.unlink(missing_ok=True)
        return killed


def _group_is_the_recorded_one(pgid: int, recorded_start: int | None) -> bool:
    """True when process group ``pgid`` still exists and is the task's, not a reuse of the number."""
    leader = start_time(pgid)
    if leader is not None:
        return leader == recorded_start
    # The leader is gone; a pid is not reused while a group of that id has members.
    return bool(live_group_members(pgid))


def _kill_group(pgid: int, grace_s: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not live_group_members(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(state_dir: Path, agent_pid: int, pipe=None) -> list[tuple[str, int]]:
    """The task watchdog of an agent that runs in a CLI's thread (`submit --target local`): wait for the
    end of ``pipe`` (only the agent's process holds its other end, so it ends when that process dies,
    SIGKILL included), then for that process to be gone, then kill the task groups it left. A pipe
    that said WATCH_DONE first ends it with nothing killed."""
    pipe = sys.stdin.buffer if pipe is None else pipe
    told = b""
    while chunk := pipe.read(4096):
        told += chunk[:16]
    if told.startswith(WATCH_DONE):  # a clean end: the worker stopped its tasks itself
        return []
    deadline = time.monotonic() + WATCH_EXIT_S
    while start_time(agent_pid, live=True) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    return RunningTasks(state_dir).reap()


if __name__ == "__main__":  # python -m agent.sandbox.leftovers STATE_DIR AGENT_PID (the watchdog)
    watch(Path(sys.argv[1]), int(sys.argv[2]))
