"""Plain OpenSSH into an image job's task (docs/access.md "SSH", "Image jobs"): the image has no Python, so the
agent's SSH server joins the task's namespaces and root from outside before it speaks SSH (agent/relay/ssh_server.py).

A real control plane on granian with TLS, a real worker with a bubblewrap sandbox, a static busybox image built
with umoci (tests/ociimages.py, with rsync and its libraries copied in), the real `ssh`, `scp`, `sftp` and
`rsync` with the block `gpulayer ssh-config` prints. The job has `--network none` and a source (so its working
directory is /gpulayer/task): what SSH does must happen where exec puts the user: the image as `/` (the host's
files out of reach, symlinks too), the image's environment with the job's on top, the task's user without a
capability, its own network (`ssh -L` reaches a port that nothing outside the task can).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import requests
from integration_cluster import Cluster
from ociimages import archive, build_layout, needs_umoci
from test_relay_ssh import _digest, _free_port

from gpulayer.testing import clean_env, wait_for

pytest.importorskip("granian")
pytest.importorskip("asyncssh")
pytestmark = [
    needs_umoci,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap needs Linux"),
    pytest.mark.skipif(shutil.which("ssh") is None or shutil.which("scp") is None, reason="needs OpenSSH's ssh and scp"),
    pytest.mark.timeout(300),
]

RSYNC = shutil.which("rsync")
MARK = "place="


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("images-ssh"), tls=True).start_server()
    try:
        c.start_worker("imgssh", labels={"pool": "imgssh"}, args=["--sandbox", "bwrap"])
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    root = tmp_path_factory.mktemp("ssh-image")
    layout = build_layout(root, env=["PATH=/bin:/usr/bin", "GREETING=from-image", "KEEP=image"], workdir="/srv",
                          applets=("tty", "wc", "sha256sum", "ln", "mkdir", "stty"),
                          programs=(RSYNC,) if RSYNC else ())
    return archive(layout, root / "busybox-ssh.tar")


@pytest.fixture(scope="module")
def job(cluster, image, tmp_path_factory):
    """An image job on its own network, with a source: it says where it runs and as whom, serves the image's /etc
    over HTTP on a loopback port of its own, and sleeps."""
    source = tmp_path_factory.mktemp("ssh-source")
    (source / "hello.txt").write_text("from the source bundle\n")
    port = _free_port()
    script = (f'echo "place=$(pwd) uid=$(id -u) keep=$KEEP greet=$GREETING"; httpd -f -p 127.0.0.1:{port} -h /etc & '
              "exec sleep 600")
    done = cluster.cli("submit", "--label", "pool=imgssh", "--image", str(image), "--source", str(source), "--network",
                       "none", "--env", "KEEP=job", "--", "sh", "-c", script, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    job_id = int(done.stdout.split()[0])
    text = wait_for(lambda: MARK in (t := cluster.log_text(job_id)) and t, 90, "the image task to run",
                    details=lambda: f"{cluster.job(job_id)}\n{cluster.log_text(job_id)}")
    first = next(line for line in text.splitlines() if MARK in line)
    yield job_id, port, first.strip()
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")


@pytest.fixture(scope="module")
def config(cluster, tmp_path_factory):
    rc = cluster.cli("ssh-config")
    assert rc.returncode == 0, rc.stderr
    path = tmp_path_factory.mktemp("ssh") / "config"
    path.write_text(rc.stdout + "    BatchMode yes\n    ConnectTimeout 60\n")
    return path


def _ssh(cluster, config, *args, tool="ssh", input=None, timeout=120):
    return subprocess.run([tool, "-F", str(config), *args], env=clean_env(**cluster.cli_env()), input=input,
                          capture_output=True, timeout=timeout, cwd=cluster.root)


def test_a_command_runs_in_the_images_place_with_its_exit_status(cluster, job, config):
    job_id, _, first = job
    host = f"gpulayer-{job_id}"
    done = _ssh(cluster, config, host, 'cat /etc/marker; echo "place=$(pwd) uid=$(id -u) keep=$KEEP greet=$GREETING"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == ["hello from the image", first], done.stdout
    assert _ssh(cluster, config, host, "echo out; echo err >&2; exit 3").returncode == 3
    piped = _ssh(cluster, config, host, "wc -c", input=b"x" * 300_000)
    assert piped.stdout.strip() == b"300000", piped.stderr
    script = _ssh(cluster, config, host, input=b"echo via-stdin; exit 5\n")  # no command: the image's sh reads stdin
    assert (script.returncode, script.stdout.strip()) == (5, b"via-stdin"), script.stderr
    missing = _ssh(cluster, config, host, "python3 -c 1")  # the host has it, the image does not
    assert missing.returncode == 127, missing.stderr


def test_the_session_has_what_the_task_has_and_no_more(cluster, job, config):
    """The host's files are not there, the task's user has no capability, and the processes are the task's."""
    job_id, _, _ = job
    done = _ssh(cluster, config, f"gpulayer-{job_id}",
                "test -e /etc/os-release && echo host-files; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; "
                "grep NoNewPrivs /proc/self/status; ls /proc | grep -c '^[0-9]'")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert os.path.exists("/etc/os-release") and "host-files" not in out, out
    assert out.count("0000000000000000") == 3 and "NoNewPrivs:\t1" in out, out
    assert int(out.split()[-1]) < 20, out  # the task's PID namespace: its few processes, not the host's


