"""Each task in a bubblewrap sandbox: its own PID and IPC namespaces, a read-only system, an unprivileged uid.

``worker start --sandbox auto|bwrap|none`` picks it once, at start (`resolve`).
A sandboxed task's argv becomes::

    env --ignore-signal=TERM,INT,HUP,... bwrap [mounts] --unshare-pid --unshare-ipc --die-with-parent
        -- [setpriv --reuid U --regid G --clear-groups] env --default-signal=TERM,INT,HUP,... -- COMMAND

The outer ``env`` makes ``bwrap`` (the leader of the task's process group)
ignore the SIGTERM of a group kill (and a job's `--signal`, PASSED_SIGNALS): bwrap would otherwise die of it at once,
and with it (``--die-with-parent``) the whole sandbox, without the grace a
task gets to save its work. The inner ``env`` gives the command back the
default handling. The command's exit status comes back through bwrap (a death
by signal N as 128 + N), and SIGKILL of the group, or of the agent, ends the
PID namespace and so every process in it.

What the task sees: ``/`` read-only, a fresh ``/dev`` (plus the device nodes
of the GPUs it was given), ``/proc`` of its own namespace, its own ``/tmp``
and ``/dev/shm``, its working directory writable; the agent's state dir, the
control plane's home and the join token file are hidden by empty mounts. When
the agent runs as root, the task runs as ``--run-as`` (default the
``gpulayer-task`` user, created if missing, else ``nobody``); a directory on the
way to what it needs that this user could not traverse (``/root``) is hidden
too, and the interpreters a task may run (``--python``, the agent's own) bound
back read-only, as they are when they lie under the sandbox's own ``/tmp`` or
``/dev/shm`` (a venv in /tmp, issue 36). ``--sandbox-bind HOST[:TASK][:ro]`` (repeatable) binds more of
the host in, at TASK (default the same path): the fleet's /data or /scratch.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AgentError
from ..events import log_event

MODES = ("auto", "bwrap", "none")
#: What a worker runs with unless told (--sandbox): a sandbox for every task where bwrap works (the CLI's
#: worker start, join and up say the same literal; tests/agent/test_agent_sandbox.py checks they agree).
DEFAULT_MODE = "auto"
#: The user a root agent's tasks run as by default (created when missing; else NOBODY).
TASK_USER = "gpulayer-task"
NOBODY = "nobody"
#: Signals whose handling the sandbox's leader ignores and the command gets back as default: a group kill's
#: SIGTERM, and every signal a job may name for its warning or its stop (`--signal`, issue 27).
PASSED_SIGNALS = "TERM,INT,HUP,QUIT,USR1,USR2,ALRM,XCPU,XFSZ,VTALRM,PROF,PWR"
#: Device nodes every GPU task gets (where they exist), beside /dev/nvidia<N> of its own GPUs.
GPU_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                     "/dev/nvidia-caps")
#: The host folders a task has fresh ones of: an interpreter under them (a venv in /tmp) is bound back.
OWN_TMPFS = ("/tmp", "/dev/shm")
#: glibc's unsecvars.h beside LD_*: what it ignores in a setuid program, and the root tools that start a sandbox
#: never get (loader_variables): a gconv module, locale data, tunables or resolver files of the job's choosing.
UNSECURE_VARIABLES = frozenset({"GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
                                "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR",
                                "TZDIR"})
#: Seconds the start-up check of bwrap may take.
PROBE_TIMEOUT_S = 10.0


class SandboxError(AgentError):
    """``--sandbox bwrap`` (or ``--run-as``) that cannot work here, said in one line."""

    exit_code = 2


@dataclass(frozen=True)
class TaskUser:
    """Who a task runs as: a uid/gid to drop to (a root agent), or None (the agent's own)."""

    name: str
    uid: int
    gid: int


@dataclass
class Sandbox:
    """How this worker isolates its tasks (``mode`` "bwrap" or "none")."""

    mode: str = "none"
    bwrap: str | None = None
    env: str = "env"
    setpriv: str | None = None
    #: nsenter (util-linux), for the elements of one job to share one sandbox (shares()); None: each its own.
    nsenter: str | None = None
    user: TaskUser | None = None
    allow_root_tasks: bool = False
    #: Directories and files a task must not see.
    hidden: list[str] = field(default_factory=list)
    #: Read-only paths bound back under a hidden directory (interpreters).
    shown: list[str] = field(default_factory=list)
    #: --sandbox-bind: (host path, path in the task, read-only), bound in every task.
    binds: list[tuple[str, str, bool]] = field(default_factory=list)
    warning: str | None = None
    #: Why tasks' memory and CPUs are not capped (None: capped).
    limits: str | None = "cgroup limits not enforced"

    def isolation(self) -> dict:
        """What the worker reports of its isolation (inventory ``isolation``)."""
        report: dict = {"sandbox": self.mode, "user": self.user.name if self.user else None,
                        "root_tasks": self.allow_root_tasks, "limits": self.limits}
        if self.warning:
            report["warning"] = self.warning
        return report

    def summary(self) -> str:
        """One line for people: ``bwrap as gpulayer-task``, ``none (...)``."""
        if self.mode == "none":
            return "none" + (f" ({self.warning})" if self.warning else "")
        return "bwrap" + (f" as {self.user.name}" if self.user else "")

    def drops_to(self, root_asked: bool) -> TaskUser | None:
        """The user a task runs as; None for the agent's own (root only when allowed and asked)."""
        if self.mode == "none" or (root_asked and self.allow_root_tasks):
            return None
        return self.user

    def wrap(self, argv: list[str], workdir: str, *, gpu_nodes: list[str], network: bool = True,
             root_asked: bool = False, info_fd: int | None = None) -> list[str]:
        """The argv that runs ``argv`` in this sandbox (``argv`` itself with mode none); ``info_fd``: where bwrap
        writes its JSON with the sandbox init's pid (TaskProcess waits on that init for the namespace's end)."""
        if self.mode == "none" or self.bwrap is None:
            return argv
        user = self.drops_to(root_asked)
        info = ["--info-fd", str(info_fd)] if info_fd is not None else []
        return [self.env, f"--ignore-signal={PASSED_SIGNALS}", *self._bwrap(workdir, user, gpu_nodes, network), *info,
                "--", *self._drop(user), self.env, f"--default-signal={PASSED_SIGNALS}", "--", *argv]

    def _bwrap(self, workdir: str, user: TaskUser | None, gpu_nodes: list[str], network: bool) -> list[str]:
        """bwrap and its mounts and namespaces, ``workdir`` the one host directory bound writable."""
        mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                  "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
        targets = [task for _host, task, _ro in self.binds]
        blocked = untraversable([workdir, *self.shown, *targets], user) if user else []
        for path in blocked:
            mounts += ["--perms", "0755", "--tmpfs", path]
        covered = [*blocked, *OWN_TMPFS]  # what the task would not see of the interpreters: bound back
        for path in self.shown:
            if any(_under(path, top) for top in covered) and os.path.isdir(path):
                mounts += [*_mount_point(path), "--ro-bind", path, path]
        for path in self.hidden:
            if os.path.isdir(path):
                mounts += ["--perms", "0755", "--tmpfs", path]
            elif os.path.exists(path):
                mounts += ["--ro-bind", "/dev/null", path]
        for host, task, read_only in self.binds:
            mounts += [*_mount_point(task), "--ro-bind" if read_only else "--bind", host, task]
        mounts += [*_mount_point(workdir), "--bind", workdir, workdir]
        for node in gpu_nodes:
            mounts += ["--dev-bind-try", node, node]
        # No --new-session: the command must stay in the process group the agent signals.
        namespaces = ["--unshare-pid", "--unshare-ipc", "--die-with-parent"]
        if not network:
            namespaces.append("--unshare-net")
        return [str(self.bwrap), *mounts, *namespaces, "--chdir", workdir]

    def _drop(self, user: TaskUser | None, *extra: str) -> list[str]:
        return ([self.setpriv or "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", *extra]
                if user else [])

    # -- one sandbox shared by the elements of one job (agent/sandbox/shared.py) ----
    def shares(self, root_asked: bool) -> bool:
        """Whether elements of one job may share one sandbox here: a root agent dropping them to its task user,
        with nsenter to enter it (a non-root agent's sandbox is in a user namespace: each its own bwrap)."""
        return self.mode == "bwrap" and self.nsenter is not None and self.drops_to(root_asked) is not None

    def holder_argv(self, job_dir: str, *, network: bool, info_fd: int, launcher: list[str] | None = None) -> list[str]:
        """The argv of a job's shared sandbox: ``job_dir`` bound, its init's host pid written to ``info_fd``
        (bwrap's JSON), ``ready`` printed once its mounts are made, then, as the task user, the job's launcher
        (``launcher``: an interpreter and agent/sandbox/launcher_inside.py's source; agent/sandbox/launcher.py) on its stdin while
        it runs, and a sleep once it ended (or without one), so that later elements can still enter."""
        user = self.drops_to(False)
        script = "echo ready && exec sleep infinity"
        if launcher is not None:
            script = 'echo ready; "$0" -I -S -c "$1" gpulayer-launcher; exec sleep infinity </dev/null'
        return [*self._bwrap(job_dir, user, [], network), "--info-fd", str(info_fd), "--",
                *self._drop(user), "sh", "-c", script, *(launcher or [])]

    def spare_argv(self, box: str, *, bash: str, network: bool, info_fd: int, status_fd: int, argv_file: str) -> list[str]:
        """The argv of a sandbox made ahead for a plain task (agent/sandbox/spares.py): a task's own bwrap binding
        ``box``, the init's pid to ``info_fd``, whose command, as the task user, waits for a line on its stdin,
        then runs the NUL-separated argv of ``argv_file`` (the inner ``env`` and the command) as its child,
        without ``status_fd``, and writes its exit status there (128 + N for a death by signal N)."""
        user = self.drops_to(False)
        script = (f'IFS= read -r _ || exit 0; mapfile -d "" -t argv < "$1" || exit 126; '
                  f'"${{argv[@]}}" {status_fd}>&-; echo $? >&{status_fd}')
        return [self.env, f"--ignore-signal={PASSED_SIGNALS}", *self._bwrap(box, user, [], network),
                "--info-fd", str(info_fd), "--", *self._drop(user), bash, "-c", script, "gpulayer-spare", argv_file]

    def enter_argv(self, holder_pid: int, argv: list[str], workdir: str, *, network: bool,
                   loader: list[str] | None = None) -> list[str]:
        """The argv that runs ``argv`` inside the shared sandbox whose init is ``holder_pid``: nsenter (as the
        agent) joins its mount, PID and IPC namespaces (and network, when unshared) and roots at its root;
        setpriv drops to the task user with no new privileges, as bwrap's command has; ``env`` changes to
        ``workdir`` as seen inside (nsenter's own --wd would open it outside, leaving the task a directory
        above its root) and sets the job's ``LD_*`` (``loader``) there, never for the root nsenter."""
        user = self.drops_to(False)
        spaces = ["-m", "-p", "-i", *([] if network else ["-n"])]
        return [str(self.nsenter), "-t", str(holder_pid), *spaces, "-r", "--", *self._drop(user, "--no-new-privs"),
                self.env, f"--chdir={workdir}", *(loader or []), "--", *argv]

    def give(self, workdir: Path, root_asked: bool = False) -> None:
        """Make the working dir (and what is in it) the task user's, so that it can write there."""
        user = self.drops_to(root_asked)
        if user is None:
            return
        # Bottom up, the working dir last: each folder on the way to what is changed is still root's then, so an
        # element of the job sharing the sandbox cannot swap one for a link to a host folder (issue 36, item 2).
        for top, dirs, files in os.walk(workdir, topdown=False):
            for name in dirs + files:
                if top == str(workdir) and name == ".gpulayer-weights":
                    continue  # a hard link of the cached artifact: its owner is the cache's
                os.lchown(os.path.join(top, name), user.uid, user.gid)
        os.chown(workdir, user.uid, user.gid)


def loader_variables(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment to start bwrap with, without the dynamic loader's variables (``LD_PRELOAD``,
    ``LD_LIBRARY_PATH``, ``LD_AUDIT``, every ``LD_*``) and the others glibc ignores in a setuid program
    (UNSECURE_VARIABLES: ``GCONV_PATH``, ``LOCPATH``, ``GLIBC_TUNABLES``, ...), and those as ``NAME=VALUE``
    arguments for the inner ``env``: the job's (or its image's) ``LD_PRELOAD=./evil.so`` or ``GCONV_PATH`` would
    otherwise be honoured by the outer ``env``, ``setpriv``, ``nsenter`` and ``bwrap`` (root, outside the
    sandbox) before the sandbox exists."""
    outer: dict[str, str] = {}
    inside: list[tuple[str, str]] = []
    for name, value in env.items():  # one pass: this runs for every sandboxed task
        if name[:3] == "LD_" or name in UNSECURE_VARIABLES:
            inside.append((name, value))
        else:
            outer[name] = value
    return outer, [f"{name}={value}" for name, value in sorted(inside)]


def parse_bind(spec: str) -> tuple[str, str, bool]:
    """``HOST[:TASK][:ro]`` as (host, task, read_only): absolute paths, the host one existing; else SandboxError."""
    parts = spec.split(":")
    read_only = len(parts) > 1 and parts[-1] in ("ro", "rw")
    mode = parts.pop() if read_only else "rw"
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise SandboxError(f"--sandbox-bind {spec}: expected HOST[:TASK][:ro]")
    host, task = parts[0], parts[-1]
    if not (os.path.isabs(host) and os.path.isabs(task)):
        raise SandboxError(f"--sandbox-bind {spec}: paths must be absolute")
    if not os.path.exists(host):
        raise SandboxError(f"--sandbox-bind {spec}: no such path {host}")
    return os.path.normpath(host), os.path.normpath(task), mode == "ro"


def _mount_point(path: str) -> list[str]:
    """bwrap arguments that make ``path``'s parents where bwrap would make them (in a tmpfs) passable (0755)."""
    args: list[str] = []
    parts = Path(path).parts
    for depth in range(2, len(parts)):
        args += ["--perms", "0755", "--dir", os.path.join(*parts[:depth])]
    return args


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def traversable(path: str, user: TaskUser) -> bool:
    """Whether ``user`` may pass through directory ``path`` (its x bit for that user)."""
    try:
        info = os.stat(path)
    except OSError:
        return True
    if info.st_uid == user.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == user.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def untraversable(paths: list[str], user: TaskUser) -> list[str]:
    """The highest directories above ``paths`` that ``user`` cannot pass through (each once, parents first)."""
    found: list[str] = []
    for path in paths:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            ancestor = os.path.join(*parts[:depth])
            if any(_under(ancestor, top) for top in found):
                break
            if not traversable(ancestor, user):
                found.append(ancestor)
                break
    return sorted(found, key=lambda p: (p.count("/"), p))


