"""Nothing of an image runs as root (issue 36, items 1 and 8): a real control plane, a real root worker with a
bubblewrap sandbox, real umoci and bwrap, images built in the test (tests/ociimages.py).

The attack: an image whose /etc/ld.so.preload names a library. The host's dynamic loader that starts the first
program in the image's root honours it; the worker used to run that loader as root with every capability (the
host's `setpriv`, before it dropped to the task user), so the library could mount the worker's disk and read its
join token. The library here writes, to stderr, who it runs as: every line must say the task user, no effective
capability and no_new_privs, for the job, for `exec` and `shell` into it and for an SSH session.

Also: a layer's setuid-root file is unpacked without its setuid bit, no world-writable file is left, and other
local users cannot enter the image cache.
"""
from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from integration_cluster import Cluster
from ociimages import archive, build_layout, layer_tar, member, needs_umoci, with_layer

from gpulayer.testing import CLI, clean_env, wait_for
from terminal import Terminal

pytestmark = [
    needs_umoci,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap needs Linux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the drop to the task user is a root agent's"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the preloaded library"),
    pytest.mark.timeout(400),
]

#: The preloaded library: one line on stderr per program the loader starts in the image's root.
PRELOAD_C = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void who(void) {
    char line[256], caps[64] = "?", nnp[16] = "?";
    FILE *status = fopen("/proc/self/status", "r");
    if (status) {
        while (fgets(line, sizeof line, status)) {
            if (!strncmp(line, "CapEff:", 7)) sscanf(line + 7, "%63s", caps);
            if (!strncmp(line, "NoNewPrivs:", 11)) sscanf(line + 11, "%15s", nnp);
        }
        fclose(status);
    }
    FILE *shadow = fopen("/etc/root-only", "r");
    dprintf(2, "preloaded uid=%d euid=%d caps=%s nnp=%s secret=%s\n", (int)getuid(), (int)geteuid(), caps, nnp,
            shadow ? "read" : "denied");
    if (shadow) fclose(shadow);
}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("images-boundary"), tls=True).start_server()  # TLS: ssh-config needs it
    try:
        c.start_worker("imgb", labels={"pool": "imgb"}, args=["--sandbox", "bwrap"])
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """Busybox, the host's `id` with its libraries, /etc/ld.so.preload naming /lib/gpulayer-preload.so, a file
    only root may read (/etc/root-only, as /etc/shadow), a setuid-root copy of busybox and a world-writable file
    and folder."""
    root = tmp_path_factory.mktemp("preload-image")
    source = root / "preload.c"
    source.write_text(PRELOAD_C)
    library = root / "preload.so"
    built = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    layout = build_layout(root, applets=("tty",), programs=(shutil.which("id") or "/usr/bin/id",))
    busybox = Path(shutil.which("busybox") or "/bin/busybox").read_bytes()
    setuid = member("bin/busybox-suid")
    setuid.mode = 0o6755
    open_file, open_dir, secret = member("srv/anyone-writes"), member("srv/open/", tarfile.DIRTYPE), member("etc/root-only")
    open_file.mode, open_dir.mode, secret.mode = 0o666, 0o777, 0o600
    with_layer(layout, layer_tar([
        (member("etc/ld.so.preload"), b"/lib/gpulayer-preload.so\n"),
        (member("lib/gpulayer-preload.so"), library.read_bytes()),
        (setuid, busybox), (open_file, b"x\n"), (open_dir, None), (secret, b"root's only\n"),
    ]))
    return archive(layout, root / "preload.tar")


def _ssh(cluster: Cluster, tmp_path: Path, job_id: int, command: str) -> str:
    """What `ssh gpulayer-JOB COMMAND` printed, stdout and stderr, with the block `gpulayer ssh-config` prints."""
    printed = cluster.cli("ssh-config")
    assert printed.returncode == 0, printed.stderr
    config = tmp_path / "ssh-config"
    config.write_text(printed.stdout + "    BatchMode yes\n    ConnectTimeout 60\n")
    got = subprocess.run(["ssh", "-F", str(config), f"gpulayer-{job_id}", command], env=clean_env(**cluster.cli_env()),
                         capture_output=True, text=True, timeout=120, cwd=cluster.root)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(_task_user().pw_uid)], got.stdout
    return got.stderr


