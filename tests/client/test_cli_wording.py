"""Issue 22 item 23, wording and habits, against a real control plane and worker (and in-process where the
CLI alone decides): a job that did not succeed ends `submit --wait`, `submit --follow` and `job logs -f` with a
line saying why; every duration option takes the same forms; counts agree with their nouns; a worker's name
means its online registration, not an offline namesake."""
from __future__ import annotations

import json
import subprocess

import pytest

from gpulayer.cli import main
from gpulayer.protocol import DURATION_FORMS, parse_duration, plural
from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    with ControlPlaneProcess(tmp_path_factory.mktemp("wording"), heartbeat_interval=0.3, lease_ttl=2) as plane:
        plane.start_worker("w1", parallel=4)
        yield plane


@pytest.fixture
def as_user(plane, monkeypatch):
    """The environment of a CLI user of `plane`, for `main([...])` in this process."""
    for name, value in plane.cli_env().items():
        monkeypatch.setenv(name, value)


def _popen(plane, *args, **env):
    """`gpulayer ARGS` as a user of `plane`, started now (it waits while the test goes on)."""
    return subprocess.Popen([*CLI, *args], env=clean_env(**plane.cli_env(**env)), cwd=plane.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _submitted(proc) -> int:
    """The job id `submit` prints on its first line."""
    return int(proc.stdout.readline())


def _failing_dependency(plane, seconds: float = 3.0) -> int:
    return plane.submit({"command": ["sh", "-c", f"sleep {seconds}; exit 3"], "name": "dep"})


@pytest.mark.parametrize("how", ["--wait", "--follow"])
def test_submit_waiting_on_a_dependency_that_fails_says_why_it_ended(plane, how):
    dep = _failing_dependency(plane)
    proc = _popen(plane, "submit", how, "--after", str(dep), "--", "echo", "never")
    job = _submitted(proc)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)  # a cancelled job has no exit code: 1 (docs/cli.md, "Exit status")
    assert f"job {job} cancelled: its dependency job {dep} failed (dependency_failed)\n" in err, err
    assert "never" not in out


def test_job_logs_follow_says_why_it_ended(plane):
    dep = _failing_dependency(plane)
    job = plane.submit({"command": ["echo", "never"], "after": [f"{dep}:ok"]})
    done = plane.cli("job", "logs", "-f", str(job), timeout=60)
    assert done.returncode == 1, done
    assert done.stderr.endswith(f"job {job} cancelled: its dependency job {dep} failed (dependency_failed)\n"), done


def test_a_dependency_that_succeeded_against_notok_is_told_so(plane):
    dep = plane.submit({"command": ["true"]})
    plane.wait_job(dep)
    done = plane.cli("submit", "--wait", "--after", f"{dep}:notok", "--", "true", timeout=60)
    job = int(done.stdout.split()[0])
    assert done.returncode == 1 and done.stderr.endswith(
        f"job {job} cancelled: its dependency job {dep} succeeded, and it runs after {dep}:notok "
        "(dependency_failed)\n"), done


def test_a_failed_job_says_its_exit_code_and_a_good_one_says_nothing(plane):
    failed = plane.cli("submit", "--wait", "--", "sh", "-c", "exit 3", timeout=60)
    job = int(failed.stdout.split()[0])
    assert failed.returncode == 3 and failed.stderr.endswith(f"\njob {job} failed: exit code 3\n"[1:]), failed
    good = plane.cli("submit", "--wait", "--json", "--", "true", timeout=60)
    assert good.returncode == 0 and good.stderr == "", good
    assert json.loads(good.stdout)["state"] == "succeeded"


