"""What a new user found in the CLI (issue 36, items 26 and 28), each step as the user took it: the real
`gpulayer` CLI as a child process against a real control plane process and a real worker process.

`project remove` of a project that holds members and jobs, `job cancel` of an ended job (yours and another's),
a non-owner's `job hold`, `$PORT` in an exec session into a service, a requeue in the job's log,
`job logs` into a closed pipe, `gpulayer sql` on the hash columns, and `job list --format/--no-header` with
sacct's elapsed and CPU time; `gpulayer --help`'s lines, and `up`'s banner, log lines and worker options.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest

from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, free_port, run_cli, wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("newuser"), heartbeat_interval=0.5, lease_ttl=5) as plane:
        plane.start_worker("w1", parallel=4)
        yield plane


def ok(result, code: int = 0):
    assert result.returncode == code, f"exit {result.returncode}\nstdout:{result.stdout}\nstderr:{result.stderr}"
    return result


def user_token(plane, name: str, *projects: str) -> str:
    args = [a for p in projects for a in ("--project", p)]
    return ok(plane.cli("user", "add", name, *args)).stdout.strip()


def submitted(result) -> int:
    return int(ok(result).stdout.split()[0])


def test_project_remove_asks_what_it_holds_and_its_usage_keeps_its_name(plane):
    ok(plane.cli("project", "add", "doomed"))
    carl = user_token(plane, "carl", "doomed")
    submitted(plane.cli("submit", "--project", "doomed", "--wait", "--", "sleep", "0.2", GPULAYER_TOKEN=carl))

    asked = plane.cli("project", "remove", "doomed", input="")  # stdin is no terminal: nobody to answer
    assert asked.returncode == 2, asked
    assert asked.stderr.strip() == ("Error: project doomed holds 1 member (carl) and 1 job: pass --yes to remove it "
                                    "(nothing was changed)"), asked.stderr
    assert "doomed" in [p["name"] for p in json.loads(ok(plane.cli("project", "list", "--json")).stdout)]

    ok(plane.cli("project", "remove", "doomed", "--yes"))
    assert "doomed" not in [p["name"] for p in json.loads(ok(plane.cli("project", "list", "--json")).stdout)]
    rows = json.loads(ok(plane.cli("usage", "--by", "project", "--json")).stdout)["rows"]
    keys = [r["key"] for r in rows]
    assert "doomed" in keys and not [k for k in keys if str(k).startswith("#")], rows
    ok(plane.cli("project", "add", "empty"))
    ok(plane.cli("project", "remove", "empty"))  # holding nothing, it is removed without a question


def test_cancel_of_an_ended_job_is_an_error_yours_or_anothers(plane):
    ok(plane.cli("project", "add", "lab", "--visibility", "project"))
    dana, erin = user_token(plane, "dana", "lab"), user_token(plane, "erin", "lab")
    done = submitted(plane.cli("submit", "--wait", "--", "true", GPULAYER_TOKEN=dana))
    for token in (dana, erin):  # the owner, and a member of its project who may see it
        again = plane.cli("job", "cancel", str(done), GPULAYER_TOKEN=token)
        assert again.returncode == 1, again
        assert again.stderr.strip() == f"Error: job {done} has already ended (succeeded): nothing to cancel"
    assert plane.job(done)["state"] == "succeeded"

    held = submitted(plane.cli("submit", "--hold", "--", "true", GPULAYER_TOKEN=dana))
    refused = plane.cli("job", "hold", str(held), GPULAYER_TOKEN=erin)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"Error: job {held} is not yours: only its owner, the managers of its project "
                                      "and admins may hold it (forbidden)"), refused.stderr
    refused = plane.cli("job", "release", str(held), GPULAYER_TOKEN=erin)
    assert refused.stderr.count(f"job {held}") == 1 and "may release it" in refused.stderr, refused.stderr
    ok(plane.cli("job", "cancel", str(held), GPULAYER_TOKEN=dana))
    again = plane.cli("job", "cancel", str(held), GPULAYER_TOKEN=dana)  # cancelled already: ended, as any other end
    assert again.returncode == 1 and "has already ended (cancelled)" in again.stderr, again


def test_exec_into_a_service_sees_its_port(plane):
    job_id = submitted(plane.cli("submit", "--service", "--name", "web", "--",
                                 "sh", "-c", 'echo "listening on $PORT"; exec python3 -m http.server "$PORT" '
                                             "--bind 127.0.0.1"))
    line = wait_for(lambda: next((ln["text"] for ln in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]
                                  if "listening on" in ln["text"]), None), 60, "the service to start")
    port = line.split()[-1]
    assert port.isdigit(), line
    seen = ok(plane.cli("exec", str(job_id), "--", "sh", "-c", 'echo "PORT=$PORT"'))
    assert seen.stdout.strip() == f"PORT={port}"
    ok(plane.cli("job", "cancel", str(job_id)))


def test_a_requeue_is_logged_as_a_requeue(plane):
    job_id = submitted(plane.cli("submit", "--", "sh", "-c", "echo working; exec sleep 600"))
    wait_for(lambda: any("working" in ln["text"] for ln in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]),
             60, "the job to run")
    ok(plane.cli("job", "requeue", str(job_id)))
    wait_for(lambda: (j := plane.job(job_id))["attempt"] == 2 and j["state"] == "running", 60, "attempt 2")
    system = [ln["text"] for ln in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"] if ln["stream"] == "system"]
    assert any(re.match(r"requeued \(exit code \d+\): this attempt was stopped", t) for t in system), system
    assert not [t for t in system if "cancelled" in t], system
    ok(plane.cli("job", "cancel", str(job_id)))


def test_job_logs_stops_quietly_once_stdout_is_closed(plane):
    """`job logs -f 7 | head -2`: head reads the job's two stdout lines and goes; the job's stderr lines that
    come after must not go on filling the terminal, and the command ends at once, quietly, with 0."""
    job_id = submitted(plane.cli("submit", "--", "sh", "-c",
                                 "echo out1; echo out2; for i in $(seq 60); do echo err$i >&2; sleep 0.1; done"))
    logs = subprocess.Popen([*CLI, "job", "logs", "-f", str(job_id)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(**plane.cli_env()))
    assert [logs.stdout.readline(), logs.stdout.readline()] == ["out1\n", "out2\n"]
    logs.stdout.close()  # what head does once it has its lines
    stderr = logs.stderr.read()
    assert logs.wait(60) == 0
    printed = [line for line in stderr.splitlines() if line.startswith("err")]
    assert len(printed) < 20 and "Traceback" not in stderr, stderr  # those before head went, at most
    assert plane.job(job_id)["state"] == "running"  # it stopped with head, not with the job
    ok(plane.cli("job", "cancel", str(job_id)))


def test_sql_never_prints_the_hash_columns(plane):
    home = str(plane.home)
    stored = [(h.hex() if isinstance(h, bytes) else h).lower()
              for (h,) in plane.sql("SELECT session_hash FROM workers UNION ALL SELECT token_hash FROM tokens") if h]
    assert stored
    for query in ("select session_hash from workers", "select * from workers", "select hex(token_hash) from tokens",
                  "select * from tokens"):
        for fmt in ("--json", "--csv", None):
            out = ok(plane.cli("sql", "--home", home, *([fmt] if fmt else []), query)).stdout
            assert ("workers" not in query or out.strip()) and not [h for h in stored if h[:16] in out.lower()], \
                (query, out)
    kept = json.loads(ok(plane.cli("sql", "--home", home, "--json", "select name from workers")).stdout)
    assert {r["name"] for r in kept} == {"w1"}


def test_job_list_columns_of_the_users_choice_and_sacct_times(plane):
    job_id = submitted(plane.cli("submit", "--cpus", "2", "--name", "timed", "--wait", "--", "sleep", "3"))
    table = ok(plane.cli("job", "list", "--format", "id,state,name,elapsed,cputime", "--no-header")).stdout
    row = next(line.split() for line in table.splitlines() if line.split()[0] == str(job_id))
    assert row[:3] == [str(job_id), "succeeded", "timed"], table
    elapsed, cputime = (_seconds(t) for t in row[3:])
    assert 2 <= elapsed <= 10 and 2 * elapsed - 2 <= cputime <= 2 * elapsed + 2, row  # 2 CPUs: twice the time
    assert not table.startswith("ID")
    header = ok(plane.cli("job", "list", "-o", "name,id")).stdout.splitlines()[0]
    assert header.split() == ["NAME", "ID"]
    bad = plane.cli("job", "list", "--format", "id,bogus")
    assert bad.returncode == 2 and "'bogus' is not a column" in bad.stderr and "cputime" in bad.stderr
    status = ok(plane.cli("job", "status", str(job_id))).stdout
    times = dict(pair.split("=") for pair in status.splitlines()[2].split())
    assert set(times) == {"elapsed", "cpu_time"} and _seconds(times["cpu_time"]) >= 4, status


def _seconds(text: str) -> int:
    h, m, s = (int(p) for p in text.split(":"))
    return h * 3600 + m * 60 + s


def test_help_lines_are_whole_sentences_and_say_what_is_there():
    """`gpulayer --help` lists each command with its summary on one line (typer breaks a summary where its
    docstring does, mid-sentence); `worker start --help` says exec, shell and SSH are refused by --no-exec."""
    import typer
    from gpulayer.cli.app import app

    def broken(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            summary = (sub.help or "").strip().split("\n\n")[0]
            yield from ([" ".join([*path, name])] if "\n" in summary else [])
            yield from broken(sub, [*path, name])
    assert list(broken(typer.main.get_command(app), [])) == []
    shown = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60, env=clean_env(COLUMNS="100"))
    usage = next(line for line in shown.stdout.splitlines() if " usage " in line)
    assert "sreport" in usage and usage.rstrip(" │").endswith("sreport."), shown.stdout
    worker = subprocess.run([*CLI, "worker", "start", "--help"], capture_output=True, text=True, timeout=60,
                            env=clean_env(COLUMNS="100"))
    assert "later" not in worker.stdout and "shell" in worker.stdout, worker.stdout


def test_up_stands_its_banner_out_and_takes_joins_worker_options(tmp_path):
    home, log, err = tmp_path / "home", tmp_path / "up.out", tmp_path / "up.err"
    up = subprocess.Popen([*CLI, "up", "--host", "127.0.0.1", "--port", str(free_port()), "--parallel", "1",
                           "--name", "upw", "--label", "pool=a100", "--label", "team=ml", "--python", sys.executable],
                          env=clean_env(GPULAYER_HOME=str(home), PYTHONUNBUFFERED="1"), stdout=open(log, "w"),
                          stderr=open(err, "w"))
    try:
        wait_for(lambda: up.poll() is not None or "Ctrl-C stops" in log.read_text(), 60, "`up` to print its banner")
        assert up.poll() is None, err.read_text()
        env = {"GPULAYER_HOME": str(home)}
        worker = wait_for(lambda: next(iter(json.loads(run_cli("worker", "list", "--json", env=env).stdout)), None),
                          60, "the local worker")
        assert worker["name"] == "upw" and worker["labels"] == {"pool": "a100", "team": "ml"}, worker
        done = run_cli("submit", "--wait", "--label", "pool=a100", "--", "python", "-c",
                       "import sys; print(sys.executable)", env=env)
        assert done.returncode == 0, done.stderr
        printed = run_cli("job", "logs", done.stdout.split()[0], env=env).stdout.split()
        assert printed == [sys.executable], printed
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0, err.read_text()
    banner, logged = log.read_text().splitlines(), err.read_text().splitlines()
    rules = [i for i, line in enumerate(banner) if set(line) == {"="}]
    join = [line for line in banner if "gpulayer join " in line]
    assert len(rules) == 2 and len(join) == 1 and rules[0] < banner.index(join[0]) < rules[1], banner
    assert not [line for line in logged if " INFO " in line or len(line) > 200], logged  # warnings only


def test_up_refuses_worker_options_without_a_worker(tmp_path):
    refused = run_cli("up", "--no-worker", "--label", "pool=a", "--port", str(free_port()),
                      env={"GPULAYER_HOME": str(tmp_path / "home")})
    assert refused.returncode == 2 and "--no-worker" in refused.stderr and not (tmp_path / "home").exists()