def test_a_pty_session(cluster, job, config):
    job_id, _, _ = job
    done = _ssh(cluster, config, "-tt", f"gpulayer-{job_id}", "tty; stty size; exit 4", input=b"")
    assert done.returncode == 4, done.stderr
    assert b"/dev/pts/" in done.stdout, done.stdout


def test_scp_both_ways_as_the_tasks_user(cluster, job, config, tmp_path):
    job_id, _, first = job
    host = f"gpulayer-{job_id}"
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    up = _ssh(cluster, config, str(blob), f"{host}:up.bin", tool="scp")  # SFTP, relative to /gpulayer/task
    assert up.returncode == 0, up.stderr
    remote = _ssh(cluster, config, host, "sha256sum /gpulayer/task/up.bin; ls -ln up.bin")
    lines = remote.stdout.decode().splitlines()
    assert lines[0].split()[0] == _digest(blob), remote.stderr
    uid = first.split("uid=")[1].split()[0]
    assert lines[1].split()[2] == uid, lines  # written by the task's user
    back = tmp_path / "back.bin"
    assert _ssh(cluster, config, f"{host}:up.bin", str(back), tool="scp").returncode == 0
    assert _digest(back) == _digest(blob)
    legacy = _ssh(cluster, config, "-O", str(blob), f"{host}:legacy.bin", tool="scp")  # scp -t in the task
    assert legacy.returncode == 0, legacy.stderr
    assert _ssh(cluster, config, host, "sha256sum legacy.bin").stdout.split()[0].decode() == _digest(blob)
    marker = tmp_path / "marker"
    assert _ssh(cluster, config, f"{host}:/etc/marker", str(marker), tool="scp").returncode == 0
    assert marker.read_text() == "hello from the image\n"


def test_file_copy_never_leaves_the_tasks_root(cluster, job, config, tmp_path):
    """A symlink the task made to a host path, `..` above the root, the host's own files: what SFTP and scp
    reach is the image's root only, as the task sees it."""
    job_id, _, _ = job
    host = f"gpulayer-{job_id}"
    made = _ssh(cluster, config, host, "ln -s /etc/os-release escape; ln -s / top; ln -s ../../../../../etc up")
    assert made.returncode == 0, made.stderr
    for path in ("/etc/os-release", "escape", "../../../../../etc/os-release", "up/os-release", "/proc/1/root/etc/os-release"):
        got = _ssh(cluster, config, f"{host}:{path}", str(tmp_path / "got"), tool="scp")
        assert got.returncode != 0 and not (tmp_path / "got").exists(), (path, got.stderr)
    through = tmp_path / "through"
    assert _ssh(cluster, config, f"{host}:top/etc/marker", str(through), tool="scp").returncode == 0
    assert through.read_text() == "hello from the image\n"  # the link resolves in the image
    listing = _ssh(cluster, config, "-b", "-", host, tool="sftp", input=b"ls -1 /\nls -1 up\n")
    assert listing.returncode == 0, listing.stderr
    names = {line.strip().rsplit("/", 1)[-1] for line in listing.stdout.decode().splitlines() if not line.startswith("sftp>")}
    assert {"bin", "etc", "gpulayer", "marker"} <= names and not names & {"root", "var", "boot", "os-release"}, names
    put = _ssh(cluster, config, "-b", "-", host, tool="sftp", input=f"put {tmp_path / 'through'} /etc/planted\n".encode())
    assert put.returncode != 0  # the image is read-only to the task
    assert not os.path.exists("/etc/planted")