def gpu_nodes(minors: list[int], dev: str = "/dev") -> list[str]:
    """The device nodes a task given the GPUs of these minor numbers needs; [] for a task without GPUs."""
    if not minors:
        return []
    nodes = [f"{dev}/nvidia{minor}" for minor in sorted(set(minors))]
    return nodes + [node.replace("/dev", dev, 1) for node in GPU_CONTROL_NODES]


def task_user(name: str | None) -> TaskUser | None:
    """The user a root agent's tasks run as; None when the agent is not root (tasks run as it).

    No name: ``gpulayer-task``, created (a system user without a home or shell) when missing, else ``nobody``.
    Raises SandboxError for a named user that does not exist or is root.
    """
    if os.geteuid() != 0:
        return None
    if name:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise SandboxError(f"--run-as {name}: no such user") from None
        if entry.pw_uid == 0:
            raise SandboxError(f"--run-as {name}: that is root; use --allow-root-tasks for jobs that ask for root")
        return TaskUser(name, entry.pw_uid, entry.pw_gid)
    for candidate in (TASK_USER, NOBODY):
        try:
            entry = pwd.getpwnam(candidate)
            return TaskUser(candidate, entry.pw_uid, entry.pw_gid)
        except KeyError:
            if candidate == TASK_USER and _create_user(TASK_USER):
                return task_user(TASK_USER)
    raise SandboxError("no user to run tasks as: create one, or pass --run-as USER")


