"""A task that swaps its folders for symbolic links gets no host file uploaded (issue 36, item 2).

The agent (root) reads a task's checkpoint folder and its declared outputs. A task that exchanges one of its
folders with a link to a host folder (``renameat2(RENAME_EXCHANGE)``, in a loop) while the agent walks and
opens them once got the host's files uploaded as its checkpoint or outputs, which its owner then downloads.
Real server and worker processes, real bwrap: the racer runs as the task, the secret is a host file beside
the worker's state dir that the sandbox does not show; no artifact the control plane stores ever holds its
bytes, and the task's own files still arrive. The same swap, by an array element sharing the sandbox, while
the agent hands a new element's directory to the task user (chown) changes the owner of no host file.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from integration_cluster import Cluster
from test_sandbox import module_cluster

from gpulayer.testing import wait_for

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("bwrap") is None or not sys.platform.startswith("linux")
                                 or os.uname().machine not in ("x86_64", "aarch64"),
                                 reason="needs bubblewrap on Linux (x86_64 or aarch64: renameat2's number)")]

SECRET = b"host-secret-never-uploaded-6f1d2c"

#: Exchanges DIR/outN (a real folder holding `key`) with DIR/altN (a link to the host folder) in a loop.
RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
number = {"x86_64": 316, "aarch64": 276}[os.uname().machine]  # renameat2
base, target, pairs, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
names = []
for n in range(pairs):
    real, link = os.path.join(base, f"out{n}"), os.path.join(base, f"alt{n}")
    os.makedirs(real, exist_ok=True)
    with open(os.path.join(real, "key"), "w") as out:
        out.write(f"the task's own key {n}")
    if not os.path.islink(link):
        os.symlink(target, link)
    names.append((real.encode(), link.encode()))
open(os.path.join(base, "racing"), "w").close()
end, swaps = time.monotonic() + seconds, 0
while time.monotonic() < end:
    for real, link in names:
        if libc.syscall(number, -100, real, -100, link, 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
            if ctypes.get_errno() == 2:  # the folder is gone: the agent removed the other element's directory
                end = 0
                break
            raise OSError(ctypes.get_errno(), "renameat2")
        swaps += 1
print(f"swapped {swaps} times", flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory, "links")


@pytest.fixture
def host_folder(cluster, request) -> Path:
    """A host folder beside the workers' state dirs with a file `key` holding the secret (the test's own),
    readable by root only."""
    folder = cluster.root / f"host-secrets-{request.node.name}"
    folder.mkdir()
    (folder / "key").write_bytes(secret(request.node.name))
    (folder / "key").chmod(0o600)
    return folder


def secret(test: str) -> bytes:
    return SECRET + test.encode()


def stored_with_secret(cluster: Cluster, host_folder: Path) -> list[Path]:
    """Every artifact the control plane stores whose bytes hold the secret in ``host_folder``."""
    wanted = (host_folder / "key").read_bytes()
    return [path for path in (cluster.home / "artifacts").rglob("*") if path.is_file() and wanted in path.read_bytes()]


def element_log(cluster: Cluster, job_id: int, index: int) -> str:
    return "\n".join(line["text"] for line in cluster.api(f"/jobs/{job_id}/logs?index={index}&limit=1000")["lines"])


def racer(target: Path, base: str, pairs: int, seconds: float) -> list[str]:
    return [sys.executable, "-c", RACER, base, str(target), str(pairs), str(seconds)]


def test_a_checkpoint_folder_replaced_by_a_link_uploads_nothing_of_the_host(cluster, host_folder):
    cluster.start_worker("plain", labels={"pool": "plain"})
    script = f'rm -rf "$GPULAYER_CHECKPOINT_DIR" && ln -s {host_folder} "$GPULAYER_CHECKPOINT_DIR" && exit 1'
    job_id = cluster.submit({"command": ["sh", "-c", script], "labels": {"pool": "plain"}})
    done = cluster.wait_job(job_id, timeout=60)
    assert done["state"] == "failed", done
    assert stored_with_secret(cluster, host_folder) == []
    assert cluster.api(f"/jobs/{job_id}/checkpoints")["checkpoints"] == []
    text = cluster.log_text(job_id)
    assert "checkpoint not uploaded: .gpulayer-checkpoint is not a folder" in text, text


def test_a_racer_swapping_checkpoint_folders_for_links_uploads_nothing_of_the_host(cluster, host_folder):
    """Periodic snapshots every second for 12 s and the final one, each with 16 folders swapped: on the old code
    each folder's file was read through the link about one time in two."""
    cluster.start_worker("racer", labels={"pool": "racer"})
    script = f'{sys.executable} -c "$RACER" "$GPULAYER_CHECKPOINT_DIR" {host_folder} 16 12; exit 1'
    job_id = cluster.submit({"command": ["sh", "-c", script], "labels": {"pool": "racer"}, "env": {"RACER": RACER},
                             "checkpoint_every_seconds": 1})
    done = cluster.wait_job(job_id, timeout=120)
    text = cluster.log_text(job_id)
    assert done["state"] == "failed" and "swapped" in text, text
    assert stored_with_secret(cluster, host_folder) == [], text
    checkpoints = cluster.api(f"/jobs/{job_id}/checkpoints")["checkpoints"]
    assert len(checkpoints) >= 3, (checkpoints, text)  # snapshots were taken while it raced