def test_job_logs_follow_of_an_element_says_why_that_element_ended(plane):
    job = plane.submit({"command": ["sh", "-c", '[ "$GPULAYER_ARRAY_INDEX" = 1 ] && exit 3; exit 0'], "array": "0-1"})
    failed = plane.cli("job", "logs", "-f", str(job), "--index", "1", timeout=60)
    assert failed.returncode == 3 and failed.stderr.endswith(f"job {job} element 1 failed: exit code 3\n"), failed
    good = plane.cli("job", "logs", "-f", str(job), "--index", "0", timeout=60)
    assert good.returncode == 0 and "element" not in good.stderr, good


def test_a_hidden_dependency_is_named_as_hidden(plane):
    """carl may read job B (its project shows members' jobs) but not B's dependency A, in bob's own
    project: the line names A as hidden and tells nothing of how it ended (issue 22 item 7)."""
    with plane.client() as admin:
        admin.add_project("solo", visibility="private")
        admin.add_project("shared", visibility="project")
        bob = admin.add_user("bob", projects=[("solo", "member"), ("shared", "member")])["token"]
        carl = admin.add_user("carl", projects=[("shared", "member")])["token"]
    first = plane.cli("submit", "--project", "solo", "--", "sh", "-c", "sleep 3; exit 3", GPULAYER_TOKEN=bob)
    dep = int(first.stdout.split()[0])
    second = plane.cli("submit", "--project", "shared", "--after", str(dep), "--", "true", GPULAYER_TOKEN=bob)
    job = int(second.stdout.split()[0])
    done = plane.cli("job", "logs", "-f", str(job), timeout=60, GPULAYER_TOKEN=carl)
    assert done.returncode == 1, done
    assert done.stderr.endswith(f"job {job} cancelled: its dependency job {dep} (hidden: you may not see it) "
                                f"did not end as {dep}:ok asks (dependency_failed)\n"), done
    assert f"job {dep} failed" not in done.stderr and "exit code" not in done.stderr


