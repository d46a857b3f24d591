"""`submit --target local`, `gpulayer up` and `gpulayer join`, as a new user runs them."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess

import pytest
from gpulayer.testing import CLI, clean_env, free_port, run_cli, stop_process, wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _needs_server():
    pytest.importorskip("gpulayer.server.process", reason="the control plane (gpulayer.server.process) is not there yet")


def gl(*args, home, timeout=120, **env):
    return run_cli(*args, env={"GPULAYER_HOME": str(home), **env}, timeout=timeout)


def test_local_target_runs_the_job_here_with_its_exit_code(tmp_path):
    home = tmp_path / "home"
    result = gl("submit", "--", "sh", "-c", "echo hi; echo warn >&2; exit 4", home=home)
    assert result.returncode == 4, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].isdigit() and lines[1:] == ["hi"]
    assert "warn" in result.stderr.splitlines()
    again = gl("submit", "--target", "local", "--json", "--", "true", home=home)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["id"] == int(lines[0]) + 1  # the Job as it ended, last
    assert oct((home / "local-tokens.json").stat().st_mode & 0o777) == "0o600"


def test_local_target_outputs_land_here_and_local_jobs_answer_job_commands(tmp_path):
    home, here = tmp_path / "home", tmp_path / "project"
    here.mkdir()
    result = run_cli("submit", "--output", "out/result.txt", "--", "sh", "-c",
                     "mkdir -p out && echo 42 > out/result.txt && echo done",
                     env={"GPULAYER_HOME": str(home)}, cwd=here, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (here / "out" / "result.txt").read_text() == "42\n"
    job_id = result.stdout.split()[0]
    logs = gl("job", "logs", job_id, home=home)
    assert logs.returncode == 0 and "done" in logs.stdout.splitlines(), logs.stderr
    again = gl("job", "outputs", job_id, "--dest", str(tmp_path / "again"), home=home)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "out" / "result.txt").read_text() == "42\n"
    listed = gl("job", "list", "--json", home=home)
    assert [job["state"] for job in json.loads(listed.stdout)] == ["succeeded"]


def test_job_commands_without_a_server_or_local_jobs_say_so(tmp_path):
    result = gl("job", "list", home=tmp_path / "empty")
    assert result.returncode != 0 and "no control plane configured" in result.stderr
    assert "Traceback" not in result.stderr


def test_local_target_refuses_a_home_made_by_server_init(tmp_path):
    home = tmp_path / "home"
    assert gl("server", "init", home=home).returncode == 0
    result = gl("submit", "--", "true", home=home)
    assert result.returncode == 1 and result.stderr.startswith("Error: ")
    assert "server init" in result.stderr and "Traceback" not in result.stderr


def test_up_then_submit_then_join_over_tls(tmp_path):
    home, port = tmp_path / "home", free_port()
    log = open(tmp_path / "up.log", "w")
    up = subprocess.Popen([*CLI, "up", "--host", "127.0.0.1", "--port", str(port), "--parallel", "2"],
                          env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"),
                          stdout=log, stderr=subprocess.STDOUT)
    joined = None
    try:
        join_line = wait_for(lambda: _join_line(tmp_path / "up.log", up), 60, "`up` to print its join line")
        saved = json.loads((home / "client.json").read_text())
        assert saved["url"] == f"https://127.0.0.1:{port}" and saved["token"].startswith("glc_")
        assert oct((home / "client.json").stat().st_mode & 0o777) == "0o600"
        first = gl("submit", "--wait", "--", "echo", "hello", home=home)
        assert first.returncode == 0, first.stderr
        assert "hello" in gl("job", "logs", first.stdout.split()[0], home=home).stdout.splitlines()

        words = shlex.split(join_line)
        assert words[0].startswith("GPULAYER_JOIN_TOKEN=glj_") and "--token" not in words  # not in `ps`
        token = words[0].partition("=")[2]
        argv = words[2:] + ["--name", "second", "--label", "box=second", "--state-dir", str(tmp_path / "second")]
        joined = subprocess.Popen([*CLI, *argv], env=clean_env(GPULAYER_HOME=str(tmp_path / "other-home"),
                                                               GPULAYER_JOIN_TOKEN=token),
                                  stdout=open(tmp_path / "join.log", "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: _online(home, "second"), 60, "the joined worker to be online")
        there = gl("submit", "--wait", "--label", "box=second", "--", "echo", "remote", home=home)
        assert there.returncode == 0, there.stderr
        status = json.loads(gl("job", "status", there.stdout.split()[0], "--json", home=home).stdout)
        workers = {w["id"]: w["name"] for w in json.loads(gl("worker", "list", "--json", home=home).stdout)}
        assert workers[status["tasks"][0]["worker_id"]] == "second"
    finally:
        codes = [stop_process(joined)] if joined else []
        codes.append(stop_process(up))
        assert codes == [0] * len(codes), (tmp_path / "up.log").read_text()


def _join_line(path, proc):
    if proc.poll() is not None:
        raise AssertionError(f"`up` exited {proc.returncode}:\n{path.read_text()}")
    lines = [ln.strip() for ln in path.read_text().splitlines() if " gpulayer join " in ln]
    return lines[0] if lines else None


def _online(home, name):
    answer = gl("worker", "list", "--json", home=home)
    return answer.returncode == 0 and any(w["name"] == name and w["state"] == "online"
                                          for w in json.loads(answer.stdout))


def test_readme_quick_start_as_a_new_user(tmp_path):
    """README "Quick start": `gpulayer up` in one shell; `gpulayer submit --wait -- echo hello` and
    `gpulayer job logs 1` in a second one with nothing set but HOME; Ctrl-C stops `up` cleanly."""
    gpulayer = shutil.which("gpulayer")
    if gpulayer is None:
        pytest.skip("the `gpulayer` command is not installed (pip install -e .)")
    shell = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}  # a new user: default ~/.gpulayer
    port = free_port()
    log = open(tmp_path / "up.log", "w")
    up = subprocess.Popen([gpulayer, "up", "--port", str(port)], env=shell, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _join_line(tmp_path / "up.log", up), 60, "`up` to print its join line")
        assert (tmp_path / ".gpulayer" / "client.json").exists()

        def second_shell(*args):
            return subprocess.run([gpulayer, *args], env=shell, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=60)
        hello = second_shell("submit", "--wait", "--", "echo", "hello")
        assert hello.returncode == 0, hello.stderr + (tmp_path / "up.log").read_text()
        assert hello.stdout.splitlines()[0] == "1", "a new home's first job is job 1, as the README says"
        logs = second_shell("job", "logs", "1")
        assert logs.returncode == 0 and "hello" in logs.stdout.splitlines(), logs.stderr
    finally:
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(30)
        except subprocess.TimeoutExpired:
            code = stop_process(up)
    output = (tmp_path / "up.log").read_text()
    assert code == 0 and "Traceback" not in output, output


def test_up_no_worker_tells_a_waiting_job_and_warns_a_namesake(tmp_path):
    """`up --no-worker` runs no worker: a job waits and `submit --wait` says why; the banner's
    example follows the output; a second worker joining with an online worker's name is warned."""
    home, port = tmp_path / "home", free_port()
    up = subprocess.Popen([*CLI, "up", "--no-worker", "--host", "127.0.0.1", "--port", str(port)],
                          env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"),
                          stdout=open(tmp_path / "up.log", "w"), stderr=subprocess.STDOUT)
    joined = []
    try:
        words = shlex.split(wait_for(lambda: _join_line(tmp_path / "up.log", up), 60, "`up` to print its join line"))
        banner = (tmp_path / "up.log").read_text()
        assert "no local worker" in banner and "gpulayer submit --follow -- echo hello" in banner
        waiting = subprocess.Popen([*CLI, "submit", "--wait", "--", "echo", "hello"],
                                   env=clean_env(GPULAYER_HOME=str(home)), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        assert waiting.stderr.readline() == "waiting: no online worker\n"

        token = words[0].partition("=")[2]
        for n in (1, 2):
            argv = words[2:] + ["--name", "twin", "--state-dir", str(tmp_path / f"twin{n}")]
            joined.append(subprocess.Popen([*CLI, *argv], env=clean_env(GPULAYER_HOME=str(tmp_path / f"h{n}"),
                                                                        GPULAYER_JOIN_TOKEN=token),
                                           stdout=open(tmp_path / f"join{n}.log", "w"), stderr=subprocess.STDOUT))
            wait_for(lambda n=n: "worker_registered" in (tmp_path / f"join{n}.log").read_text(), 60, f"join {n}")
        assert waiting.wait(60) == 0  # a worker came: the job ran
        assert "register_warning" not in (tmp_path / "join1.log").read_text()
        second = wait_for(lambda: (text := (tmp_path / "join2.log").read_text()) and "register_warning" in text and text,
                          30, "the second twin's warning")
        assert "a worker named 'twin' is online already" in second
        events = gl("sql", "--home", str(home), "--json", "SELECT kind FROM events WHERE kind = 'worker_name_in_use'",
                    home=home)
        assert len(json.loads(events.stdout)) == 1, events.stderr
    finally:
        codes = [stop_process(p) for p in joined]
        codes.append(stop_process(up))
        assert codes == [0] * len(codes), (tmp_path / "up.log").read_text()


@pytest.mark.parametrize("asks, says", [
    (["--gpus", "1"], "this machine has 0 GPUs; the job asks for 1 GPU"),
    (["--accelerator", "cuda"], "this machine has 0 GPUs; the job asks for 1 GPU"),
    (["--nodes", "2"], "this machine has 1 node; the job asks for 2 nodes"),
    (["--memory-mb", str(1 << 40)], "MB of memory; the job asks for"),
    (["--label", "pool=a100"], "this machine's worker has no label pool=a100"),
])
def test_local_target_refuses_at_once_what_this_machine_can_never_run(tmp_path, asks, says):
    """Issue 22 item 14: a local run's only worker is this machine (its GPUs as the probe says:
    GPULAYER_WORKER_GPUS=0 here); a job it can never run is refused (exit 2), not left waiting, and no job is made."""
    home = tmp_path / "home"
    result = gl("submit", *asks, "--", "echo", "never", home=home, timeout=60, GPULAYER_WORKER_GPUS="0")
    assert result.returncode == 2, result
    assert result.stderr.startswith("Error: ") and says in result.stderr and "--target local" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    listed = gl("job", "list", "--json", home=home)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    fits = gl("submit", "--gpus", "1", "--", "echo", "fits", home=home, timeout=60, GPULAYER_WORKER_GPUS="1")
    assert fits.returncode == 0 and fits.stdout.splitlines()[1:] == ["fits"], fits.stderr


def test_join_and_worker_start_keep_their_state_in_gpulayer_home_apart_from_ups_worker(tmp_path):
    """Issue 22 item 20: `join` (and `worker start`) with no --state-dir pin the CA and run tasks under
    $GPULAYER_HOME/workers/NAME, never in ~/.gpulayer/worker, and so never share `up`'s worker's running/."""
    home, port, fake_home = tmp_path / "home", free_port(), tmp_path / "user"
    fake_home.mkdir()
    up = subprocess.Popen([*CLI, "up", "--host", "127.0.0.1", "--port", str(port), "--parallel", "1"],
                          env=clean_env(GPULAYER_HOME=str(home), HOME=str(fake_home), PYTHONUNBUFFERED="1"),
                          stdout=open(tmp_path / "up.log", "w"), stderr=subprocess.STDOUT)
    joined = []
    try:
        words = shlex.split(wait_for(lambda: _join_line(tmp_path / "up.log", up), 60, "`up` to print its join line"))
        token = words[0].partition("=")[2]
        for name, argv, where in [
            ("second", [*words[2:], "--name", "second", "--label", "box=second"], home),  # `up`'s home: its own folder
            # `worker start` against a port nothing listens on: it makes its state dir, then retries
            ("third", ["--url", f"http://127.0.0.1:{free_port()}", "worker", "start", "--name", "third"],
             tmp_path / "other"),
        ]:
            joined.append(subprocess.Popen([*CLI, *argv], env=clean_env(GPULAYER_HOME=str(where), HOME=str(fake_home),
                                                                        GPULAYER_JOIN_TOKEN=token),
                                           stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT))
        wait_for(lambda: _online(home, "second"), 60, "the joined worker to be online")
        assert (home / "workers" / "second" / "ca.pem").is_file()  # the CA pinned by --ca-fingerprint
        ran = gl("submit", "--label", "box=second", "--follow", "--", "pwd", home=home, HOME=str(fake_home))
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines()[1].startswith(str(home / "workers" / "second" / "tasks") + "/"), ran.stdout
        wait_for(lambda: (tmp_path / "other" / "workers" / "third").is_dir(), 60, "`worker start`'s state dir")
        assert not (fake_home / ".gpulayer").exists()
    finally:
        codes = [stop_process(p) for p in joined]
        codes.append(stop_process(up))
        assert codes[-1] == 0, (tmp_path / "up.log").read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_a_local_job_dies_with_its_command_and_the_next_run_ends_what_was_left(tmp_path, sig):
    """Issue 22 item 13: SIGTERM, SIGHUP (a closed terminal) or SIGKILL of `submit --target local` ends the
    task's processes (its child too, which no signal of the CLI reaches), and the next local run shows the
    job ended and is not told that its worker's name is online already."""
    import uuid

    from gpulayer.testing import host_pids, pid_alive
    home, marker = tmp_path / "home", f"local-child-{uuid.uuid4().hex}"  # a sandboxed task's pids: from outside
    run = subprocess.Popen([*CLI, "submit", "--", "sh", "-c", f'sh -c "sleep 300; : {marker}" & echo up; wait'],
                           env=clean_env(GPULAYER_HOME=str(home)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    job_id = run.stdout.readline().strip()
    assert run.stdout.readline() == "up\n", run.stderr.read() if run.poll() is not None else ""
    task = host_pids(marker)  # the task's shell and its child (and the sandbox's bwrap)
    assert task
    run.send_signal(sig)
    assert run.wait(60) == (128 + sig if sig != signal.SIGKILL else -sig), run.stderr.read()
    wait_for(lambda: not any(pid_alive(pid) for pid in task), 30, "the task's child to be gone")
    after = gl("submit", "--", "echo", "next", home=home, timeout=60)
    assert after.returncode == 0 and after.stdout.splitlines()[1:] == ["next"], after.stderr
    assert "online already" not in after.stderr
    assert ("earlier `--target local` run" in after.stderr) == (sig == signal.SIGKILL), after.stderr
    jobs = {str(j["id"]): j["state"] for j in json.loads(gl("job", "list", "--json", home=home).stdout)}
    assert jobs[job_id] == "cancelled" and list(jobs.values()).count("succeeded") == 1, jobs