def test_a_sibling_swapping_an_elements_outputs_for_links_uploads_nothing_of_the_host(cluster, host_folder):
    """Array elements share one sandbox (agent/sandbox/shared.py): element 0 races element 1's 24 declared output folders
    while the agent collects and uploads them after element 1's end."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("a shared sandbox needs a root agent and nsenter")
    cluster.start_worker("pair", labels={"pool": "pair"}, parallel=2)
    pairs = 24
    script = (
        'if [ "$GPULAYER_ARRAY_INDEX" = 0 ]; then\n'
        '  while [ -z "$(ls -d ../*/ready 2>/dev/null)" ]; do sleep 0.05; done\n'
        '  other=$(dirname "$(ls -d ../*/ready | head -1)")\n'
        f'  exec {sys.executable} -c "$RACER" "$other" {host_folder} {pairs} 10\n'
        'fi\n'
        f'echo plain > plain.txt; for n in $(seq 0 {pairs - 1}); do mkdir -p out$n && echo "key $n" > out$n/key; done\n'
        'touch ready; while [ ! -e racing ]; do sleep 0.05; done; sleep 1\n')
    job_id = cluster.submit({"command": ["sh", "-c", script], "labels": {"pool": "pair"}, "array": "0-1",
                             "env": {"RACER": RACER}, "outputs": ["plain.txt", *(f"out{n}" for n in range(pairs))]})
    done = cluster.wait_job(job_id, timeout=120)
    logs = [element_log(cluster, job_id, index) for index in (0, 1)]
    assert done["state"] == "succeeded", (done, logs)
    assert "swapped" in logs[0], logs
    assert stored_with_secret(cluster, host_folder) == []
    # The element's own files still arrive (those of the folders that were folders when looked at).
    outputs = cluster.api(f"/jobs/{job_id}/outputs?index=1")["outputs"]
    assert "plain.txt" in outputs and all(path.endswith("/key") for path in outputs if path != "plain.txt"), outputs


def test_the_racer_really_races(cluster, host_folder, tmp_path):
    """The racer, run here on a folder the test reads the way the old agent did (walk, then open by full path):
    it reads the host file within a few tries, so the tests above can tell."""
    base = tmp_path / "race"
    base.mkdir()
    proc = subprocess.Popen(racer(host_folder, str(base), 4, 5))
    try:
        wait_for(lambda: (base / "racing").exists(), 10, "the racer to start")
        leaked = 0
        for _ in range(200):
            listed = [os.path.join(top, name) for top, _dirs, files in os.walk(base) for name in files]
            time.sleep(0.001)  # the old agent listed every file, then opened them one by one
            for path in listed:
                try:
                    with open(path, "rb") as handle:
                        leaked += SECRET in handle.read()
                except OSError:
                    pass
        assert leaked > 10, leaked
    finally:
        proc.wait(30)


#: Element 0 of an array: each other element's directory, once the agent hands it to the task user, gets a link to
#: the host folder beside its folder `d`, and the two are exchanged until the directory goes away.
CHOWN_RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
number = {"x86_64": 316, "aarch64": 276}[os.uname().machine]  # renameat2
target, seconds, others = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
own, done, active, swaps, end = os.path.basename(os.getcwd()), set(), {}, 0, time.monotonic() + seconds
while time.monotonic() < end and (len(done) < others or active):
    for name in os.listdir(".."):
        if name != own and name not in done:
            try:
                os.symlink(target, f"../{name}/x")
            except OSError:
                continue  # not handed over yet (still root's), or gone
            done.add(name)
            active[name] = (f"../{name}/d".encode(), f"../{name}/x".encode(), time.monotonic() + 3)
    for name, (real, link, until) in list(active.items()):
        for _ in range(200):
            if libc.syscall(number, -100, real, -100, link, 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
                until = 0
                break
            swaps += 1
        if time.monotonic() > until:
            del active[name]
print(f"raced {len(done)} directories, swapped {swaps} times", flush=True)
"""


def bundle(files: int) -> bytes:
    """A source bundle whose folder `d` holds ``files`` files named as the host folder's."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        folder = tarfile.TarInfo("d")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for n in range(files):
            tar.addfile(tarfile.TarInfo(f"d/f{n}"), io.BytesIO(b""))
    return out.getvalue()


def test_a_sibling_swapping_a_folder_while_the_agent_hands_the_directory_over_chowns_no_host_file(cluster, tmp_path):
    """The agent (root) hands each element's directory to the task user (chown) before it starts; an element
    sharing the sandbox swaps the new directory's folder for a link to a host folder meanwhile: the old walk
    (the directory first, then down, by full paths) changed the owner of the host folder's files to the task
    user. Its files are root's after four elements were raced."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("a shared sandbox needs a root agent and nsenter")
    host = tmp_path / "host-owned"
    host.mkdir()
    files = 3000
    for n in range(files):
        (host / f"f{n}").write_bytes(b"")
    os.chown(host, 0, 0)
    data = bundle(files)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert cluster.request("PUT", f"/v1/artifacts/{digest}", data=data).status_code in (200, 201)
    cluster.start_worker("handover", labels={"pool": "handover"}, parallel=2)
    script = (f'if [ "$GPULAYER_ARRAY_INDEX" = 0 ]; then exec {sys.executable} -c "$RACER" {host} 60 4; fi\n'
              'sleep 0.5\n')
    job_id = cluster.submit({"command": ["sh", "-c", script], "labels": {"pool": "handover"}, "array": "0-4",
                             "source": digest, "env": {"RACER": CHOWN_RACER}})
    done = cluster.wait_job(job_id, timeout=180)
    racer_log = element_log(cluster, job_id, 0)
    assert done["state"] == "succeeded", (done, racer_log)
    assert "raced 4 directories" in racer_log, racer_log
    changed = [path.name for path in host.iterdir() if path.lstat().st_uid != 0]
    assert changed == [], f"{len(changed)} host files handed to the task user; {racer_log}"