@pytest.mark.parametrize("text,seconds", [
    ("90", 90), ("1.5", 1.5), ("45s", 45), ("30m", 1800), ("12h", 43200), ("365d", 365 * 86400),
    ("2w", 14 * 86400), ("1:30", 90), ("1:00:00", 3600), ("48:00:00", 172800), ("2-00:00:00", 172800),
    ("2-3", 2 * 86400 + 3 * 3600), ("2-3:30", 2 * 86400 + 3 * 3600 + 1800), ("0", 0),
])
def test_one_duration_parser_reads_every_form(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1h30m", "1y", "-5", "1:60", "1-24", "2-3:60", "1:2:3:4", "", "inf", "1e5"])
def test_a_bad_duration_names_the_forms(text):
    with pytest.raises(ValueError, match="is not a duration: write it as seconds"):
        parse_duration(text)


# Each duration option, as a user would type it. `submit --timeout 1h` once said "'1h' is not a valid float".
DURATION_OPTIONS = [
    ["submit", "--dry-run", "--timeout", "{d}", "--silence-timeout", "{d}", "--", "true"],
    ["job", "list", "--since", "{d}"],
    ["job", "cancel", "--name", "none-such", "--since", "{d}"],
    ["usage", "--since", "{d}"],
    ["token", "create", "--name", "t", "--expires", "{d}", "--json"],
    ["worker", "drain", "w1", "--reason", "x", "--timeout", "{d}"],
    ["server", "prune", "--dry-run", "--log-retention", "{d}", "--job-retention", "{d}", "--gpu-sample-retention", "{d}",
     "--home", "{home}"],
]


@pytest.mark.parametrize("args", DURATION_OPTIONS, ids=[" ".join(a[:3]) for a in DURATION_OPTIONS])
@pytest.mark.parametrize("duration", ["1h", "1:00:00", "0-01:00:00"])
def test_every_duration_option_takes_the_same_forms(plane, args, duration, as_user, capsys):
    """In this process (the CLI alone parses; the requests go to the real plane): 21 CLI starts saved."""
    code = main([a.format(d=duration, home=plane.home) for a in args])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    if args[0] == "submit":
        spec = json.loads(out)
        assert spec["timeout_seconds"] == spec["silence_timeout_seconds"] == 3600
    if args[:2] == ["worker", "drain"]:
        assert main(["worker", "uncordon", "w1"]) == 0


@pytest.mark.parametrize("args", DURATION_OPTIONS, ids=[" ".join(a[:3]) for a in DURATION_OPTIONS])
def test_a_bad_duration_is_one_error_line_naming_the_option(plane, args, as_user, capsys):
    code = main([a.format(d="1y", home=plane.home) for a in args])
    _, err = capsys.readouterr()
    option = next(a for a, b in zip(args, args[1:]) if b == "{d}")
    assert code == 2, err
    assert err.startswith(f"Error: Invalid value for {option}: '1y' is not a duration") \
        and DURATION_FORMS in err and err.count("\n") == 1, err
    assert plane.sql("SELECT count(*) FROM worker_cordons") == [(0,)]


@pytest.mark.parametrize("args", [
    ["server", "start", "--lease-ttl", "1y"], ["server", "start", "--heartbeat-interval", "0"],
    ["server", "start", "--preempt-grace", "1y"], ["server", "start", "--fairshare-half-life", "1y"],
    ["up", "--replicate-interval", "1y"], ["worker", "start", "--max-idle", "1y"],
    ["join", "https://127.0.0.1:1", "--drain-timeout", "1y"],
])
def test_the_server_and_worker_durations_refuse_alike(args, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"Error: Invalid value for {args[-2]}: ") and err.count("\n") == 1, err
    assert not (tmp_path / "state.db").exists()


def test_the_servers_since_takes_the_same_forms_and_refuses_naming_the_field(plane):
    assert plane.request("GET", "/v1/usage?since=2-00:00:00").status_code == 200
    bad = plane.request("GET", "/v1/usage?since=1y")
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("since: '1y' is not a duration")


def test_a_job_file_takes_a_duration_as_text(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text('command = ["true"]\ntimeout_seconds = "1:30:00"\nsilence_timeout_seconds = "10m"\n')
    assert main(["submit", "-f", str(path), "--dry-run"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert (spec["timeout_seconds"], spec["silence_timeout_seconds"]) == (5400, 600)
    path.write_text('command = ["true"]\ntimeout_seconds = "1 hour"\n')
    assert main(["submit", "-f", str(path), "--dry-run"]) == 2
    assert "timeout_seconds: '1 hour' is not a duration" in capsys.readouterr().err


def test_counts_agree_with_their_nouns():
    assert [plural(1, "GPU"), plural(2, "GPU"), plural(0.5, "CPU"), plural(1.0, "running job"),
            plural(3, "entry", "entries"), plural(1_000_000, "job")] == \
        ["1 GPU", "2 GPUs", "0.5 CPUs", "1 running job", "3 entries", "1000000 jobs"]


def test_a_name_means_the_online_worker_not_its_offline_namesake(plane):
    """A machine that rejoins after a crash (SIGKILL) leaves its old registration offline under its name:
    `worker cordon NAME` answered `2 live workers are named 'w2'` (409) as if both were live."""
    first = plane.start_worker("w2")
    first.kill()
    wait_for(lambda: any(w["name"] == "w2" and w["state"] == "offline"
                         for w in plane.get_json("/v1/workers")["workers"]), 20, "w2 to go offline")
    del plane.workers["w2"]
    rejoined = plane.start_worker("w2")
    online = plane.online_worker("w2")
    try:
        done = plane.cli("worker", "cordon", "w2", "--reason", "fan")
        assert done.returncode == 0 and done.stdout == f"worker w2 (id {online['id']}): cordoned: fan\n", done
        assert plane.sql("SELECT worker_id FROM worker_cordons") == [(online["id"],)]
        assert plane.cli("worker", "uncordon", "w2").returncode == 0
    finally:
        rejoined.stop()
