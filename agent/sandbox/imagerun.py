"""Running a task with an OCI image as its root, in the worker's bubblewrap sandbox.

The argv is the sandbox's (agent/sandbox/bwrap.py) with the image in place of the host's ``/``::

    env --ignore-signal=TERM,INT,HUP
        [bwrap --ro-bind / / --dev-bind /dev /dev --tmpfs /tmp --ro-bind ROOTFS /tmp/.gpulayer-image/0
            --bind TASKDIR /tmp/.gpulayer-image/1 ... --die-with-parent -- setpriv --ruid U --regid G --clear-groups]
        bwrap --tmpfs / --ro-bind <ROOTFS>/<each top entry> /<entry> ... --proc /proc --dev /dev --tmpfs /tmp
            --bind <TASKDIR> /gpulayer/task [GPU nodes, driver libs] --remount-ro / --unshare-pid --unshare-ipc
            --die-with-parent --chdir CWD
        -- /.gpulayer/lib/ld.so /.gpulayer/bin/env --default-signal=TERM,INT,HUP -- [LD_*=...] ENTRYPOINT... COMMAND...

The image's root is shared read-only by every task of that image; each task
writes to its own task dir (``/gpulayer/task``, ``$GPULAYER_OUTPUT_DIR``),
``/tmp`` and ``/dev/shm``.

Under a root agent nothing of the image runs before the task is its user
(issue 36): the bwrap that makes the image's root is started by ``setpriv``
with the task user's real uid and root's effective one, which is bwrap's
setuid mode: it makes the mounts, then becomes the task user (uid, gid, no
groups, no capability, an empty bounding set, no_new_privs) before it execs
anything there. As it opens its sources as that user, an outer bwrap (root,
the host's root read-only, only the host's ``bwrap`` and ``setpriv`` run in
it) first binds the image's root, the task dir and the ``--sandbox-bind``
paths under a tmpfs of its own (``Sources``): the image cache and the state
dir stay closed to the task user. exec, shell and SSH enter the inner
sandbox's init (relay_exec.sandbox_init_pid).

The host's ``env`` (which gives the command back the default signal
handling) is bound in under ``/.gpulayer`` with the libraries it needs, and
run through the host's dynamic loader, so the image needs no libc of a kind;
it is the first program in the image's root, as the task user already, so
an image's ``/etc/ld.so.preload`` or loader cache is the task's own code,
never root's. The job's ``LD_*`` variables are set by that inner ``env``:
the host's ``bwrap`` and ``setpriv`` never load what they name.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from .bwrap import PASSED_SIGNALS, Sandbox, loader_variables
from .bwrap import _mount_point as mount_point
from .images import DEFAULT_PATH, ImageConfig, Prepared

#: Where the task dir appears inside an image.
TASK_DIR = "/gpulayer/task"
HELPERS = "/.gpulayer"
_LDD_LINE = re.compile(r"(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)")
MAX_LINK_HOPS = 40
#: Where a root agent's outer bwrap binds the host paths of an image task (Sources), in a tmpfs of its own.
STAGE = "/tmp/.gpulayer-image"
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


class Sources:
    """The host paths an image task's sandbox binds, as its bwrap names them: the paths themselves, or, where
    that bwrap starts as the task user (``staged``), where an outer bwrap (root, the host's tools only) bound
    them under STAGE (``outer``): the task user need not be able to enter the image cache or the state dir."""

    def __init__(self, staged: bool):
        self.staged = staged
        self.outer: list[str] = ["--perms", "0755", "--dir", STAGE] if staged else []
        self.count = 0

    def source(self, host: str, writable: bool = False) -> str:
        if not self.staged:
            return host
        place = f"{STAGE}/{self.count}"
        self.count += 1
        self.outer += ["--bind" if writable else "--ro-bind", host, place]
        return place

    def rewrite(self, args: list[str]) -> list[str]:
        """bwrap arguments with each ``--bind``/``--ro-bind SRC DEST``'s SRC as this sandbox names it."""
        out: list[str] = []
        at = 0
        while at < len(args):
            if args[at] in ("--bind", "--ro-bind"):
                out += [args[at], self.source(args[at + 1], args[at] == "--bind"), args[at + 2]]
                at += 3
            else:
                out.append(args[at])
                at += 1
        return out


def _top_mounts(rootfs: Path, sources: Sources) -> list[str]:
    """The image's top-level entries, bound read-only over a fresh tmpfs root."""
    args: list[str] = ["--tmpfs", "/"]
    root = sources.source(str(rootfs))
    for entry in sorted(os.scandir(rootfs), key=lambda e: e.name):
        target = "/" + entry.name
        if entry.name in ("proc", "dev", "tmp", "gpulayer", HELPERS.strip("/")):
            continue
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), target]
        else:
            args += ["--ro-bind", f"{root}/{entry.name}", target]
    return args


