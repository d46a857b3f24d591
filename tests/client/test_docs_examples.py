"""Every code block of README.md and docs/cli.md: run as written, in sequence, or listed as not run and why.

The blocks are read from the markdown files, so an edit of the docs is tested. A block is named by its
file, the heading it sits under and its place there ("docs/cli.md > gpulayer submit #3"). RUN names the
test that runs each block (here, or `file::test` elsewhere); NOT_RUN says why a block is not run and
what checks it instead. test_every_block_is_run_or_listed fails on a block in neither, so a new block
is run or listed.

The blocks run against real processes: a TLS control plane (`plane`) with one worker `w1`, a
`--target local` run on a fresh home, and a `server certs`/`server start` in a fresh $HOME. Lines run
through `sh` with `gpulayer` on PATH (this checkout's CLI), in a folder holding the files they name
(train.py; train.toml and ca.pem are written there from the docs). Only what cannot be literal is
substituted, each where it happens (`_substituted`):

- the control plane's URL (`https://10.0.0.5:8470`, `https://cp.internal:8470`, `https://cp:8470`) by
  the test's, and `--port 8470` (or no --port: the same default) by a free port: tests run side by side;
- placeholder tokens by real ones: `glj_...` by the plane's join token, `glc_...` by the token that
  the block's own `gpulayer user add bob` printed;
- `--ca-fingerprint sha256:...` by the fingerprint of the plane's CA;
- a job id in an output sample (`job 27`) by the id the run made.

Where a line names no control plane (`gpulayer submit ...`, `gl.connect()`), GPULAYER_URL,
GPULAYER_TOKEN and GPULAYER_CA_FILE say which, as README.md says they may. `w1` advertises 2 GPUs
(`--gpus 2`) the machine need not have: the examples ask for `gpus 1` but run `python train.py`,
which uses none. Tests here run in order and share `plane`: the usage sample sums the runs of the
README's team block (project ml) and of the others (default).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

import pytest
import requests
import typer

from gpulayer.cli.app import app
from gpulayer.testing import CLI, ControlPlaneProcess, clean_env, free_port, wait_for
from terminal import Terminal

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
FILES = ("README.md", "docs/cli.md")
TRAIN_PY = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/model.txt', 'w').write('trained')\nprint('epochs', os.environ.get('EPOCHS'))\n"
SYNOPSIS = "a synopsis, not an example: test_synopses_name_real_options checks its command and options"

RUN = {
    "README.md > Quick start #1": "test_readme_install_and_test_commands_name_what_exists",
    "README.md > Quick start #2": "test_readme_install_and_test_commands_name_what_exists",
    "README.md > Developing #1": "test_readme_fast_loop_commands_name_what_exists",
    "README.md > Quick start #3": "test_readme_quickstart.py::test_readme_quick_start_runs_as_written",
    "README.md > Quick start #4": "test_join_lines_run_against_a_real_control_plane",
    "README.md > From Python #1": "test_readme_python_snippet_runs_as_written",
    "README.md > From scripts, with plain `requests` #1": "test_readme_requests.py::test_readme_requests_snippet_runs_as_written",
    "README.md > For a team #1": "test_readme_team_block_runs_as_written",
    "docs/cli.md > gpulayer submit #2": "test_ctrl_c_sample_is_what_submit_wait_says",
    "docs/cli.md > gpulayer submit #3": "test_job_file_blocks_run_as_written",
    "docs/cli.md > gpulayer submit #4": "test_job_file_blocks_run_as_written",
    "docs/cli.md > gpulayer submit #5": "test_local_then_remote_submit_run_as_written",
    "docs/cli.md > gpulayer worker start #1": "test_worker_start_block_runs_as_written",
    "docs/cli.md > gpulayer join #1": "test_join_lines_run_against_a_real_control_plane",
    "docs/cli.md > gpulayer secret set #1": "test_secret_set_block_runs_as_written",
    "docs/cli.md > gpulayer up #2": "test_join_lines_run_against_a_real_control_plane",
    "docs/cli.md > gpulayer usage #1": "test_usage_sample_is_what_usage_prints",
    "docs/cli.md > gpulayer server start #1": "test_server_certs_then_start_run_as_written",
    "docs/cli.md > gpulayer server certs #2": "test_server_certs_then_start_run_as_written",
}
NOT_RUN = {
    "docs/cli.md > gpulayer webhook add #1": (
        "needs a receiver on a public address: tests/integration/test_notify_e2e.py adds one on loopback "
        "(--allow-private-webhooks) and checks every delivery's signature"),
    "docs/cli.md > gpulayer alert add #1": (
        "needs a webhook: tests/integration/test_notify_e2e.py adds an alert with the CLI and reads its mail; "
        "tests/api/test_webhooks_alerts.py fires one once per new row"),
    "docs/cli.md > gpulayer job outputs #1": (
        "needs a job with checkpoints: tests/integration/test_checkpoint_resume.py runs `job outputs --checkpoint` "
        "after a worker in another namespace resumed one"),
    "docs/cli.md > gpulayer job checkpoints #1": (
        "needs a job with checkpoints: tests/integration/test_checkpoint_resume.py runs `job checkpoints`"),
    "docs/cli.md > gpulayer submit #1": SYNOPSIS,
    "docs/cli.md > gpulayer port-forward #1": SYNOPSIS,
    "docs/cli.md > gpulayer port-forward #2": (
        "needs a running job whose task listens: tests/integration/test_relay_forward.py runs port-forward "
        "through a worker behind a NAT"),
    "docs/cli.md > gpulayer ssh-config #1": SYNOPSIS,
    "docs/cli.md > gpulayer ssh-config #2": (
        "ssh and scp against a running job of a real control plane with the printed block: "
        "tests/integration/test_relay_ssh.py runs the same (commands, exit codes, scp, rsync, ssh -L)"),
    "docs/cli.md > gpulayer ssh-proxy #1": SYNOPSIS,
    "docs/cli.md > gpulayer job status #1": (
        "an output sample of a 3,000-element array caught part-way (3 failed at given indices, 16 running, "
        "172 held): not made for real; test_array_status_sample_is_what_job_status_prints renders a Job "
        "with its counts"),
    "docs/cli.md > gpulayer job status #2": (
        "an output sample of a running task's GPU lines: test_gpu_lines_sample_is_what_job_status_prints renders "
        "them; tests/integration/test_gpu_telemetry.py reads them from a real worker's fake NVML"),
    "docs/cli.md > gpulayer job cancel #1": SYNOPSIS,
    "docs/cli.md > gpulayer job hold #1": SYNOPSIS,
    "docs/cli.md > gpulayer job release #1": SYNOPSIS,
    "docs/cli.md > gpulayer job requeue #1": SYNOPSIS,
    "docs/cli.md > gpulayer job update #1": SYNOPSIS,
    "docs/cli.md > gpulayer job wait #1": SYNOPSIS,
    "docs/cli.md > gpulayer service update #1": SYNOPSIS,
    "docs/cli.md > gpulayer service update #2": "needs a running service and its workers: tests/integration/test_rolling_updates.py runs it",
    "docs/cli.md > gpulayer service promote #1": SYNOPSIS,
    "docs/cli.md > gpulayer service rollback #1": SYNOPSIS,
    "docs/cli.md > gpulayer service status #1": SYNOPSIS,
    "docs/cli.md > gpulayer job list #1": SYNOPSIS,
    "docs/cli.md > gpulayer up #1": SYNOPSIS,
    "docs/cli.md > gpulayer server certs #1": SYNOPSIS,
    "docs/cli.md > gpulayer server restore #1": SYNOPSIS,
    "docs/cli.md > gpulayer sql #1": SYNOPSIS,
    "docs/cli.md > gpulayer policy replay #1": SYNOPSIS,
    "docs/cli.md > gpulayer image list #1": SYNOPSIS,
    "docs/cli.md > gpulayer exec #1": SYNOPSIS,
    "docs/cli.md > gpulayer exec #2": (
        "examples against a running job of a real control plane: tests/integration/test_relay_exec.py runs "
        "the same (exit codes, stdin piped to cat, --index)"),
    "docs/cli.md > gpulayer shell #1": SYNOPSIS,
    "docs/cli.md > gpulayer shell #2": (
        "an interactive session against a running job of a real control plane: tests/integration/test_relay_shell.py "
        "drives the same in a pseudo-terminal (typed commands, ^C, ^Z, exit 7, a command instead of the shell)"),
}


class Block(NamedTuple):
    key: str  # "FILE > HEADING #N", N counted from 1 under that heading
    lang: str
    text: str


def _blocks(name: str) -> list[Block]:
    """The fenced code blocks of ROOT/name, each named by the heading above it."""
    heading, seen, found = "", {}, []
    text = (ROOT / name).read_text()
    for m in re.finditer(r"^(#+) ([^\n]+)$|^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        if m.group(1):
            heading = m.group(2).strip()
            continue
        seen[heading] = seen.get(heading, 0) + 1
        found.append(Block(f"{name} > {heading} #{seen[heading]}", m.group(3), m.group(4)))
    return found


BLOCKS = {b.key: b for name in FILES for b in _blocks(name)}


def block(key: str) -> str:
    """The text of a block that RUN says a test runs."""
    assert key in RUN, f"{key} is not in RUN"
    return BLOCKS[key].text


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block (`$ command` lines, then what it prints) as (command, its output lines)."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"output before any command: {line!r}"
            steps[-1][1].append(line)
    return steps


def _substituted(line: str, **values: str) -> str:
    """`line` with each placeholder given replaced, asserting that it was there (see the docstring)."""
    for placeholder, value in values.items():
        placeholder = {"join_token": "glj_...", "client_token": "glc_...",
                       "fingerprint": "sha256:...", "port": "--port 8470"}.get(placeholder, placeholder)
        assert placeholder in line, f"no {placeholder!r} in {line!r}"
        line = line.replace(placeholder, value)
    return line


def _sh(line: str, cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """`sh -ec line`, which must exit 0."""
    done = subprocess.run(["sh", "-ec", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"`{line}` exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _same_shape(expected: str, actual: str) -> bool:
    """`actual` is `expected` with other numbers, dates and times: every other word is the same."""
    ours, theirs = expected.split(), actual.split()
    numeric = re.compile(r"[\d.:-]+")
    return len(ours) == len(theirs) and all(
        numeric.fullmatch(a) and numeric.fullmatch(b) if numeric.fullmatch(a) else a == b for a, b in zip(ours, theirs))


def _background(line: str, cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """`sh -c line` in a session of its own (stop it with _stop), its output in `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(["sh", "-c", line], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(proc: subprocess.Popen, log: Path) -> None:
    """SIGTERM to the whole session (the shell and the gpulayer it started); both gone within 30 s."""
    if _session_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
        wait_for(lambda: not _session_alive(proc.pid), 30, "the session to end", details=log.read_text)
    except BaseException:
        if _session_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        raise


def _session_alive(sid: int) -> bool:
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return False
    return True


# -- the fixtures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlaneProcess(tmp_path_factory.mktemp("docs-plane"), tls=True)
    plane.init()
    # The CA where `server start` serves it (GET /v1/ca.pem, what `join --ca-fingerprint` fetches), as
    # `up` and `server certs` leave it; ControlPlaneProcess keeps its TLS files beside the home.
    (plane.home / "tls").mkdir()
    shutil.copy(plane.ca_file, plane.home / "tls" / "ca.pem")
    with plane:
        plane.start_worker("w1", parallel=4, gpus=2)
        yield plane


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The folder the examples run in: what they name (train.py) is there."""
    here = tmp_path_factory.mktemp("project")
    (here / "train.py").write_text(TRAIN_PY)
    return here


@pytest.fixture
def env(plane, gpulayer_path):
    """A shell's environment: `gpulayer` on PATH, the plane's URL, token and CA in GPULAYER_*."""
    return clean_env(**plane.cli_env(), PATH=gpulayer_path)


def _new_workers(plane, known: set[int]) -> list[dict]:
    return [w for w in plane.get_json("/v1/workers")["workers"] if w["state"] == "online" and w["id"] not in known]


# -- README.md ----------------------------------------------------------------------------


def test_every_block_is_run_or_listed():
    assert not set(RUN) & set(NOT_RUN)
    unlisted = set(BLOCKS) - set(RUN) - set(NOT_RUN)
    assert not unlisted, f"blocks neither run (RUN) nor listed with a reason (NOT_RUN): {sorted(unlisted)}"
    gone = (set(RUN) | set(NOT_RUN)) - set(BLOCKS)
    assert not gone, f"RUN/NOT_RUN name blocks the docs no longer have: {sorted(gone)}"
    for test in set(RUN.values()):
        module, _, name = test.rpartition("::")
        source = (Path(__file__).parent / module).read_text() if module else Path(__file__).read_text()
        assert f"\ndef {name}(" in source, f"RUN names {test}, which does not exist"


def test_readme_install_and_test_commands_name_what_exists():
    """Not run (one installs and serves until Ctrl-C, the other is the whole suite): what they name
    exists. `gpulayer up` itself runs in tests/client/test_integration_up.py, `scripts/test` in CI."""
    install, test = block("README.md > Quick start #1"), block("README.md > Quick start #2")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docs = (ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()
    for extras in re.findall(r"(?:gpulayer|\.)\[([\w,]+)\]", docs):  # '.[server]', 'gpulayer[granian]'
        for extra in extras.split(","):
            assert extra in project["optional-dependencies"], f"no extra {extra!r} in pyproject.toml"
    assert "pip install -e '.[" in install and project["scripts"]["gpulayer"] == "gpulayer.cli:main"
    for command in re.findall(r"gpulayer (\w+)", install):
        assert command in typer.main.get_command(app).commands, f"no command `gpulayer {command}`"
    for word in test.split():
        assert os.access(ROOT / word, os.X_OK), f"{word} is not an executable of the repository"
    assert f"exec {test.strip()}" in (ROOT / ".ci" / "run").read_text()  # CI runs the same command


def test_readme_fast_loop_commands_name_what_exists():
    """Not run (minutes of tests; tests/unit/test_tiers.py checks what `-m "not slow"` selects): each line
    is scripts/test with a marker expression of registered markers, and paths that exist."""
    registered = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    markers = {line.partition(":")[0] for line in registered}
    for line in block("README.md > Developing #1").splitlines():
        words = shlex.split(line.partition("#")[0])
        assert words[0] == "scripts/test" and os.access(ROOT / words[0], os.X_OK), line
        if words[1] == "-m":
            assert set(re.findall(r"\w+", words[2])) - {"not", "and", "or"} <= markers, line
            words = words[2:]
        for path in words[1:]:
            assert (ROOT / path.partition("::")[0]).exists(), f"{path} does not exist ({line})"


def test_join_lines_run_against_a_real_control_plane(plane, gpulayer_path, tmp_path):
    """The line `up` prints (README.md, docs/cli.md twice): a worker joins, pinning the CA by its
    fingerprint, is listed online, and stops on SIGTERM, deregistered."""
    from gpulayer.server.security.certs import fingerprint
    lines = {block(k).strip() for k in ("README.md > Quick start #4", "docs/cli.md > gpulayer up #2",
                                          "docs/cli.md > gpulayer join #1")}
    env = clean_env(PATH=gpulayer_path, GPULAYER_HOME=str(tmp_path / "joining"))  # another machine: nothing set
    for n, line in enumerate(sorted(lines)):
        known = {w["id"] for w in plane.get_json("/v1/workers")["workers"]}
        line = _substituted(line, join_token=plane.join_token, fingerprint=fingerprint(plane.ca_file),
                            **{"https://10.0.0.5:8470": plane.url})
        log = tmp_path / f"join{n}.log"
        proc = _background(line, tmp_path, env, log)
        try:
            joined = wait_for(lambda known=known: _new_workers(plane, known), 30, "the joined worker", details=log.read_text)
            assert [w["name"] for w in joined] == [socket.gethostname()]
        finally:
            _stop(proc, log)
        assert "worker_deregistered" in log.read_text()


def test_readme_python_snippet_runs_as_written(plane, project, env):
    done = subprocess.run([sys.executable, "-c", block("README.md > From Python #1")], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("succeeded [") and "'epochs None'" in done.stdout, done.stdout


def test_readme_team_block_runs_as_written(plane, project, env):
    """The team block, line by line (as the admin of `server init`); bob's token, which `user add bob`
    printed, stands for `glc_...`."""
    printed: dict[str, str] = {}  # what each line printed (stdout), by the line as run

    def said(start: str) -> str:
        return next(out for line, out in printed.items() if line.startswith(start))

    for command, shown in _commands(block("README.md > For a team #1")):
        assert not shown  # the block shows no output: its comments say what the lines do
        if "glc_..." in command:
            command = _substituted(command, client_token=said("gpulayer user add bob"))
        printed[command] = _sh(command, project, env).stdout
    assert said("GPULAYER_TOKEN=").splitlines()[0] == "bob"  # "# bob"
    ml_job = int(said("gpulayer submit --project ml"))
    assert plane.wait_job(ml_job, timeout=60)["state"] == "succeeded"
    assert re.search(rf"^{ml_job} +succeeded .* ml ", said("gpulayer job list --all"), re.M), printed


# -- docs/cli.md ----------------------------------------------------------------------------


def test_ctrl_c_sample_is_what_submit_wait_says(plane, project, env):
    """^C at a terminal during `submit --wait` against a server: the line shown, with this job's id;
    then the command it names, run."""
    sample = block("docs/cli.md > gpulayer submit #2").strip()
    terminal = Terminal([*CLI, "submit", "--wait", "--", "sleep", "120"], env, project)
    job_id = int(terminal.read_until("\n").splitlines()[0])
    plane.wait_job(job_id, ("running",), 60)
    terminal.interrupt()
    said = _substituted(sample, **{"27": str(job_id)})
    terminal.read_until(said.split(": ", 1)[1])  # the line, however late the terminal passes it on
    assert terminal.exit_code() == 130
    assert said in terminal.output.replace("\r\n", "\n"), terminal.output
    _sh(said.split(": ", 1)[1], project, env)
    assert plane.job(job_id)["state"] == "cancelled"


def test_job_file_blocks_run_as_written(plane, project, env):
    toml, console = block("docs/cli.md > gpulayer submit #3"), block("docs/cli.md > gpulayer submit #4")
    name = toml.splitlines()[0].removeprefix("# ")
    assert name == "train.toml"
    (project / name).write_text(toml)
    (dry_run, _), (follow, _) = _commands(console)
    spec = json.loads(_sh(dry_run, project, env).stdout)
    assert spec["gpus"] == 2 and spec["command"] == ["python", "train.py"]  # "gpus 2 wins"
    followed = _sh(follow, project, env).stdout.splitlines()
    assert followed[1:] == ["epochs 10"], followed
    assert plane.job(int(followed[0]))["state"] == "succeeded"


def test_local_then_remote_submit_run_as_written(plane, project, gpulayer_path, tmp_path):
    """`submit` with no server configured (a fresh home, no GPULAYER_URL) runs here and prints what
    the block shows; then the same folder's `--url` line against the plane (its token and CA in
    GPULAYER_TOKEN, GPULAYER_CA_FILE)."""
    (local, shown), (remote, _) = _commands(block("docs/cli.md > gpulayer submit #5"))
    env = clean_env(PATH=gpulayer_path, GPULAYER_HOME=str(tmp_path / "home"))
    assert _sh(local, project, env).stdout.splitlines() == shown
    env.update(GPULAYER_TOKEN=plane.client_token, GPULAYER_CA_FILE=str(plane.ca_file))
    job_id = int(_sh(_substituted(remote, **{"https://cp:8470": plane.url}), project, env).stdout.split()[0])
    assert plane.job(job_id)["state"] == "succeeded"


def test_array_status_sample_is_what_job_status_prints(capsys):
    """Not run (see NOT_RUN): `job status`'s rendering of an array with the sample's counts is the sample."""
    from gpulayer.cli.jobs import _print_array
    sample = BLOCKS["docs/cli.md > gpulayer job status #1"].text
    cancelled = list(range(1000, 1997))  # the first 1,000 elements not succeeded, by index: 3 failed, 997 of these
    _print_array({"indices": "0-2999", "size": 3000, "max_running": 16, "done": 2812,
                  "counts": {"succeeded": 809, "failed": 3, "cancelled": 2000, "running": 16, "held": 172},
                  "failed_indices": [17, 204, 733, *cancelled], "cancelled_indices": cancelled}, 12)
    assert capsys.readouterr().out == sample


def test_gpu_lines_sample_is_what_job_status_prints():
    """Not run (see NOT_RUN): the GPU lines under a running task are `job status`'s rendering of its samples."""
    from gpulayer.cli.jobs import _gpu_line
    lines = BLOCKS["docs/cli.md > gpulayer job status #2"].text.splitlines()[1:]
    assert [f"    {_gpu_line(g)}" for g in (
        {"index": 0, "uuid": "GPU-5d0b8a3e", "at": 1.0, "age_s": 1.2, "utilization_pct": 87.0,
         "memory_used_mb": 30512, "memory_total_mb": 81559},
        {"index": 1, "uuid": "GPU-8a71c2f0", "at": None, "age_s": None, "utilization_pct": None,
         "memory_used_mb": None, "memory_total_mb": None})] == lines


def test_worker_start_block_runs_as_written(plane, gpulayer_path, tmp_path):
    """A worker that joins with the join token in the environment and the CA as a file (ca.pem, here)."""
    text = _substituted(block("docs/cli.md > gpulayer worker start #1"), join_token=plane.join_token,
                        **{"https://cp.internal:8470": plane.url})
    shutil.copy(plane.ca_file, tmp_path / "ca.pem")
    known = {w["id"] for w in plane.get_json("/v1/workers")["workers"]}
    log = tmp_path / "worker.log"
    proc = _background(text, tmp_path, clean_env(PATH=gpulayer_path, GPULAYER_HOME=str(tmp_path / "home")), log)
    try:
        joined = wait_for(lambda: _new_workers(plane, known), 30, "worker gpu-01", details=log.read_text)
        assert [(w["name"], w["labels"]) for w in joined] == [("gpu-01", {"pool": "a100"})]
    finally:
        _stop(proc, log)
    assert "worker_deregistered" in log.read_text()


def test_secret_set_block_runs_as_written(plane, project, env):
    """Piped (from $HF_TOKEN), then at a terminal: a hidden prompt, whose value a job then reads."""
    piped, prompted = block("docs/cli.md > gpulayer secret set #1").splitlines()
    _sh(piped, project, {**env, "HF_TOKEN": "hf_piped"})
    listed = json.loads(_sh("gpulayer secret list --json", project, env).stdout)
    assert [(s["name"], s["labels"]) for s in listed] == [("HF_TOKEN", {"pool": "a100"})]
    terminal = Terminal(["/bin/sh", "-c", prompted], env, project)
    terminal.read_until("Value of HF_TOKEN: ")  # the space comes from getpass, once echo is off
    terminal.type("hf_typed\n")
    assert terminal.exit_code() == 0, terminal.output
    assert "hf_typed" not in terminal.output and "secret HF_TOKEN set" in terminal.output
    job = _sh("gpulayer submit --secret HF_TOKEN --wait -- sh -c 'test \"$HF_TOKEN\" = hf_typed'", project, env)
    assert plane.job(int(job.stdout.split()[0]))["state"] == "succeeded"


def test_usage_sample_is_what_usage_prints(plane, project, env):
    """The line shown, and what it prints in that shape: these runs' numbers, one row per project
    (ml: the team block's job; default: the others), in an order that depends on their GPU-hours."""
    [(command, shown)] = _commands(block("docs/cli.md > gpulayer usage #1"))
    printed = _sh(command, project, env).stdout.splitlines()
    assert len(printed) == len(shown) and _same_shape(shown[0], printed[0]), printed
    assert printed[1] == shown[1]  # the header
    rows = sorted(printed[2:])
    assert all(_same_shape(a, b) for a, b in zip(sorted(shown[2:]), rows)), printed


def test_server_certs_then_start_run_as_written(gpulayer_path, tmp_path):
    """On a fresh machine ($HOME empty, so ~/.gpulayer is new): the certs block, whose `server start`
    then serves HTTPS with the certificate it made; then the `server start` of its own section,
    with those files copied to cert.pem and key.pem."""
    user, here = tmp_path / "user", tmp_path / "here"
    user.mkdir()
    here.mkdir()
    env = clean_env(PATH=gpulayer_path, HOME=str(user))
    (certs, _), (init, _), (start, _) = _commands(block("docs/cli.md > gpulayer server certs #2"))
    told = _sh(certs, here, env).stderr.replace(str(user), "~").splitlines()
    assert told == [init.split("#")[0].strip(), start], told  # what to run next, as the block goes on
    _sh(init, here, env)
    tls = user / ".gpulayer" / "tls"
    port = free_port()
    _serves(f"{start} --port {port}", port, here, env, tls)
    from cryptography import x509
    cert = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "cp.internal" in names.get_values_for_type(x509.DNSName)
    assert "10.0.0.5" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]

    shutil.copy(tls / "server.pem", here / "cert.pem")
    shutil.copy(tls / "server-key.pem", here / "key.pem")
    port = free_port()
    _serves(_substituted(block("docs/cli.md > gpulayer server start #1").strip(), port=f"--port {port}"),
            port, here, env, tls)


def _serves(line: str, port: int, cwd: Path, env: dict, tls: Path) -> None:
    """`line` starts a control plane that answers /v1/health over TLS (CA tls/ca.pem), and stops on SIGTERM."""
    log = cwd / f"server-{port}.log"
    proc = _background(line, cwd, env, log)
    try:
        def healthy():
            assert proc.poll() is None, log.read_text()
            try:
                return requests.get(f"https://localhost:{port}/v1/health", verify=str(tls / "ca.pem"), timeout=2).ok
            except requests.RequestException:
                return False
        wait_for(healthy, 30, f"`{line}` to answer", details=log.read_text)
    finally:
        _stop(proc, log)
    assert "server_stopped" in log.read_text()


def test_synopses_name_real_options():
    """Each synopsis names a command, and options of that command only."""
    root = typer.main.get_command(app)
    for key, why in NOT_RUN.items():
        if why != SYNOPSIS:
            continue
        for usage in re.split(r"\n(?=gpulayer )", BLOCKS[key].text.strip()):
            words, command = usage.split()[1:], root
            while words and words[0] in getattr(command, "commands", {}):
                command = command.commands[words.pop(0)]
            assert not hasattr(command, "commands"), f"{key}: no command in {usage!r}"
            known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
            named = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage))
            assert named <= known, f"{key}: {sorted(named - known)} are not options of {command.name}"
