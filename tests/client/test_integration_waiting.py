"""Waiting, told, and the CLI's habits, against a real control plane and a real worker (`cluster`).

Ctrl-C is a real ^C typed into a pseudo-terminal (the `pty` module): the
terminal sends SIGINT to the CLI as it would for a person.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time

import pytest

import gpulayer as gl
from gpulayer.client.errors import WaitTimeout
from gpulayer.testing import CLI, clean_env, wait_for
from terminal import Terminal

pytestmark = pytest.mark.timeout(300)

NOWHERE = ["--label", "pool=nowhere"]  # no worker carries it: the job waits, and says why


def _ok(result, code=0):
    assert result.returncode == code, f"exit {result.returncode}\nstdout:{result.stdout}\nstderr:{result.stderr}"
    return result


def _state(cluster, job_id):
    return cluster.job(job_id)["state"]


def _first_id(terminal):
    line = terminal.read_until("\n").splitlines()[0]
    return int(line.strip())


def test_submit_wait_says_what_the_job_waits_for(cluster):
    proc = subprocess.Popen([*CLI, "submit", "--wait", *NOWHERE, "--", "true"], env=clean_env(**cluster.cli_env()),
                            cwd=cluster.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = int(proc.stdout.readline())
    line = proc.stderr.readline()  # blocks until told (about 3 s)
    assert line.startswith("waiting: no online worker has the labels") and '"nowhere"' in line, line
    _ok(cluster.cli("job", "cancel", str(job_id)))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "waiting" not in err, err  # told once: the reason did not change


def test_submit_follow_says_it_too(cluster):
    proc = subprocess.Popen([*CLI, "submit", "--follow", *NOWHERE, "--", "true"],
                            env=clean_env(**cluster.cli_env()), cwd=cluster.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = int(proc.stdout.readline())
    assert proc.stderr.readline().startswith("waiting: no online worker has the labels")
    _ok(cluster.cli("job", "cancel", str(job_id)))
    proc.communicate(timeout=60)


def test_python_wait_calls_on_waiting(cluster):
    client = cluster.client()
    job = client.submit(gl.job(["true"], labels={"pool": "nowhere"}))
    told = []
    with pytest.raises(WaitTimeout):
        job.wait(timeout=6, on_waiting=told.append)
    job.cancel()
    assert len(told) == 1 and told[0].startswith("no online worker has the labels") and "nowhere" in told[0]


def test_a_service_replica_not_placed_and_one_crash_looping_are_told(cluster):
    # One replica more than there are workers: the last cannot be placed (one replica per worker). The
    # session's cluster has one worker or, once test_integration_cli's multi-node test has run, two.
    replicas = sum(1 for worker in cluster.workers.values() if worker.running) + 1
    proc = subprocess.Popen([*CLI, "submit", "--service", "--replicas", str(replicas), "--", "sleep", "300"],
                            env=clean_env(**cluster.cli_env()), cwd=cluster.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = int(proc.stdout.readline())
    needs = f"waiting: needs {replicas} workers, one per replica, but only {replicas - 1} online fit it"
    assert _told(proc, needs).strip() == needs  # not "the workers that fit are busy" (issue 22 item 18)
    cluster.wait_job(job_id, ("running",), 60)
    assert cluster.job(job_id)["waiting_reason"] == needs.removeprefix("waiting: ")
    assert needs in _ok(cluster.cli("job", "status", str(job_id))).stdout
    _ok(cluster.cli("job", "cancel", str(job_id)))
    proc.communicate(timeout=60)

    crashing = subprocess.Popen([*CLI, "submit", "--service", "--no-port", "--", "sh", "-c", "exit 1"],
                                env=clean_env(**cluster.cli_env()), cwd=cluster.root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = int(crashing.stdout.readline())
    line = _told(crashing, "waiting: replica 0: restart ")
    assert "exited with code 1; next run in" in line, line
    status = _ok(cluster.cli("job", "status", str(job_id))).stdout
    assert "restart " in status and "exited with code 1" in status
    _ok(cluster.cli("job", "cancel", str(job_id)))
    crashing.communicate(timeout=60)


def _told(proc, start: str, most: int = 20, timeout: float = 90.0) -> str:
    """The first stderr line of `proc` that starts with `start` (among its first `most`, within `timeout`).

    Lines are read by a thread, so a line that never comes fails the test instead of hanging it.
    """
    lines: queue.Queue = queue.Queue()
    if not hasattr(proc, "_told_reader"):
        proc._told_reader = threading.Thread(target=lambda: [lines.put(x) for x in iter(proc.stderr.readline, "")],
                                             daemon=True)
        proc._told_lines = lines
        proc._told_reader.start()
    lines = proc._told_lines
    seen = []
    deadline = time.monotonic() + timeout
    for _ in range(most):
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith(start):
            return line
        seen.append(line)
    raise AssertionError(f"no line starting {start!r} in {seen}")


def test_ctrl_c_leaves_the_job_running_and_says_how_to_cancel_it(cluster):
    terminal = Terminal([*CLI, "submit", "--wait", "--", "sleep", "120"], clean_env(**cluster.cli_env()), cluster.root)
    job_id = _first_id(terminal)
    cluster.wait_job(job_id, ("running",), 60)
    terminal.interrupt()
    terminal.read_until(f"gpulayer job cancel {job_id}")  # the line, however late the terminal passes it on
    assert terminal.exit_code() == 130
    assert f"job {job_id} is still running: gpulayer job cancel {job_id}" in terminal.output
    assert "Traceback" not in terminal.output
    assert _state(cluster, job_id) == "running"
    _ok(cluster.cli("job", "cancel", str(job_id)))


def test_ctrl_c_with_cancel_on_interrupt_cancels(cluster):
    terminal = Terminal([*CLI, "submit", "--wait", "--cancel-on-interrupt", "--", "sleep", "120"],
                        clean_env(**cluster.cli_env()), cluster.root)
    job_id = _first_id(terminal)
    cluster.wait_job(job_id, ("running",), 60)
    terminal.interrupt()
    terminal.read_until(f"job {job_id} cancelled")
    assert terminal.exit_code() == 130
    assert _state(cluster, job_id) == "cancelled"


def test_ctrl_c_on_a_local_job_cancels_it(tmp_path):
    home = tmp_path / "home"
    terminal = Terminal([*CLI, "submit", "--", "sh", "-c", "echo started; sleep 120"],
                        clean_env(GPULAYER_HOME=str(home)), tmp_path)
    job_id = _first_id(terminal)
    terminal.read_until("started")
    terminal.interrupt()
    terminal.read_until(f"job {job_id} cancelled")
    assert terminal.exit_code() == 130
    assert "Traceback" not in terminal.output


def test_job_logs_into_head_does_not_fail(cluster):
    job_id = int(_ok(cluster.cli("submit", "--wait", "--", "seq", "1", "50000")).stdout.split()[0])
    proc = subprocess.Popen([*CLI, "job", "logs", str(job_id)], env=clean_env(**cluster.cli_env()),
                            cwd=cluster.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"1\n"
    proc.stdout.close()  # as `head -1` does
    assert proc.wait(60) == 0
    assert proc.stderr.read() == b""


def test_job_logs_follow_exits_with_the_jobs_code(cluster):
    job_id = cluster.cli("submit", "--wait", "--", "sh", "-c", "exit 3").stdout.split()[0]
    assert cluster.cli("job", "logs", "-f", job_id).returncode == 3
    assert cluster.cli("job", "logs", job_id).returncode == 0


def test_job_list_filters_and_columns(cluster):
    tag = f"habits{os.getpid()}"
    done = _ok(cluster.cli("submit", "--wait", "--name", f"{tag}-done", "--priority", "7", "--", "sh", "-c",
                           "echo one\necho two")).stdout.split()[0]
    stuck = _ok(cluster.cli("submit", "--name", f"{tag}-stuck", *NOWHERE, "--", "true")).stdout.split()[0]
    other = _ok(cluster.cli("submit", "--name", "unrelated", *NOWHERE, "--", "true")).stdout.split()[0]
    listed = json.loads(_ok(cluster.cli("job", "list", "--name", f"{tag}-*", "--json")).stdout)
    assert [str(j["id"]) for j in listed] == [stuck, done]
    both = json.loads(_ok(cluster.cli("job", "list", "--state", "queued", "--state", "succeeded", "--name",
                                      f"{tag}-*", "--since", "1h", "--json")).stdout)
    assert {j["state"] for j in both} == {"queued", "succeeded"}
    table = _ok(cluster.cli("job", "list", "--name", f"{tag}-*")).stdout.splitlines()
    assert table[0].split() == ["ID", "STATE", "EXIT", "NAME", "PRIO", "WORKER", "ELAPSED", "CREATED", "COMMAND"]
    assert len(table) == 3  # the two-line command stays on its row
    row = next(line for line in table if line.startswith(done))
    assert " 7 " in row and any(name in row.split() for name in cluster.workers) and "0:00:0" in row and "\x1b" not in row  # no colour into a pipe
    assert json.loads(_ok(cluster.cli("job", "list", "--since", "2000-01-01", "--limit", "1", "--json")).stdout)
    assert json.loads(_ok(cluster.cli("job", "list", "--since", "2999-01-01", "--json")).stdout) == []

    cancelled = _ok(cluster.cli("job", "cancel", "--name", f"{tag}-*")).stdout
    assert cancelled.strip() == f"job {stuck} cancelled"  # the finished one is not chosen
    again = cluster.cli("job", "cancel", done, stuck, other)  # as scancel: a job that had ended is an error
    assert again.returncode == 1 and again.stdout.splitlines() == [f"job {other} cancelled"]
    assert again.stderr.splitlines() == [f"Error: job {done} has already ended (succeeded): nothing to cancel",
                                         f"Error: job {stuck} has already ended (cancelled): nothing to cancel"]
    missing = cluster.cli("job", "cancel", "999999", done)
    assert missing.returncode == 1 and "no job 999999" in missing.stderr and "already ended" in missing.stderr


def test_submit_from_a_job_file(cluster):
    (cluster.root / "hello.toml").write_text('command = ["sh", "-c", "echo $GREETING"]\nname = "from-toml"\n'
                                             '[env]\nGREETING = "hello from a file"\n')
    job_id = _ok(cluster.cli("submit", "-f", "hello.toml", "--wait")).stdout.split()[0]
    assert "hello from a file" in _ok(cluster.cli("job", "logs", job_id)).stdout
    assert cluster.job(int(job_id))["name"] == "from-toml"


def test_worker_list_slots_are_used_over_total(cluster):
    job_id = _ok(cluster.cli("submit", "--", "sleep", "60")).stdout.split()[0]
    cluster.wait_job(int(job_id), ("running",), 60)
    rows = _ok(cluster.cli("worker", "list")).stdout.splitlines()
    header = rows[0].split()
    worker = cluster.job(int(job_id))["tasks"][0]["worker_name"]  # w1 (2 slots), or w2 once test_integration_cli added it
    row = next(r.split() for r in rows[1:] if r.split()[1] == worker)
    used, total = row[header.index("SLOTS")].split("/")
    assert total == {"w1": "2", "w2": "1"}[worker] and int(used) >= 1
    _ok(cluster.cli("job", "cancel", job_id))


def test_job_cancel_by_user(cluster):
    tag = f"byuser{os.getpid()}"
    stuck = _ok(cluster.cli("submit", "--name", f"{tag}-1", *NOWHERE, "--", "true")).stdout.split()[0]
    assert _ok(cluster.cli("job", "cancel", "--user", "nobody-such", "--name", f"{tag}-*")).stdout == ""
    assert _state(cluster, int(stuck)) == "queued"
    done = _ok(cluster.cli("job", "cancel", "--user", "admin", "--name", f"{tag}-*")).stdout
    assert done.strip() == f"job {stuck} cancelled"


@pytest.mark.parametrize("cancel", [False, True], ids=["told", "--cancel-on-interrupt"])
def test_ctrl_c_while_the_id_is_printed_is_handled_as_any_other(cluster, monkeypatch, capsys, cancel):
    """^C that lands while `submit --wait` prints the job's id (a loaded machine, a user quick on the keys):
    the job exists, so it is cancelled or its cancel command named, as later; typer alone exits 130 in
    silence and leaves it running unsaid."""
    from gpulayer.cli import main
    from gpulayer.cli import submit as cli_submit

    def printing(job, as_json):
        print(job.id, flush=True)
        raise KeyboardInterrupt  # as the signal handler raises it right after the write

    monkeypatch.setattr(cli_submit, "_print_submitted", printing)
    for name, value in cluster.cli_env().items():
        monkeypatch.setenv(name, value)
    code = main(["submit", "--wait", *(["--cancel-on-interrupt"] if cancel else []), "--", "sleep", "120"])
    out, err = capsys.readouterr()
    job_id = int(out.split()[0])
    assert code == 130
    if cancel:
        assert f"job {job_id} cancelled" in err
        assert cluster.wait_job(job_id, ("cancelled",), 60)["state"] == "cancelled"
    else:
        assert f"gpulayer job cancel {job_id}" in err and f"job {job_id} is still" in err
        _ok(cluster.cli("job", "cancel", str(job_id)))