def _create_user(name: str) -> bool:
    useradd = shutil.which("useradd")
    if useradd is None:
        return False
    done = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
    if done.returncode == 0:
        log_event("task_user_created", user=name)
    return done.returncode == 0 or _exists(name)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def cgroup_limits(root: str = "/sys/fs/cgroup") -> str:
    """Why tasks' memory and CPUs are not capped here (caps need a delegated cgroup v2 subtree)."""
    if not os.path.exists(os.path.join(root, "cgroup.controllers")):
        return f"cgroup limits not enforced: no cgroup v2 hierarchy at {root}"
    return "cgroup limits not enforced: not implemented yet"


def probe(bwrap: str, env: str) -> str | None:
    """Run ``true`` in a sandbox like a task's; None when it works, else bwrap's complaint."""
    argv = [env, f"--ignore-signal={PASSED_SIGNALS}", bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return None


def resolve(mode: str, *, run_as: str | None = None, allow_root_tasks: bool = False, hidden: list[str] | None = None,
            shown: list[str] | None = None, binds: list[str] | None = None) -> Sandbox:
    """The sandbox of ``--sandbox MODE``; SandboxError when ``bwrap`` was asked for and cannot work, or a bind is bad.

    ``auto`` without a working bwrap gives mode none with a ``warning`` (logged, and in the inventory).
    Without a sandbox tasks see the host as it is: binds are checked, not made.
    """
    if mode not in MODES:
        raise SandboxError(f"--sandbox {mode}: expected one of {', '.join(MODES)}")
    bound = [parse_bind(spec) for spec in binds or []]
    if mode == "none":
        return Sandbox(mode="none", allow_root_tasks=allow_root_tasks)
    bwrap, env = shutil.which("bwrap"), shutil.which("env")
    problem: str | None
    if not sys.platform.startswith("linux"):
        problem = "bubblewrap sandboxes need Linux"
    elif bwrap is None:
        problem = "bwrap is not installed (Debian package bubblewrap)"
    elif env is None:
        problem = "no env command"
    else:
        problem = probe(bwrap, env)
    if problem is not None or bwrap is None:
        if mode == "bwrap":
            raise SandboxError(f"--sandbox bwrap: {problem}")
        warning = f"tasks are not sandboxed: {problem or 'no bwrap'}"
        log_event("sandbox_unavailable", level=30, warning=warning)
        return Sandbox(mode="none", allow_root_tasks=allow_root_tasks, warning=warning)
    user = task_user(run_as)
    setpriv = shutil.which("setpriv")
    if user is not None and setpriv is None:
        raise SandboxError("no setpriv command (Debian package util-linux): a root agent's tasks cannot drop root")
    sandbox = Sandbox(mode="bwrap", bwrap=bwrap, env=env or "env", setpriv=setpriv, nsenter=shutil.which("nsenter"),
                      user=user,
                      allow_root_tasks=allow_root_tasks, hidden=sorted(set(hidden or [])),
                      shown=sorted(set(shown or [])), binds=bound, limits=cgroup_limits())
    log_event("sandbox", mode=sandbox.mode, user=user.name if user else None, root_tasks=allow_root_tasks,
              limits=sandbox.limits)
    return sandbox


def gpu_minors(device_ids: list[str], devices: dict) -> list[int]:
    """Each GPU index's ``/dev/nvidia<N>`` number: its NVML device's GPU (a MIG instance's parent), else its
    CUDA id when that is a number, else the index itself."""
    minors = []
    for index, cuda_id in enumerate(device_ids):
        device = devices.get(index)
        minors.append(device.gpu if device is not None else int(cuda_id) if cuda_id.isdigit() else index)
    return minors


def startable(argv: list[str], env: dict[str, str], cwd: str) -> None:
    """Raise what exec would (FileNotFoundError, PermissionError) for a command that cannot start.

    In a sandbox the agent starts bwrap, not the command: this keeps "cannot start 'x'" (127, 126) as it was.
    """
    name = argv[0]
    path = os.path.join(cwd, name) if os.sep in name else _which(name, env.get("PATH", os.defpath))
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", name)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(13, "Permission denied", name)


#: (name, PATH) -> (where shutil.which found it, when): an array's elements all start the same command, and the
#: walk along PATH (a stat per folder) was a tenth of an element's CPU in the agent. Kept WHICH_TTL_S; what it
#: found is checked again at each use (exists, executable), so only a command put earlier on PATH meanwhile is
#: missed for that long, and the task's own exec finds it anyway.
_WHICH: dict[tuple[str, str], tuple[str | None, float]] = {}
WHICH_TTL_S = 1.0


def _which(name: str, path: str) -> str | None:
    now = time.monotonic()
    known = _WHICH.get((name, path))
    if known is not None and now - known[1] < WHICH_TTL_S and known[0] is not None:
        return known[0]
    found = shutil.which(name, path=path)
    if len(_WHICH) > 256:
        _WHICH.clear()
    _WHICH[(name, path)] = (found, now)
    return found
