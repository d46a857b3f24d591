"""Plain OpenSSH into a task through the relay (issue 26 part 2, docs/access.md "SSH").

A real control plane on granian with TLS, a real agent (a bubblewrap sandbox where bwrap works) behind a NAT
(tests/netns.py's NatNamespace: it dials out, nothing reaches it), the real
`ssh`, `scp` and `rsync` of this machine with the block `gpulayer ssh-config` prints (BatchMode=yes: a
prompt would fail the test): the task's cwd and user, exit codes, a PTY, scp both ways (checksummed, SFTP and
legacy), rsync, `ssh -L` to an HTTP server in the task, the host key checked (a known_hosts without the CA
fails), a stranger's token refused, `--no-exec` refused, and the sessions rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess

import pytest
import requests

from gpulayer.testing import clean_env, wait_for

from netns import nat_namespace, plane_behind_nat

pytest.importorskip("granian")
pytest.importorskip("asyncssh")
if shutil.which("ssh") is None or shutil.which("scp") is None:
    pytest.skip("OpenSSH's ssh and scp are not installed here", allow_module_level=True)
pytestmark = [pytest.mark.timeout(240), pytest.mark.netns]

MARK = "place="


@pytest.fixture(scope="module")
def nat():
    yield from nat_namespace("ssh")


@pytest.fixture(scope="module")
def plane(nat, tmp_path_factory):
    with plane_behind_nat(nat, tmp_path_factory.mktemp("relay-ssh"), "w1", lease_ttl=5) as plane:
        yield plane


@pytest.fixture(scope="module")
def job(plane):
    """A job that says where it runs and as whom, then serves HTTP on a loopback port of its own and sleeps."""
    script = "echo place=$(pwd) uid=$(id -u); echo hello-from-the-task > page.txt; exec python3 -m http.server $PORT --bind 127.0.0.1"
    port = _free_port()
    job_id = plane.submit({"command": ["sh", "-c", script], "env": {"PORT": str(port)}, "name": "ssh-target"})
    wait_for(lambda: plane.job(job_id)["state"] == "running", 30, "the target job to run")
    wait_for(lambda: any(MARK in line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"]), 30, "the job's first line")
    return job_id, port


@pytest.fixture(scope="module")
def config(plane, tmp_path_factory):
    """The printed block in a file of its own (never the user's ~/.ssh/config), with BatchMode=yes."""
    rc, out, err = plane.cli("ssh-config")
    assert rc == 0, err
    assert "Host gpulayer-*" in out and "StrictHostKeyChecking yes" in out and "ProxyCommand" in out, out
    assert "StrictHostKeyChecking no" not in out
    path = tmp_path_factory.mktemp("ssh") / "config"
    path.write_text(out + "    BatchMode yes\n    ConnectTimeout 60\n")
    return path


def _ssh(plane, config, *args, tool="ssh", input=None, timeout=120, **env):
    return subprocess.run(
        [tool, "-F", str(config), *args],
        env=clean_env(**plane.cli_env(**env)),
        input=input,
        capture_output=True,
        timeout=timeout,
        cwd=plane.root,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_ssh_runs_in_the_tasks_place_with_its_exit_codes(plane, job, config):
    job_id, _ = job
    first = next(line["text"] for line in plane.get_json(f"/v1/jobs/{job_id}/logs")["lines"] if MARK in line["text"])
    done = _ssh(plane, config, f"gpulayer-{job_id}", "echo place=$PWD uid=$(id -u)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == first.strip()  # the task's working dir and user
    assert _ssh(plane, config, f"gpulayer-{job_id}", "echo out; echo err >&2; exit 3").returncode == 3
    indexed = _ssh(plane, config, f"gpulayer-{job_id}-0", "echo $GPULAYER_JOB_ID")
    assert (indexed.returncode, indexed.stdout.strip()) == (0, str(job_id).encode()), indexed.stderr
    piped = _ssh(plane, config, f"gpulayer-{job_id}", "wc -c", input=b"x" * 300_000)
    assert piped.stdout.strip() == b"300000", piped.stderr
    script = _ssh(plane, config, f"gpulayer-{job_id}", input=b"echo via-stdin; exit 5\n")  # no command: the shell reads stdin
    assert (script.returncode, script.stdout.strip()) == (5, b"via-stdin"), script.stderr


def test_a_pty_session(plane, job, config):
    job_id, _ = job
    done = _ssh(plane, config, "-tt", f"gpulayer-{job_id}", "tty; stty size; exit 4", input=b"")
    assert done.returncode == 4, done.stderr
    assert b"/dev/pts/" in done.stdout, done.stdout


def test_scp_both_ways_checksummed(plane, job, config, tmp_path):
    job_id, _ = job
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(5 * 1024 * 1024 + 17))
    up = _ssh(plane, config, str(blob), f"gpulayer-{job_id}:up.bin", tool="scp")
    assert up.returncode == 0, up.stderr
    remote = _ssh(plane, config, f"gpulayer-{job_id}", "sha256sum up.bin")
    assert remote.stdout.split()[0].decode() == _digest(blob), remote.stderr
    back = tmp_path / "back.bin"
    down = _ssh(plane, config, f"gpulayer-{job_id}:up.bin", str(back), tool="scp")
    assert down.returncode == 0, down.stderr
    assert _digest(back) == _digest(blob)
    legacy = _ssh(plane, config, "-O", str(blob), f"gpulayer-{job_id}:legacy.bin", tool="scp")  # scp -t on the task
    assert legacy.returncode == 0, legacy.stderr
    assert _ssh(plane, config, f"gpulayer-{job_id}", "sha256sum legacy.bin").stdout.split()[0].decode() == _digest(blob)


def test_rsync_over_ssh(plane, job, config, tmp_path):
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed here (scripts/test installs it with apt-get)")
    job_id, _ = job
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a" * 1000)
    (src / "sub" / "b.bin").write_bytes(os.urandom(200_000))
    back = tmp_path / "back"
    for source, target in ((f"{src}/", f"gpulayer-{job_id}:tree/"), (f"gpulayer-{job_id}:tree/", f"{back}/")):
        done = subprocess.run(
            ["rsync", "-a", "-e", f"ssh -F {config}", source, target], env=clean_env(**plane.cli_env()), capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
    assert _digest(back / "sub" / "b.bin") == _digest(src / "sub" / "b.bin")
    assert (back / "a.txt").read_text() == "a" * 1000


def _end(ssh: subprocess.Popen) -> None:
    """Stop an `ssh -N` the test is done with: SIGTERM, then SIGKILL after 10 s. Once in a full run under
    load an OpenSSH client with a refused channel outlived 30 s after its SIGTERM; how the client exits is
    not what these tests check (what it reached, and what it was told, is)."""
    ssh.terminate()
    try:
        ssh.wait(10)
    except subprocess.TimeoutExpired:
        ssh.kill()
        ssh.wait(10)


def test_ssh_L_reaches_a_loopback_port_in_the_task(plane, job, config, tmp_path):
    job_id, port = job
    local = _free_port()
    tunnel = subprocess.Popen(
        ["ssh", "-F", str(config), "-N", "-L", f"127.0.0.1:{local}:127.0.0.1:{port}", f"gpulayer-{job_id}"],
        env=clean_env(**plane.cli_env()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def fetched():
            try:
                return requests.get(f"http://127.0.0.1:{local}/page.txt", timeout=10).text
            except requests.RequestException:
                return None

        wait_for(lambda: fetched() == "hello-from-the-task\n", 60, "the page through ssh -L")
    finally:
        _end(tunnel)
    elsewhere = _free_port()
    log = tmp_path / "refused.err"
    with open(log, "wb") as errors:  # not loopback in the task: the server refuses the channel, and says why
        refused = subprocess.Popen(
            ["ssh", "-F", str(config), "-N", "-L", f"127.0.0.1:{elsewhere}:192.0.2.1:80", f"gpulayer-{job_id}"],
            env=clean_env(**plane.cli_env()),
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:

            def said_why() -> bool:
                try:
                    requests.get(f"http://127.0.0.1:{elsewhere}/", timeout=5)
                except requests.RequestException:
                    pass
                return b"loopback" in log.read_bytes()

            wait_for(said_why, 90, "the forward to a non-loopback address refused")
            assert b"administratively prohibited" in log.read_bytes()
        finally:
            _end(refused)


def test_host_keys_are_checked_not_skipped(plane, job, config, tmp_path):
    job_id, _ = job
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    done = _ssh(plane, config, "-o", f"UserKnownHostsFile={empty}", f"gpulayer-{job_id}", "true")
    assert done.returncode == 255 and b"Host key verification failed" in done.stderr, done.stderr
    other = _ssh(plane, config, "-o", f"HostKeyAlias=gpulayer-{job_id + 1}", f"gpulayer-{job_id}", "true")
    assert other.returncode == 255, other.stderr  # a certificate for another task's name is not this one's


def test_refusals_are_clear_and_exit_255(plane, job, config):
    job_id, _ = job
    rc, out, err = plane.cli("user", "add", "sshstranger", "--json")
    assert rc == 0, err
    stranger = json.loads(out)["token"]
    done = _ssh(plane, config, f"gpulayer-{job_id}", "true", GPULAYER_TOKEN=stranger)
    assert done.returncode == 255 and b"Error:" in done.stderr and str(job_id).encode() in done.stderr, done.stderr
    bad = _ssh(plane, config, "gpulayer-nope", "true")
    assert bad.returncode == 255 and b"gpulayer-JOB" in bad.stderr, bad.stderr
    rc, _, err = plane.cli("ssh-proxy", "login-node")
    assert rc == 2 and "gpulayer-JOB" in err
    missing = _ssh(plane, config, f"gpulayer-{job_id}-9", "true")
    assert missing.returncode == 255 and b"Error:" in missing.stderr, missing.stderr


def test_no_exec_workers_refuse_ssh(plane, config):
    plane.start_worker("noexec-ssh", args=["--no-exec"], labels={"pool": "noexec-ssh"})
    job_id = plane.submit({"command": ["sleep", "600"], "labels": {"pool": "noexec-ssh"}})
    try:
        wait_for(lambda: plane.job(job_id)["state"] == "running", 30, "the job on the --no-exec worker")
        done = _ssh(plane, config, f"gpulayer-{job_id}", "true")
        assert done.returncode == 255 and b"--no-exec" in done.stderr, done.stderr
    finally:
        plane.cli("job", "cancel", str(job_id))


def test_sessions_rows(plane, job, config):
    job_id, _ = job
    (last_before,) = plane.sql("SELECT coalesce(max(id), 0) FROM sessions")[0]
    assert _ssh(plane, config, f"gpulayer-{job_id}", "true").returncode == 0

    def row():
        rows = plane.sql("SELECT kind, detail, bytes_in, bytes_out, exit_code FROM sessions WHERE id > ? AND closed_at IS NOT NULL", (last_before,))
        return rows[0] if rows else None

    kind, detail, bytes_in, bytes_out, code = wait_for(row, 30, "the ssh session's row closed")
    assert (kind, detail) == ("ssh", "{}") and bytes_in > 0 and bytes_out > 0
    assert code in (0, None)  # the server's exit (0), or ssh-proxy's close first: SSH's statuses travel inside SSH
    assert not plane.sql("SELECT id FROM sessions WHERE detail LIKE '%PRIVATE KEY%'")  # the host key is never recorded
