"""Process groups, kills that reach grandchildren, timeouts and silence timeouts."""

import os
import sys
import threading
import time

import pytest

from agent.sandbox.process import TaskProcess, exit_code_of
from agent.run.supervision import Limits, StopRule, TaskHandle, check_limits, supervise


def spawn(code, tmp_path, lines=None, **options):
    lines = [] if lines is None else lines
    return TaskProcess([sys.executable, "-c", code], dict(os.environ, PYTHONUNBUFFERED="1"), str(tmp_path),
                       lambda stream, text: lines.append((stream, text)), **options)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split(")")[-1].split()[0] != "Z"


GRANDCHILD = """
import subprocess, sys, time, pathlib
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pathlib.Path("grandchild.pid").write_text(str(child.pid))
print("ready", flush=True)
time.sleep(600)
"""


def wait_for(predicate, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_lines_are_captured_per_stream(tmp_path):
    lines = []
    proc = spawn("import sys; print('out'); print('err', file=sys.stderr); sys.stdout.write('no newline')", tmp_path, lines)
    assert proc.popen.wait() == 0
    proc.finish_readers()
    assert sorted(lines) == [("stderr", "err"), ("stdout", "no newline"), ("stdout", "out")]


def test_a_quick_process_output_is_drained_by_the_caller_without_a_reader_thread(tmp_path):
    lines = []
    proc = spawn("import sys; print('out'); print('err', file=sys.stderr); sys.stdout.write('tail')", tmp_path, lines,
                 defer_readers=True)
    assert proc.popen.wait() == 0 and proc._readers == [] and lines == []
    proc.finish_readers()
    assert sorted(lines) == [("stderr", "err"), ("stdout", "out"), ("stdout", "tail")]
    assert proc._pipes == []  # both read to their end here: no thread was started for them
    assert proc._readers == []


def test_deferred_output_left_open_by_a_child_goes_on_in_a_reader_thread(tmp_path):
    # The leader ends at once; a child it left behind keeps stdout open and writes after the inline drain.
    code = ("import subprocess, sys; print('first', flush=True)\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.3); print(\"late\", flush=True)'])")
    lines = []
    proc = spawn(code, tmp_path, lines, defer_readers=True)
    assert proc.popen.wait() == 0
    proc.finish_readers(timeout_s=5)
    assert [text for _stream, text in lines] == ["first", "late"]
    assert len(proc._readers) == 1


def test_deferred_readers_started_later_read_what_a_long_writer_writes(tmp_path):
    lines = []
    proc = spawn("for i in range(20000): print('line', i)", tmp_path, lines, defer_readers=True)
    time.sleep(0.05)  # more than a pipe holds: it waits for a reader
    proc.start_readers()
    proc.start_readers()  # once
    assert proc.popen.wait() == 0
    proc.finish_readers()
    assert len(lines) == 20000 and lines[-1] == ("stdout", "line 19999") and len(proc._readers) == 1


def test_lines_keep_their_order_and_long_lines_are_split(tmp_path):
    from agent.sandbox.process import MAX_LINE_BYTES
    code = (f"import sys; n = {MAX_LINE_BYTES}\n"
            "for i in range(3000): print(f'line {i}')\n"
            "print('e' * 10, file=sys.stderr); print('x' * (n - 1)); print('y' * n); print('z' * (2 * n + 5), end='')\n"
            "sys.stdout.buffer.write('é'.encode()[:1] + b'\\n')")
    lines = []
    proc = spawn(code, tmp_path, lines)
    assert proc.popen.wait() == 0
    proc.finish_readers()
    out = [text for stream, text in lines if stream == "stdout"]
    assert out[:3000] == [f"line {i}" for i in range(3000)]
    n = MAX_LINE_BYTES
    assert out[3000:] == ["x" * (n - 1), "y" * n, "", "z" * n, "z" * n, "z" * 5 + "\ufffd"]
    assert [text for stream, text in lines if stream == "stderr"] == ["e" * 10]


def test_task_leads_its_own_process_group(tmp_path):
    proc = spawn("import time; time.sleep(5)", tmp_path)
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        proc.kill_group(1)


def test_kill_group_reaches_the_grandchild(tmp_path):
    lines = []
    proc = spawn(GRANDCHILD, tmp_path, lines)
    assert wait_for(lambda: ("stdout", "ready") in lines)
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    proc.kill_group(grace_s=2)
    assert exit_code_of(proc.popen.returncode) == 128 + 15
    assert wait_for(lambda: not alive(grandchild))


def test_sigterm_ignored_means_sigkill_after_grace(tmp_path):
    lines = []
    proc = spawn("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('armed', flush=True); time.sleep(60)", tmp_path, lines)
    assert wait_for(lambda: ("stdout", "armed") in lines)
    started = time.monotonic()
    proc.kill_group(grace_s=0.3)
    assert 0.25 < time.monotonic() - started < 5
    assert proc.popen.returncode == -9


def test_check_limits_with_a_pinned_clock():
    limits = Limits(timeout_s=10, silence_s=3, since=100.0)
    assert check_limits(limits, last_output=100.0, now=102.9) is None
    assert check_limits(limits, last_output=100.0, now=103.0).reason.startswith("silence timeout")
    assert check_limits(limits, last_output=109.0, now=110.0).kind == "timed_out"
    assert "timeout_seconds=10" in check_limits(limits, last_output=109.0, now=110.0).reason


@pytest.mark.parametrize(
    "code, limits, words",
    [
        ("import time; time.sleep(60)", dict(timeout_s=0.5, silence_s=None), "timeout: ran longer than timeout_seconds=0.5"),
        ("import time\nwhile True: print('tick', flush=True); time.sleep(0.1)", dict(timeout_s=0.8, silence_s=0.5), "timeout_seconds"),
        ("import time; print('one', flush=True); time.sleep(60)", dict(timeout_s=None, silence_s=0.5), "silence timeout"),
    ],
)
def test_supervise_timeouts(tmp_path, code, limits, words):
    proc = spawn(code, tmp_path)
    system = []
    stop = supervise(proc, TaskHandle(1), Limits(since=proc.started, **limits), system.append, kill_grace_s=1)
    assert stop.kind == "timed_out" and words in stop.reason
    assert words in system[0]
    assert proc.poll() is not None


def test_supervise_cancel_kills_and_left_overs_are_killed(tmp_path):
    lines = []
    proc = spawn(GRANDCHILD, tmp_path, lines)
    handle = TaskHandle(1)
    assert wait_for(lambda: ("stdout", "ready") in lines)
    handle.cancel("the control plane cancelled this task")
    stop = supervise(proc, handle, Limits(None, None, proc.started), [].append, kill_grace_s=1)
    assert stop.kind == "cancelled"
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert wait_for(lambda: not alive(grandchild))

    proc = spawn("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
                 " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print('bye')", tmp_path)
    system = []
    assert supervise(proc, TaskHandle(2), Limits(None, None, proc.started), system.append, kill_grace_s=1) is None
    assert "left running" in system[0]
    assert not proc.group_alive()


def test_a_time_limit_changed_while_supervised_moves_the_deadline(tmp_path):
    """`job update --time` heard in a heartbeat answer (TaskHandle.change_time_limit): the run's deadline is its
    start plus the new limit; a shortened one ends it as its time limit does; the heartbeat echoes it."""
    proc = spawn("import time; time.sleep(60)", tmp_path)
    handle, system = TaskHandle(1), []
    assert "timeout_seconds" not in handle.heartbeat_entry()  # before the run: nothing enforced yet
    threading.Timer(0.3, handle.change_time_limit, [0.6]).start()
    stop = supervise(proc, handle, Limits(3600, None, proc.started), system.append, kill_grace_s=1)
    assert stop.kind == "timed_out" and "timeout_seconds=0.6" in stop.reason, stop
    assert any("time limit changed to 0.6 s (was 3600 s" in line for line in system), system
    assert handle.heartbeat_entry()["timeout_seconds"] == 0.6
    assert not handle.change_time_limit(0.6)  # told again: nothing changes


def test_a_time_limit_lengthened_past_the_warning_sends_it_again(tmp_path):
    code = ("import signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n"
            "print('ready', flush=True)\ntime.sleep(60)")
    lines: list = []
    proc = spawn(code, tmp_path, lines)
    assert wait_for(lambda: ("stdout", "ready") in lines)
    handle = TaskHandle(1)
    rule = StopRule("USR1", warn_before_s=2.5, grace_s=1.0)
    threading.Timer(1.0, handle.change_time_limit, [6.0]).start()  # after the first warning (at 0.5 s)
    stop = supervise(proc, handle, Limits(3.0, None, proc.started), [].append, kill_grace_s=1, rule=rule)
    assert stop.kind == "timed_out"
    assert [s["signal"] for s in handle.signals] == ["SIGUSR1", "SIGUSR1", "SIGTERM"], handle.signals
