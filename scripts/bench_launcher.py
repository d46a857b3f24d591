"""The launch of `true` as the agent starts it, five ways, interleaved (issue 25, item 3 c and item 2).

bare; in a bwrap of its own (a plain task: Sandbox.wrap); entered into a job's shared sandbox by nsenter, setpriv
and env (agent/sandbox/shared.py without a launcher); forked by the job's launcher (agent/sandbox/launcher.py); in a sandbox made
ahead (agent/sandbox/spares.py: from the task's argv handed over to its namespace's end; the spare's making is not in the
wall time, but its CPU is in the children's). For each: the
median wall time of a launch to its exit, and the CPU it cost: the children's user+system time (what the
launched processes and the kernel on their behalf spent; for the launcher, its own CPU and its reaped children's,
from /proc, in clock ticks), the agent's own (this process: fork, pipes, the
launcher's messages), and the whole machine's busy time (/proc/stat, which also holds the kernel's deferred work
and whatever else runs: an upper bound on a loaded machine). Wall well above CPU is waiting (the kernel's RCU
grace periods when a mount namespace ends), not work.

    python scripts/bench_launcher.py [--launches 100] [--json]

Needs a root agent's setting (root, bwrap, nsenter, setpriv).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import emit, machine, machine_line, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent.sandbox.bwrap import resolve  # noqa: E402
from agent.sandbox.launcher import host_pid  # noqa: E402
from agent.sandbox.shared import SharedSandboxes  # noqa: E402
from agent.sandbox.spares import Spares  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def busy_s() -> float:
    """Seconds of CPU the whole machine has spent (all cores, not idle or waiting on I/O)."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) * TICK_S


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    """Seconds of CPU of process ``pid`` and of the children it reaped (the launcher's share of a launch)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) * TICK_S


def measure(count: int) -> dict:
    sandbox = resolve("bwrap", hidden=[], shown=[sys.base_prefix, sys.prefix])
    if not sandbox.shares(False):
        raise SystemExit("needs a root agent's setting: root, bwrap, nsenter and setpriv")
    with tempfile.TemporaryDirectory() as tasks:
        plain = Path(tasks) / "plain"
        plain.mkdir()
        spares = Spares(sandbox, Path(tasks) / "spares", None, most=1)
        entered_dirs = SharedSandboxes(sandbox, Path(tasks) / "nsenter", None, launcher=None)
        launched_dirs = SharedSandboxes(sandbox, Path(tasks) / "launcher", None)
        holders = [entered_dirs.hold(1, True), launched_dirs.hold(2, True)]
        for holder in holders:
            (holder.job_dir / "1-1").mkdir()
            sandbox.give(holder.job_dir / "1-1")
        entered_pid = entered_dirs.started(holders[0])
        launched_dirs.started(holders[1])
        launcher = holders[1].launcher
        assert launcher is not None and launcher.pidfd is not None, "the launcher did not start"
        launcher_pid = host_pid(launcher.pidfd)
        assert launcher_pid is not None
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        element = str(holders[1].job_dir / "1-1")

        def launched() -> None:
            proc = launched_dirs.launch(holders[1], ["true"], env, element, print)
            assert proc is not None, "the launcher did not start"
            proc.wait()
            proc.close_pipes()

        def made_ahead() -> float:
            """The launch in a spare made while the last one ran (its making is not timed: its CPU counts)."""
            spare = None
            deadline = time.monotonic() + 30
            while spare is None and time.monotonic() < deadline:
                spare = spares.take(True)
                if spare is None:
                    time.sleep(0.005)
            assert spare is not None, "no sandbox made ahead"
            workdir = spare.box / "1-1"
            workdir.mkdir()
            sandbox.give(workdir)
            began = time.perf_counter()
            proc = spares.start(spare, ["true"], env, str(workdir))
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):  # to end-of-file: the namespace ended, as `run` waits for
                assert pipe is not None
                pipe.read()
                pipe.close()
            span = time.perf_counter() - began
            spares._end(spare)  # here, not on the ender thread: its CPU is counted with this launch's
            return span

        def run(argv: list[str]) -> None:
            subprocess.run(argv, check=True, start_new_session=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        ways = {
            "bare": lambda: run(["true"]),
            "bwrap": lambda: run(sandbox.wrap(["true"], str(plain), gpu_nodes=[])),
            "nsenter": lambda: run(sandbox.enter_argv(entered_pid, ["true"], str(holders[0].job_dir / "1-1"), network=True)),
            "launcher": launched,
            "made ahead": made_ahead,
        }
        spans: dict[str, list[float]] = {name: [] for name in ways}
        spent = {name: [0.0, 0.0, 0.0] for name in ways}  # children, agent, machine
        try:
            for _ in range(count):
                for name, launch in ways.items():
                    inside = process_cpu(launcher_pid) if name == "launcher" else 0.0
                    before = (cpu(resource.RUSAGE_CHILDREN), cpu(resource.RUSAGE_SELF), busy_s(), time.perf_counter())
                    timed = launch()
                    after = (cpu(resource.RUSAGE_CHILDREN), cpu(resource.RUSAGE_SELF), busy_s(), time.perf_counter())
                    if timed is not None:  # made ahead: the launch alone, not the wait for a spare
                        after = (*after[:3], before[3] + timed)
                    if name == "launcher":  # its element is the launcher's child, not ours
                        spent[name][0] += process_cpu(launcher_pid) - inside
                    spans[name].append(after[3] - before[3])
                    for i in range(3):
                        spent[name][i] += after[i] - before[i]
        finally:
            spares.close()
            entered_dirs.close()
            launched_dirs.close()
    return {
        name: {
            "wall_ms": median(spans[name]) * 1000,
            "children_cpu_ms": spent[name][0] / count * 1000,
            "agent_cpu_ms": spent[name][1] / count * 1000,
            "machine_busy_ms": spent[name][2] / count * 1000,
        }
        for name in ways
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {"machine": machine(), "launches": args.launches, "launch": measure(args.launches)}
    lines = [machine_line(result["machine"]), f"launch of `true` (median wall of {args.launches}; CPU: means)"]
    for name, figures in result["launch"].items():
        lines.append(
            f"  {name:10} wall {figures['wall_ms']:6.2f} ms  children CPU {figures['children_cpu_ms']:6.2f} ms"
            f"  agent CPU {figures['agent_cpu_ms']:5.2f} ms  machine busy {figures['machine_busy_ms']:6.2f} ms"
        )
    emit(result, args.json, "\n".join(lines))


if __name__ == "__main__":
    main()