@pytest.mark.skipif(RSYNC is None, reason="rsync is not installed here (scripts/test installs it with apt-get)")
def test_rsync_with_the_images_rsync(cluster, job, config, tmp_path):
    job_id, _, _ = job
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a" * 1000)
    (src / "sub" / "b.bin").write_bytes(os.urandom(200_000))
    back = tmp_path / "back"
    for source, target in ((f"{src}/", f"gpulayer-{job_id}:tree/"), (f"gpulayer-{job_id}:tree/", f"{back}/")):
        done = subprocess.run(["rsync", "-a", "-e", f"ssh -F {config}", source, target],
                              env=clean_env(**cluster.cli_env()), capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert _digest(back / "sub" / "b.bin") == _digest(src / "sub" / "b.bin")
    assert (back / "a.txt").read_text() == "a" * 1000


def test_ssh_L_reaches_a_port_in_the_tasks_own_network(cluster, job, config):
    job_id, port, _ = job
    with pytest.raises(requests.RequestException):  # --network none: nothing outside the task reaches it
        requests.get(f"http://127.0.0.1:{port}/marker", timeout=3)
    local = _free_port()
    tunnel = subprocess.Popen(["ssh", "-F", str(config), "-N", "-L", f"127.0.0.1:{local}:localhost:{port}", f"gpulayer-{job_id}"],
                              env=clean_env(**cluster.cli_env()), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def fetched():
            try:
                return requests.get(f"http://127.0.0.1:{local}/marker", timeout=10).text
            except requests.RequestException:
                return None

        wait_for(lambda: fetched() == "hello from the image\n", 60, "the image's /etc/marker through ssh -L")
    finally:
        tunnel.terminate()
        tunnel.wait(30)


def test_a_root_task_is_root_without_a_capability_it_lacks(cluster, image, config):
    """A job that runs as root (`--run-as-root` on a worker with `--allow-root-tasks`): its sessions are root
    too, with no capability the task itself does not have (here: none at all)."""
    cluster.start_worker("imgroot", labels={"pool": "imgroot"}, args=["--sandbox", "bwrap", "--allow-root-tasks"])
    done = cluster.cli("submit", "--label", "pool=imgroot", "--image", str(image), "--run-as-root", "--", "sh", "-c",
                       'echo "uid=$(id -u) $(grep CapEff /proc/self/status)"; exec sleep 600', timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.split()[0])
    try:
        text = wait_for(lambda: "uid=" in (t := cluster.log_text(job_id)) and t, 90, "the root image task to run")
        task_caps = int(text.split("CapEff:")[1].split()[0], 16)
        got = _ssh(cluster, config, f"gpulayer-{job_id}", 'echo "uid=$(id -u)"; grep -E "^Cap(Eff|Prm|Bnd)" /proc/self/status')
        assert got.returncode == 0, got.stderr
        out = got.stdout.decode()
        assert "uid=0" in out, out
        caps = [int(line.split()[1], 16) for line in out.splitlines() if line.startswith("Cap")]
        assert len(caps) == 3 and all(cap & ~task_caps == 0 for cap in caps), (out, text)
        assert caps == [0, 0, 0], out
    finally:
        cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