def _task_user() -> pwd.struct_passwd:
    return pwd.getpwnam("gpulayer-task")


def _preloaded(text: str) -> list[str]:
    return [line[line.index("preloaded"):] for line in text.splitlines() if "preloaded uid=" in line]


def _as_the_task_user(lines: list[str]) -> None:
    """Every line the library wrote: the task user, no capability, no_new_privs, /etc/root-only denied."""
    uid = _task_user().pw_uid
    assert lines, "the image's preloaded library never ran"
    assert all(line == f"preloaded uid={uid} euid={uid} caps=0000000000000000 nnp=1 secret=denied"
               for line in lines), lines


def test_an_images_preloaded_library_runs_only_as_the_task_user(cluster, image, tmp_path):
    """The job, `exec`, `shell` and an SSH session into it: the image's ld.so.preload never runs as root, with
    capabilities, nor before no_new_privs."""
    script = ('cat /etc/root-only 2>/dev/null || echo "no secret for $(id -u)"; echo started-"$((1+1))"; '
              "exec sleep 600")
    done = cluster.cli("submit", "--label", "pool=imgb", "--image", str(image), "--", "sh", "-c", script,
                       timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.split()[0])
    try:
        text = wait_for(lambda: "started-2" in (t := cluster.log_text(job_id)) and t, 90, "the image task to run",
                        details=lambda: cluster.log_text(job_id))
        assert "no secret for" in text, text
        _as_the_task_user(_preloaded(text))
        job = cluster.client().get_job(job_id)
        ran = job.exec(["sh", "-c", "echo in; /usr/bin/id -u"])  # busybox's sh, then the image's own glibc `id`
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.decode().split() == ["in", str(_task_user().pw_uid)], ran.stdout
        _as_the_task_user(_preloaded(ran.stderr.decode()))
        env = clean_env(**cluster.cli_env(TERM="xterm"))
        terminal = Terminal([*CLI, "shell", str(job_id), "--", "sh", "-c", "echo shell-in; exit 5"], env, cluster.root)
        assert terminal.exit_code() == 5, terminal.output
        assert "shell-in" in terminal.output, terminal.output
        _as_the_task_user(_preloaded(terminal.output))
        if shutil.which("ssh") is not None and importlib.util.find_spec("asyncssh") is not None:
            _as_the_task_user(_preloaded(_ssh(cluster, tmp_path, job_id, "/usr/bin/id -u")))
    finally:
        cluster.request("POST", f"/v1/jobs/{job_id}/cancel")


def test_unpacked_images_keep_no_setuid_bit_and_nothing_world_writable(cluster, image):
    """A layer's 06755 root file is unpacked 0755; a 0666 file and a 0777 folder lose their write bit for
    others; the image cache is the agent's alone (0700), so no other local user reaches the root anyway."""
    done = cluster.cli("submit", "--label", "pool=imgb", "--image", str(image), "--wait", "--", "sh", "-c",
                       "ls -l /bin/busybox-suid; /bin/busybox-suid id -u", timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    text = cluster.log_text(int(done.stdout.split()[0]))
    assert "-rwxr-xr-x" in text and f"\n{_task_user().pw_uid}\n" in f"\n{text}\n", text
    images = cluster.root / "imgb-cache" / "images"
    roots = [entry / "rootfs" for entry in images.iterdir() if (entry / "rootfs" / "bin" / "busybox-suid").exists()]
    assert roots, list(images.iterdir())
    rootfs = roots[0]
    mode = os.lstat(rootfs / "bin" / "busybox-suid").st_mode
    assert stat.S_IMODE(mode) == 0o755, oct(mode)
    for top, dirs, files in os.walk(rootfs):
        for name in dirs + files:
            info = os.lstat(os.path.join(top, name))
            if stat.S_ISLNK(info.st_mode):
                continue
            assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH), (os.path.join(top, name),
                                                                                    oct(info.st_mode))
    assert stat.S_IMODE(os.stat(images).st_mode) == 0o700, oct(os.stat(images).st_mode)
    user = _task_user()
    probe = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "sh", "-c",
                            'exec "$0" id -u', str(rootfs / "bin" / "busybox-suid")], capture_output=True, text=True)
    assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe  # not the task user's to enter
