"""Jobs that run from OCI images (issue 24 part 2): a real server, real sandboxed workers, real umoci and bwrap,
an image built in the test (static busybox, assembled with umoci, archived as an OCI layout tar).

Each bad archive is an `Error:` line at submit or a failed task with the reason, never a file written outside
the worker's cache.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from integration_cluster import Cluster
from ociimages import archive, blob, build_layout, layer_tar, member, needs_umoci, with_layer

import gpulayer as gl
from gpulayer.testing import CLI, clean_env, run_cli, wait_for
from terminal import Terminal

pytestmark = [needs_umoci, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap needs Linux")]

POOL = {"pool": "img"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("images")).start_server()
    try:
        for name in ("img1", "img2"):
            c.start_worker(name, labels={**POOL, "host": name}, parallel=2, args=["--sandbox", "bwrap"])
        c.start_worker("open", labels={"pool": "open"}, args=["--sandbox", "none"])
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("image")
    return archive(build_layout(root, env=["GREETING=from-image", "KEEP=image"], workdir="/srv",
                                entrypoint=["/bin/sh", "-c"]), root / "busybox.tar")


def submit(cluster: Cluster, *args: str, expect: int = 0) -> tuple[int | None, str]:
    done = cluster.cli("submit", "--label", "pool=img", *args, timeout=120)
    assert done.returncode == expect, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    job_id = int(done.stdout.split()[0]) if done.stdout.strip() else None
    return job_id, done.stderr


def finished(cluster: Cluster, job_id: int) -> tuple[dict, str]:
    done = cluster.wait_job(job_id, timeout=90)
    return done, cluster.log_text(job_id)


def counting_client(cluster: Cluster):
    """A Python client that counts the artifacts it PUTs."""
    client = cluster.client()
    client.puts = []
    request = client.request

    def counted(method, path, **kwargs):
        if method == "PUT":
            client.puts.append(path)
        return request(method, path, **kwargs)
    client.request = counted
    return client


def test_an_image_runs_cat_etc_marker_with_env_workdir_and_entrypoint(cluster, image):
    job_id, _ = submit(cluster, "--image", str(image), "--env", "KEEP=job", "--wait", "--",
                       'cat /etc/marker; echo "$GREETING $KEEP $(pwd) out=$GPULAYER_OUTPUT_DIR"')
    done, text = finished(cluster, job_id)
    assert done["state"] == "succeeded", text
    assert "hello from the image" in text and "from-image job /srv out=/gpulayer/task" in text, text
    # The worker that ran it lists the image in its cache.
    worker = done["tasks"][0]["worker"] if "worker" in done["tasks"][0] else None
    caches = [cluster.root / f"{name}-cache" for name in ("img1", "img2")]
    listed = [run_cli("image", "list", "--json", "--cache", str(cache)) for cache in caches]
    images = [entry for result in listed for entry in json.loads(result.stdout)]
    assert any(entry["ref"] == "test" and entry["bytes"] > 1_000_000 for entry in images), (worker, listed)
    table = run_cli("image", "list", "--cache", str(caches[0]))
    assert table.returncode == 0 and "DIGEST" in table.stdout, table


def test_a_second_submit_of_the_same_image_uploads_no_blob(cluster, tmp_path):
    fresh = archive(build_layout(tmp_path, marker="a fresh image"), tmp_path / "fresh.tar")
    with counting_client(cluster) as client:
        first = client.submit(gl.job(["/bin/cat", "/etc/marker"], image=str(fresh), labels=POOL))
        assert len(client.puts) == 3, client.puts  # manifest, config, layer
        second = client.submit(gl.job(["/bin/cat", "/etc/marker"], image=str(fresh), labels=POOL))
        assert len(client.puts) == 3, client.puts
        for job in (first, second):
            done, text = finished(cluster, job.id)
            assert done["state"] == "succeeded" and "a fresh image" in text, text
        assert second.info()["spec"]["image"]["manifest"] == first.info()["spec"]["image"]["manifest"]


def test_a_cached_image_runs_by_its_name_and_an_unknown_name_fails_with_the_reason(cluster, image):
    submit(cluster, "--label", "host=img1", "--image", str(image), "--wait", "--", "true")
    job_id, _ = submit(cluster, "--label", "host=img1", "--image", "test", "--", "cat /etc/marker")
    done, text = finished(cluster, job_id)
    assert done["state"] == "succeeded" and "hello from the image" in text, text
    job_id = cluster.submit({"command": ["true"], "image": {"ref": "no-such-image"}, "labels": POOL})
    done, text = finished(cluster, job_id)
    assert done["state"] == "failed" and "no image 'no-such-image'" in text, text


def test_source_arrays_and_gangs_run_in_the_image(cluster, image, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "hello.txt").write_text("from the source bundle\n")
    job_id, _ = submit(cluster, "--image", str(image), "--source", str(source), "--wait", "--",
                       "cat hello.txt; pwd; cat /etc/marker")
    done, text = finished(cluster, job_id)
    assert done["state"] == "succeeded" and "from the source bundle" in text and "/gpulayer/task" in text, text
    job_id, _ = submit(cluster, "--image", str(image), "--array", "0-2", "--wait", "--",
                       'echo "element $GPULAYER_ARRAY_INDEX of $GPULAYER_ARRAY_SIZE"')
    done, text = finished(cluster, job_id)
    assert done["state"] == "succeeded" and all(f"element {i} of 3" in text for i in range(3)), text
    job_id, _ = submit(cluster, "--image", str(image), "--nodes", "2", "--wait", "--",
                       'echo "rank $RANK of $WORLD_SIZE"')
    done, text = finished(cluster, job_id)
    assert done["state"] == "succeeded" and "rank 0 of 2" in text and "rank 1 of 2" in text, text


def test_a_service_from_an_image_gets_port(cluster, image):
    done = cluster.cli("submit", "--label", "pool=img", "--image", str(image), "--service", "--health-path",
                       "/marker", "--", 'echo "port=$PORT"; exec httpd -f -p "$PORT" -h /etc', timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    job_id, endpoint = done.stdout.split()[:2]  # the CLI waits for the endpoint and prints it
    text = wait_for(lambda: "port=" in (t := cluster.log_text(int(job_id))) and t, 30, "the port line")
    port = endpoint.rsplit(":", 1)[1]
    assert f"port={port}" in text, (endpoint, text)
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/marker", timeout=10) as answer:
        assert answer.read() == b"hello from the image\n"
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
    cluster.wait_job(int(job_id), timeout=60)


def test_a_worker_without_a_sandbox_fails_an_image_job_saying_so(cluster, image):
    done = cluster.cli("submit", "--label", "pool=open", "--image", str(image), "--wait", "--", "true", timeout=120)
    job_id = int(done.stdout.split()[0])
    done, text = finished(cluster, job_id)
    assert done["state"] == "failed" and "an image job needs a sandbox" in text, text


def test_what_is_not_an_oci_image_is_an_error_at_submit(cluster, tmp_path, image):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    _, err = submit(cluster, "--image", str(junk), "--", "true", expect=2)
    assert "Error:" in err and "not an OCI image archive" in err, err
    docker = tmp_path / "docker.tar"
    with tarfile.open(docker, "w") as tar:
        (tmp_path / "manifest.json").write_text("[]")
        tar.add(tmp_path / "manifest.json", arcname="manifest.json")
    _, err = submit(cluster, "--image", str(docker), "--", "true", expect=2)
    assert "docker save" in err and "skopeo copy docker-archive:" in err, err
    _, err = submit(cluster, "--image", str(tmp_path / "missing.tar"), "--", "true", expect=2)
    assert "does not exist" in err, err
    # A layout whose layer's bytes are not its digest: refused before anything is uploaded.
    layout = build_layout(tmp_path / "lying")
    manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    layer = json.loads((layout / "blobs" / "sha256" / manifest[7:]).read_bytes())["layers"][0]["digest"]
    path = layout / "blobs" / "sha256" / layer[7:]
    path.write_bytes(path.read_bytes()[:-4] + b"evil")
    _, err = submit(cluster, "--image", str(layout), "--", "true", expect=2)
    assert f"blob {layer} does not match its digest" in err, err
    # The server checks the spec too: a 400 naming the field.
    answer = cluster.request("POST", "/v1/jobs", json={"command": ["true"], "image": {"blobs": ["sha256:" + "a" * 64]}})
    assert answer.status_code == 400 and "image" in answer.json()["error"]["message"], answer.text
    answer = cluster.request("POST", "/v1/jobs", json={"command": ["true"], "image": {
        "manifest": "sha256:" + "b" * 64, "blobs": []}})
    assert answer.status_code == 400 and "not stored" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("members, reason", [
    ([(member("../../../../../../tmp/escaped-by-an-image"), b"pwned")], "'..' component"),
    ([(member("etc/.wh..."), b"")], "whiteout"),
    ([(member("etc/shadow-link", tarfile.SYMTYPE, "../../../../etc/shadow"), None)], "leads outside"),
    ([(member("dev/evil", tarfile.CHRTYPE), None)], "device node"),
])
def test_a_layer_that_would_write_outside_fails_the_task_with_the_reason(cluster, tmp_path, members, reason):
    layout = build_layout(tmp_path / "bad")
    with_layer(layout, layer_tar(members))
    job_id, _ = submit(cluster, "--image", str(archive(layout, tmp_path / "bad.tar")), "--", "true")
    done, text = finished(cluster, job_id)
    assert done["state"] == "failed" and "unsafe layer" in text and reason in text, text
    assert not Path("/tmp/escaped-by-an-image").exists()
    for name in ("img1", "img2"):
        images = cluster.root / f"{name}-cache" / "images"
        assert not [p for p in images.iterdir() if p.name.startswith(".")] if images.exists() else True


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the preloaded library")
@pytest.mark.parametrize("in_image", [False, True], ids=["plain-sandbox", "image"])
def test_a_jobs_ld_preload_is_loaded_inside_the_sandbox_only(cluster, image, tmp_path, in_image):
    """The job's LD_PRELOAD=./evil.so (shipped in its bundle) must not reach the root `env`/`bwrap` that start
    the sandbox: there it would run as root, outside. Its constructor writes a file where only the host sees."""
    marker = tmp_path / "preloaded-outside"
    source = tmp_path / "src"
    source.mkdir()
    code = tmp_path / "evil.c"
    code.write_text('#include <stdio.h>\n#include <unistd.h>\n__attribute__((constructor)) static void hit(void) {'
                    f' FILE *f = fopen("{marker}", "a"); if (f) {{ fprintf(f, "uid=%d\\n", getuid()); fclose(f); }} }}\n')
    built = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(source / "evil.so"), str(code)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    args = ["--image", str(image)] if in_image else []
    job_id, _ = submit(cluster, *args, "--source", str(source), "--env", "LD_PRELOAD=./evil.so", "--wait", "--",
                       *(["echo ran"] if in_image else ["sh", "-c", "echo ran"]))
    done, text = finished(cluster, job_id)
    assert "ran" in text, text
    assert not marker.exists(), f"the job's library ran outside the sandbox: {marker.read_text()}"


def test_cancel_gives_an_image_task_its_sigterm_and_a_missing_command_is_127(cluster, image):
    trap = "trap 'echo got-term; exit 3' TERM; echo ready; sleep 1000 & wait"
    job_id, _ = submit(cluster, "--label", "host=img1", "--image", str(image), "--", trap)
    wait_for(lambda: "ready" in cluster.log_text(job_id), 60, "the trapping task to run")
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
    assert cluster.wait_job(job_id, timeout=60)["state"] == "cancelled"
    text = wait_for(lambda: "finished:" in (t := cluster.log_text(job_id)) and t, 30, "the cancelled task's finish")
    assert "got-term" in text and "exit code 3" in text, text
    job_id = cluster.submit({"command": ["python3", "-c", "1"], "image": {"ref": "test"},
                             "labels": {"host": "img1"}})
    done, text = finished(cluster, job_id)
    assert done["state"] == "failed" and "exit code 127" in text, text  # the image's sh -c says it is not found


@pytest.mark.timeout(400)
def test_exec_and_shell_enter_the_images_root_environment_and_workdir(cluster, image):
    """`gpulayer exec` and `gpulayer shell` into an image job's task: the image's root (/etc/marker), its
    environment and working directory as the task has them, the task's user; exit codes and stdin (SSH:
    tests/integration/test_images_ssh.py)."""
    job_id, _ = submit(cluster, "--label", "host=img1", "--image", str(image), "--env", "KEEP=job", "--",
                       'echo "place=$(pwd) uid=$(id -u) keep=$KEEP"; exec sleep 600')
    text = wait_for(lambda: "place=" in (t := cluster.log_text(job_id)) and t, 90, "the image task to run")
    place = next(line for line in text.splitlines() if "place=" in line).split("place=", 1)[1].strip()
    job = cluster.client().get_job(job_id)
    done = job.exec(["sh", "-c", 'cat /etc/marker; echo "place=$(pwd) uid=$(id -u) keep=$KEEP"; echo $GREETING'])
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == ["hello from the image", f"place={place}", "from-image"], done.stdout
    assert job.exec(["sh", "-c", "exit 3"]).returncode == 3
    assert job.exec(["cat"], input=b"x" * 100_000).stdout == b"x" * 100_000
    missing = job.exec(["python3", "-c", "1"])  # the host has it, the image does not
    assert missing.returncode == 127, missing
    env = clean_env(**cluster.cli_env(TERM="xterm"))
    terminal = Terminal([*CLI, "shell", str(job_id)], env, cluster.root)  # the image's sh, interactive
    terminal.type('cat /etc/marker; echo "in-$(pwd)-$((6*7))"; exit 4\n')  # typed ahead of busybox's prompt
    assert terminal.exit_code() == 4, terminal.output
    assert "hello from the image" in terminal.output and f"in-{place.split()[0]}-42" in terminal.output, terminal.output
    terminal = Terminal([*CLI, "shell", str(job_id), "--", "sh", "-c", "echo ready-$((2+3)); sleep 100"], env, cluster.root)
    terminal.read_until("ready-5")
    terminal.interrupt()  # ^C through the task's terminal: SIGINT for its foreground group
    assert terminal.exit_code() == 130, terminal.output
    cluster.request("POST", f"/v1/jobs/{job_id}/cancel")