def staged(sandbox: Sandbox, root_asked: bool) -> bool:
    """Whether an image task's bwrap starts as the task user, its host paths bound by an outer one (Sources)."""
    return sandbox.drops_to(root_asked) is not None


def wrap_image(sandbox: Sandbox, prepared: Prepared, argv: list[str], env: dict[str, str], workdir: str, cwd: str, *,
               gpu_nodes: list[str], driver: list[str], network: bool = True,
               root_asked: bool = False) -> tuple[list[str], dict[str, str]]:
    """The argv that runs ``argv`` (already the image's entrypoint and the command) with the image as its root,
    and the environment to start it with (the job's ``LD_*`` variables moved to the inner ``env``'s arguments).

    Under a root agent the bwrap that makes the image's root starts as the task user (module docstring) and
    becomes it, without a capability and with no_new_privs, before it execs anything: nothing of the image
    (its ``/etc/ld.so.preload``, its loader cache, a binary) runs as root (issue 36)."""
    if sandbox.bwrap is None:
        raise ValueError("an image needs the bwrap sandbox")
    user = sandbox.drops_to(root_asked)
    sources = Sources(staged=staged(sandbox, root_asked))
    mounts = _image_mounts(sandbox, prepared, workdir, sources) + sources.rewrite(driver)
    more, run_env = helper(shutil.which(sandbox.env) or sandbox.env)
    mounts += more
    for tool in ENTER_TOOLS:  # what exec's shell runs inside (agent/relay/shell.py): setsid --ctty
        if (found := shutil.which(tool)) is not None:
            mounts += helper(found)[0]
    for node in gpu_nodes:
        mounts += ["--dev-bind-try", node, node]
    namespaces = ["--unshare-pid", "--unshare-ipc", "--die-with-parent"]
    if not network:
        namespaces.append("--unshare-net")
    outer, loader = loader_variables(env)
    inner = [sandbox.bwrap, *mounts, "--remount-ro", "/", *namespaces, "--chdir", cwd,
             "--", *run_env, f"--default-signal={PASSED_SIGNALS}", "--", *loader, *argv]
    if user is not None:  # the stage, then the task user's real uid and root's effective one: bwrap's setuid mode
        inner = [sandbox.bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--tmpfs", "/tmp", *sources.outer,
                 "--die-with-parent", "--", sandbox.setpriv or "setpriv", f"--ruid={user.uid}", f"--regid={user.gid}",
                 "--clear-groups", *inner]
    return [sandbox.env, f"--ignore-signal={PASSED_SIGNALS}", *inner], outer


def _image_mounts(sandbox: Sandbox, prepared: Prepared, workdir: str, sources: Sources) -> list[str]:
    """The image's root, the sandbox's own /proc, /dev, /tmp and /dev/shm, the task dir and --sandbox-bind."""
    mounts = _top_mounts(prepared.rootfs, sources)
    mounts += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
               "--perms", "1777", "--tmpfs", "/dev/shm"]
    for folder in (HELPERS, f"{HELPERS}/bin", f"{HELPERS}/lib", "/gpulayer"):
        mounts += ["--perms", "0755", "--dir", folder]
    mounts += ["--bind", sources.source(workdir, writable=True), TASK_DIR]
    for host, task, read_only in sandbox.binds:  # --sandbox-bind: under one of the image's folders, it must exist
        mounts += [*mount_point(task), "--ro-bind" if read_only else "--bind", sources.source(host, not read_only), task]
    return mounts
