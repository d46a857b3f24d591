"""OCI images on the agent's side (issue 24 part 2): fetched through the artifact cache, checked, unpacked by
umoci, run with the image as the sandbox's root; a bad layer never writes outside the cache. CDI parsing from a
fixture spec. Real umoci, real bwrap, a real busybox image built in the test."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent.sandbox import cdi
from agent.artifacts.cache import ArtifactCache
from agent.sandbox.imagerun import TASK_DIR, image_argv, image_environment, startable_in, wrap_image
from agent.sandbox.images import ImageCache, ImageError, check_layer, list_images, parse_config, parse_manifest
from agent.sandbox.bwrap import gpu_nodes, resolve
from gpulayer.protocol.jobspec import ImageSpec
from ociimages import build_layout, layer_tar, manifest_of, member, needs_umoci, with_layer

FIXTURES = Path(__file__).parent / "fixtures"


def layout_cache(layout: Path, root: Path, max_bytes: int = 1 << 30) -> ArtifactCache:
    """An artifact cache whose fetcher reads the layout's blobs (the control plane's store stands in)."""
    def fetch(digest, out):
        out.write((layout / "blobs" / "sha256" / digest[7:]).read_bytes())
    return ArtifactCache(root, max_bytes, fetch)


def spec_of(layout: Path, ref: str | None = "test") -> ImageSpec:
    digest, manifest = manifest_of(layout)
    return ImageSpec(manifest=digest, ref=ref,
                     blobs=[manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])])


def run_in(prepared, command, tmp_path, env=None, cwd=None, binds=None, driver=()):
    sandbox = resolve("bwrap", binds=binds)
    workdir = tmp_path / "task"
    workdir.mkdir(exist_ok=True)
    sandbox.give(workdir)
    argv = image_argv(prepared.config, command)
    full = {**image_environment(prepared.config), **(env or {})}
    startable_in(prepared, argv, full, cwd or prepared.config.workdir or TASK_DIR)
    wrapped, popen_env = wrap_image(sandbox, prepared, argv, full, str(workdir), cwd or prepared.config.workdir or TASK_DIR,
                                    gpu_nodes=[], driver=list(driver))
    return subprocess.run(wrapped, env=popen_env, capture_output=True, text=True, timeout=60)


@needs_umoci
def test_an_image_runs_cat_etc_marker_with_its_env_workdir_and_entrypoint(tmp_path):
    layout = build_layout(tmp_path / "img", env=["GREETING=from-image", "KEEP=image"], workdir="/srv",
                          entrypoint=["/bin/sh", "-c"])
    images = ImageCache(layout_cache(layout, tmp_path / "cache"))
    said: list[str] = []
    prepared = images.prepare(spec_of(layout), said.append)
    assert (prepared.rootfs / "etc" / "marker").read_text() == "hello from the image\n"
    assert any("unpacked" in line for line in said), said
    done = run_in(prepared, ['cat /etc/marker; echo "$GREETING $KEEP"; pwd; id -u; echo x > /etc/nope || echo ro'],
                  tmp_path, env={"KEEP": "job"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "hello from the image" and lines[1] == "from-image job" and lines[2] == "/srv", lines
    if os.geteuid() == 0:
        assert lines[3] != "0", "a root agent's image task ran as root"
    assert lines[-1] == "ro", lines
    # The second task of the image finds it in the cache; `gpulayer image list` reads it there.
    again: list[str] = []
    assert images.prepare(spec_of(layout), again.append).rootfs == prepared.rootfs
    assert again == ["image test from the worker's cache"], again
    listed = list_images(tmp_path / "cache")
    assert [(image["digest"], image["ref"]) for image in listed] == [(prepared.manifest, "test")]
    # ... and by its name alone.
    assert images.prepare(ImageSpec(ref="test"), said.append).manifest == prepared.manifest
    with pytest.raises(ImageError, match="no image 'other'"):
        images.prepare(ImageSpec(ref="other"), said.append)


@needs_umoci
def test_a_command_the_image_lacks_is_127_and_the_task_dir_is_writable(tmp_path):
    layout = build_layout(tmp_path / "img")
    prepared = ImageCache(layout_cache(layout, tmp_path / "cache")).prepare(spec_of(layout), lambda _: None)
    with pytest.raises(FileNotFoundError):
        startable_in(prepared, ["python3"], image_environment(prepared.config), TASK_DIR)
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard").write_text("a fleet's dataset\n")
    done = run_in(prepared, ["sh", "-c", "echo out > result.txt; pwd; cat /etc/marker /data/shard"], tmp_path,
                  binds=[f"{data}:/data:ro"])  # --sandbox-bind reaches image tasks too
    assert done.returncode == 0 and done.stdout.splitlines()[0] == TASK_DIR, done
    assert "a fleet's dataset" in done.stdout, done
    assert (tmp_path / "task" / "result.txt").read_text() == "out\n"


@needs_umoci
def test_a_lying_blob_fails_with_the_reason_and_keeps_nothing(tmp_path):
    layout = build_layout(tmp_path / "img")
    spec = spec_of(layout)
    layer = layout / "blobs" / "sha256" / spec.blobs[1][7:]
    layer.write_bytes(layer.read_bytes()[:-10] + b"0123456789")
    cache = layout_cache(layout, tmp_path / "cache")
    with pytest.raises(ImageError, match="failed verification"):
        ImageCache(cache).prepare(spec, lambda _: None)
    assert not (tmp_path / "cache" / spec.blobs[1][7:]).exists()
    assert list_images(tmp_path / "cache") == []


@needs_umoci
def test_images_are_evicted_least_recently_used_under_the_cache_limit_but_not_while_in_use(tmp_path):
    first, second = build_layout(tmp_path / "one", marker="one"), build_layout(tmp_path / "two", marker="two")
    blobs = {**{p.name: p for p in (first / "blobs" / "sha256").iterdir()},
             **{p.name: p for p in (second / "blobs" / "sha256").iterdir()}}

    def fetch(digest, out):
        out.write(blobs[digest[7:]].read_bytes())
    cache = ArtifactCache(tmp_path / "cache", 1 << 30, fetch)
    images = ImageCache(cache)
    held = images.prepare(spec_of(first), lambda _: None)
    cache.max_bytes = 5_000_000  # two unpacked busyboxes (2 MB each) and their layers (1.1 MB each) do not fit
    images.prepare(spec_of(second), lambda _: None)
    assert len(list_images(tmp_path / "cache")) == 2  # the first is held by a task
    images.release(held.manifest)
    assert images.evict() == [held.manifest]
    assert [image["ref"] for image in list_images(tmp_path / "cache")] == ["test"] and not held.rootfs.exists()
    # A build folder an agent killed mid-way left is swept by the next one; a running agent's is kept.
    (images.root / ".build-abc-999999999-1").mkdir()
    (images.root / f".build-abc-{os.getpid()}-1").mkdir()
    assert ImageCache(cache).sweep_leftovers() == [] and not (images.root / ".build-abc-999999999-1").exists()
    assert (images.root / f".build-abc-{os.getpid()}-1").exists()


@pytest.mark.parametrize("members, reason", [
    ([(member("../escape"), b"x")], "'..'"),
    ([(member("/etc/passwd"), b"x")], "absolute path"),
    ([(member("dev/sda", tarfile.BLKTYPE), None)], "device node"),
    ([(member("etc/evil", tarfile.SYMTYPE, "../../../../root"), None)], "leads outside"),
    ([(member("etc", tarfile.SYMTYPE, "/tmp"), None), (member("etc/passwd"), b"x")], "under a symlink"),
    ([(member("bin/link", tarfile.LNKTYPE, "../../etc/shadow"), None)], "leads outside"),
    ([(member("bin/link", tarfile.LNKTYPE, "etc/shadow"), None)], "names no earlier file"),
    ([(member("etc/.wh..."), b"")], "whiteout"),
    ([(member("etc/.wh.."), b"")], "whiteout"),
    ([(member(".wh."), b"")], "whiteout"),
])
def test_an_unsafe_layer_member_is_refused(tmp_path, members, reason):
    path = tmp_path / "layer.tar.gz"
    path.write_bytes(layer_tar(members))
    with pytest.raises(ImageError, match=reason):
        check_layer(path, 1 << 30)


def test_a_safe_layer_passes_with_absolute_symlinks_and_whiteouts(tmp_path):
    path = tmp_path / "layer.tar.gz"
    path.write_bytes(layer_tar([(member("bin", tarfile.DIRTYPE), None), (member("bin/busybox"), b"elf"),
                                (member("bin/sh", tarfile.SYMTYPE, "/bin/busybox"), None),
                                (member("bin/ash", tarfile.LNKTYPE, "bin/busybox"), None),
                                (member("usr/.wh.share"), b""), (member("opt/.wh..wh..opq"), b"")]))
    assert check_layer(path, 1 << 30) == 6
    with pytest.raises(ImageError, match="more than 2 bytes"):
        check_layer(path, 2)


@needs_umoci
@pytest.mark.parametrize("members", [
    [(member("../../escaped-by-layer"), b"pwned")],
    [(member("etc/.wh..."), b"")],
])
def test_a_bad_layer_in_an_image_fails_the_prepare_and_writes_nothing_outside(tmp_path, members):
    layout = build_layout(tmp_path / "img")
    with_layer(layout, layer_tar(members))
    cache_root = tmp_path / "deep" / "cache"
    with pytest.raises(ImageError, match="unsafe layer"):
        ImageCache(layout_cache(layout, cache_root)).prepare(spec_of(layout), lambda _: None)
    assert not list((tmp_path).rglob("escaped-by-layer"))
    assert not [p for p in (cache_root / "images").iterdir()], "a build dir was left behind"


def test_manifest_and_config_parsing_refuses_what_is_not_oci():
    with pytest.raises(ImageError, match="not an OCI image manifest"):
        parse_manifest(json.dumps({"schemaVersion": 2, "mediaType":
                                   "application/vnd.docker.distribution.manifest.v2+json"}).encode())
    with pytest.raises(ImageError, match="not JSON"):
        parse_manifest(b"\x1f\x8bnot json")
    good = {"schemaVersion": 2, "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                           "digest": "sha256:" + "a" * 64, "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": "sha256:" + "b" * 64,
                        "size": 3}]}
    with pytest.raises(ImageError, match="tar\\+zstd"):
        parse_manifest(json.dumps(good).encode())
    config = parse_config(json.dumps({"os": "linux", "config": {"Env": ["A=1", "B=x=y"], "WorkingDir": "app",
                                                               "Entrypoint": ["/e"], "User": "1000"}}).encode())
    assert config.env == {"A": "1", "B": "x=y"} and config.workdir == "/app" and config.entrypoint == ["/e"]
    with pytest.raises(ImageError, match="windows"):
        parse_config(b'{"os": "windows"}')


def test_cdi_spec_parsing_from_a_fixture(tmp_path):
    spec = cdi.parse_spec((FIXTURES / "nvidia-cdi.yaml").read_text())
    edits = cdi.edits_for(spec, ["0"])
    assert edits.device_nodes == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"]
    assert ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15") \
        in edits.mounts
    assert ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so") in edits.symlinks
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert "/dev/nvidia1" not in cdi.edits_for(spec, ["0"]).device_nodes
    assert "/dev/nvidia1" in cdi.edits_for(spec, ["all"]).device_nodes
    lib = tmp_path / "libcuda.so.550.54.15"
    lib.write_bytes(b"elf")
    args, env = cdi.driver_mounts(cdi.Edits(mounts=[(str(lib), "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
                                                    ("/nonexistent/libx.so", "/usr/lib/libx.so")],
                                            symlinks=[("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so")]))
    assert ["--ro-bind", str(lib), f"{cdi.DRIVER_DIR}/lib/libcuda.so.550.54.15"] == args[12:15]
    assert ["--symlink", "libcuda.so.1", f"{cdi.DRIVER_DIR}/lib/libcuda.so"] == args[15:18]
    assert "/nonexistent/libx.so" not in args
    with pytest.raises(cdi.CdiError):
        cdi.parse_spec("[1, 2]")
    assert cdi.load(["0"], paths=(str(tmp_path / "none.yaml"),)).mounts is not None  # the toolkit's list, no spec


def test_the_toolkit_list_is_read_from_the_linker_cache():
    ldconfig = ("\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
                "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n"
                "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
                "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n")
    edits = cdi.toolkit_edits(ldconfig)
    names = [container for _, container in edits.mounts if "/lib/" in container]
    assert names == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]


@pytest.mark.gpu
@needs_umoci
def test_an_image_task_sees_its_gpu_and_the_driver(tmp_path):
    """On a GPU machine: the device node and the driver's libraries (CDI spec, else the toolkit's list) in the image.

    The image is glibc-based, as a CUDA image is (a static busybox image cannot run the driver's dynamically
    linked nvidia-smi: its loader is not there): nvidia-smi, bound in from the host, lists the GPU."""
    smi = shutil.which("nvidia-smi")
    if not os.path.exists("/dev/nvidiactl") or smi is None:
        pytest.skip("needs an NVIDIA GPU and its driver")
    layout = build_layout(tmp_path / "img", glibc_for=smi)
    prepared = ImageCache(layout_cache(layout, tmp_path / "cache")).prepare(spec_of(layout), lambda _: None)
    args, env = cdi.driver_mounts(cdi.load(["0"]))
    sandbox = resolve("bwrap")
    workdir = tmp_path / "task"
    workdir.mkdir()
    full = {**image_environment(prepared.config), **env, "LD_LIBRARY_PATH": f"{cdi.DRIVER_DIR}/lib",
            "PATH": f"/bin:{cdi.DRIVER_DIR}/bin"}
    argv = ["sh", "-c", f"ls /dev/nvidia0 && ls {cdi.DRIVER_DIR}/lib | grep -c libcuda && nvidia-smi -L"]
    wrapped, popen_env = wrap_image(sandbox, prepared, argv, full, str(workdir), TASK_DIR,
                                    gpu_nodes=gpu_nodes([0]), driver=args)
    done = subprocess.run(wrapped, env=popen_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "GPU 0" in done.stdout, (done.stdout, done.stderr)


@needs_umoci
@pytest.mark.skipif(os.geteuid() != 0, reason="the task user's bwrap is a root agent's")
def test_a_root_agents_image_task_reaches_what_it_binds_through_folders_its_user_cannot_enter(tmp_path):
    """The bwrap that makes the image's root starts as the task user (issue 36): the image cache, the task dir, a
    --sandbox-bind folder and the driver's files lie under folders only root enters (pytest's tmp, 0700), and
    the outer bwrap's stage still binds every one; the task is its user, without a capability."""
    hidden = tmp_path / "closed"
    hidden.mkdir(mode=0o700)
    layout = build_layout(tmp_path / "img")
    prepared = ImageCache(layout_cache(layout, hidden / "cache")).prepare(spec_of(layout), lambda _: None)
    data = hidden / "data"
    data.mkdir()
    (data / "shard").write_text("a shard\n")
    lib = hidden / "libcuda.so.550.54.15"
    lib.write_text("the driver\n")
    args, _ = cdi.driver_mounts(cdi.Edits(mounts=[(str(lib), "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")]))
    done = run_in(prepared, ["sh", "-c", f"cat /data/shard {cdi.DRIVER_DIR}/lib/libcuda.so.550.54.15; id -u; "
                             "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status"], hidden,
                  binds=[f"{data}:/data:ro"], driver=args)
    assert done.returncode == 0, done.stderr
    uid = pwd.getpwnam("gpulayer-task").pw_uid
    assert done.stdout.split() == ["a", "shard", "the", "driver", str(uid), "CapEff:", "0000000000000000",
                                   "NoNewPrivs:", "1"], done.stdout
