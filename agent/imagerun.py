"""Running a task with an OCI image as its root, in the worker's bubblewrap sandbox.

The argv is the sandbox's (agent/sandbox.py) with the image in place of the host's ``/``::

    env --ignore-signal=TERM,INT,HUP bwrap --tmpfs / --ro-bind ROOTFS/<each top entry> /<entry> ...
        --proc /proc --dev /dev --tmpfs /tmp --bind TASKDIR /gpulayer/task [GPU nodes, driver libs]
        --unshare-pid --unshare-ipc --die-with-parent --chdir CWD
        -- [/.gpulayer/lib/ld.so /.gpulayer/bin/setpriv --reuid U ...] /.gpulayer/lib/ld.so /.gpulayer/bin/env
           --default-signal=TERM,INT,HUP -- [LD_*=...] ENTRYPOINT... COMMAND...

The image's root is shared read-only by every task of that image; each task
writes to its own task dir (``/gpulayer/task``, ``$GPULAYER_OUTPUT_DIR``),
``/tmp`` and ``/dev/shm``. The host's ``setpriv`` and ``env`` (which drop to the
task user and give the command back the default signal handling) are bound in
under ``/.gpulayer`` with the libraries they need, and run through the host's
dynamic loader, so the image needs no libc of a kind. The job's ``LD_*``
variables are set by that inner ``env``, after the drop: the host's ``bwrap``
and ``setpriv`` never load what they name.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from .images import DEFAULT_PATH, ImageConfig, Prepared
from .sandbox import PASSED_SIGNALS, Sandbox, loader_variables
from .sandbox import _mount_point as mount_point

#: Where the task dir appears inside an image.
TASK_DIR = "/gpulayer/task"
HELPERS = "/.gpulayer"
_LDD_LINE = re.compile(r"(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)")
MAX_LINK_HOPS = 40
#: Host tools bound under /.gpulayer/bin of every image task for what enters it later (`gpulayer shell`).
ENTER_TOOLS = ("setsid",)


@functools.lru_cache(maxsize=8)
def _libraries(binary: str) -> tuple[str, ...]:
    """The shared objects ``binary`` loads (its loader last), from ``ldd``; () for a static one."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return ()
    done = subprocess.run([ldd, binary], capture_output=True, text=True, timeout=10)
    libs = [match.group(1) for line in done.stdout.splitlines() if (match := _LDD_LINE.search(line.strip()))]
    loaders = [lib for lib in libs if "/ld-linux" in lib or "/ld-musl" in lib or "/ld64" in lib]
    return tuple([lib for lib in libs if lib not in loaders] + loaders[:1])


def helper(binary: str) -> tuple[list[str], list[str]]:
    """bwrap mounts that put a host binary and its libraries under /.gpulayer, and the argv prefix that runs
    it there (through the host's loader when it is dynamic)."""
    name = os.path.basename(binary)
    mounts = ["--ro-bind", os.path.realpath(binary), f"{HELPERS}/bin/{name}"]
    libs = _libraries(os.path.realpath(binary))
    if not libs:
        return mounts, [f"{HELPERS}/bin/{name}"]
    for lib in libs[:-1]:
        mounts += ["--ro-bind", os.path.realpath(lib), f"{HELPERS}/lib/{os.path.basename(lib)}"]
    mounts += ["--ro-bind", os.path.realpath(libs[-1]), f"{HELPERS}/lib/ld.so"]
    return mounts, [f"{HELPERS}/lib/ld.so", "--library-path", f"{HELPERS}/lib", f"{HELPERS}/bin/{name}"]


def image_argv(config: ImageConfig, command: list[str]) -> list[str]:
    """The image's Entrypoint, then the job's command (which takes the place of the image's Cmd, as docker's)."""
    return [*config.entrypoint, *command]


def image_environment(config: ImageConfig) -> dict[str, str]:
    """The environment a task in this image starts from (the job's env and the agent's variables go on top)."""
    env = {"PATH": DEFAULT_PATH, "HOME": TASK_DIR, **config.env}
    return env


def inside(rootfs: Path, path: str) -> Path | None:
    """The host path of ``path`` inside the image, its symlinks resolved within the image; None if it is not there."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = done[:-1]
            continue
        host = rootfs.joinpath(*done, part)
        if host.is_symlink():
            hops += 1
            if hops > MAX_LINK_HOPS:
                return None
            target = os.readlink(host)
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            if target.startswith("/"):
                done = []
            continue
        if not host.exists() and not host.is_symlink():
            return None
        done.append(part)
    return rootfs.joinpath(*done)


def startable_in(prepared: Prepared, argv: list[str], env: dict[str, str], cwd: str) -> None:
    """Raise what exec would (FileNotFoundError 127, PermissionError 126) for a command missing from the image."""
    name = argv[0]
    dirs = [cwd] if "/" in name else env.get("PATH", DEFAULT_PATH).split(":")
    for folder in dirs:
        candidate = name if name.startswith("/") else f"{folder}/{name}"
        found = inside(prepared.rootfs, candidate)
        if found is None:
            continue
        if found.is_dir() or not os.access(found, os.X_OK):
            raise PermissionError(13, "Permission denied", name)
        return
    raise FileNotFoundError(2, "No such file or directory in the image", name)


def _top_mounts(rootfs: Path) -> list[str]:
    """The image's top-level entries, bound read-only over a fresh tmpfs root."""
    args: list[str] = ["--tmpfs", "/"]
    for entry in sorted(os.scandir(rootfs), key=lambda e: e.name):
        target = "/" + entry.name
        if entry.name in ("proc", "dev", "tmp", "gpulayer", HELPERS.strip("/")):
            continue
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), target]
        else:
            args += ["--ro-bind", entry.path, target]
    return args


def wrap_image(sandbox: Sandbox, prepared: Prepared, argv: list[str], env: dict[str, str], workdir: str, cwd: str, *,
               gpu_nodes: list[str], driver: list[str], network: bool = True,
               root_asked: bool = False) -> tuple[list[str], dict[str, str]]:
    """The argv that runs ``argv`` (already the image's entrypoint and the command) with the image as its root,
    and the environment to start it with (the job's ``LD_*`` variables moved to the inner ``env``'s arguments)."""
    if sandbox.bwrap is None:
        raise ValueError("an image needs the bwrap sandbox")
    user = sandbox.drops_to(root_asked)
    mounts = _top_mounts(prepared.rootfs)
    mounts += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
               "--perms", "1777", "--tmpfs", "/dev/shm"]
    for folder in (HELPERS, f"{HELPERS}/bin", f"{HELPERS}/lib", "/gpulayer"):
        mounts += ["--perms", "0755", "--dir", folder]
    mounts += ["--bind", workdir, TASK_DIR]
    for host, task, read_only in sandbox.binds:  # --sandbox-bind: under one of the image's folders, it must exist
        mounts += [*mount_point(task), "--ro-bind" if read_only else "--bind", host, task]
    drop: list[str] = []
    if user is not None:
        more, prefix = helper(sandbox.setpriv or shutil.which("setpriv") or "/usr/bin/setpriv")
        mounts += more
        drop = [*prefix, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
    more, run_env = helper(shutil.which(sandbox.env) or sandbox.env)
    mounts += more
    for tool in ENTER_TOOLS:  # what exec's shell runs inside (agent/relay_shell.py): setsid --ctty
        if (found := shutil.which(tool)) is not None:
            mounts += helper(found)[0]
    for node in gpu_nodes:
        mounts += ["--dev-bind-try", node, node]
    mounts += driver
    namespaces = ["--unshare-pid", "--unshare-ipc", "--die-with-parent"]
    if not network:
        namespaces.append("--unshare-net")
    outer, loader = loader_variables(env)
    wrapped = [sandbox.env, f"--ignore-signal={PASSED_SIGNALS}", sandbox.bwrap, *mounts, *namespaces,
               "--chdir", cwd, "--", *drop, *run_env, f"--default-signal={PASSED_SIGNALS}",
               "--", *loader, *argv]
    return wrapped, outer
