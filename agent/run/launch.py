"""How a task's process starts: its working dir, artifacts, image and weights, its sandbox and environment, the spawn.

Where it starts is chosen once, when its working dir is made (agent/run/place.py): a spare sandbox made ahead
(agent/sandbox/spares.py), its job's shared one (agent/sandbox/shared.py), an image's root (agent/sandbox/imagerun.py),
a bwrap of its own, or no sandbox; the launch follows that choice. TaskSetupError says why a task cannot be set up.
"""
import os
import select
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpulayer.protocol import plural

from ..artifacts.bundle import empty_dir, place_file, unpack_bundle
from ..artifacts.caps import UnpackBudget, UnpackLimit
from ..artifacts.checkpoint import DIR_NAME as CHECKPOINT_DIR
from ..cpusets import cpu_list
from ..errors import TaskSetupError
from ..events import log_event
from ..sandbox import cdi
from ..sandbox.bwrap import gpu_nodes, loader_variables, startable
from ..sandbox.imagerun import TASK_DIR, image_argv, image_environment, startable_in, wrap_image
from ..sandbox.images import ImageCache, Prepared
from ..sandbox.launcher import Launched
from ..sandbox.process import TaskProcess
from ..sandbox.spares import MadeAhead
from .environment import task_argv, task_environment
from .place import Place, place
from .reports import TaskReports
from .supervision import TaskResult


@dataclass
class Start:
    """How a task's command starts (TaskLaunch._launch), as TaskProcess takes it."""

    argv: list[str]
    env: dict[str, str]
    #: Already running: forked by the job's launcher, or started in a spare.
    started: Launched | MadeAhead | None = None
    #: Entered into the job's shared sandbox by nsenter.
    entered: bool = False
    #: bwrap's --info-fd pipe (read, write) for a sandbox of its own; TaskProcess closes both.
    info: tuple[int, int] | None = None
    #: A spare's sandbox init's pidfd, the task's process's now.
    init_pidfd: int | None = None


class TaskLaunch(TaskReports):
    """The runner's setup and the start of its command."""

    def _prepare_dir(self) -> None:
        """Choose where the task starts (agent/run/place.py), once, and make its working dir there."""
        ctx = self.ctx
        self.place = place(self.assignment, ctx.sandbox, ctx.tasks_dir, ctx.shared, ctx.spares)
        self.checkpoint = self._checkpointer()  # in the place's working dir
        try:
            self.workdir.mkdir(parents=True)
        except FileExistsError:  # left by an agent killed before (or --keep-task-dirs): made afresh
            shutil.rmtree(self.workdir)
            self.workdir.mkdir()

    def _materialize(self) -> None:
        """Fetch and place the source bundle, the inputs and the weights (weights are linked, not capped)."""
        if self.assignment.image is not None:
            self._prepare_image()
        budget = self.ctx.unpack_caps.fresh()
        try:
            self._place_artifacts(budget)
        except UnpackLimit:
            empty_dir(self.workdir)
            raise
        weights = self.assignment.service.weights if self.assignment.service else None
        if weights:
            self.weights = self._link_weights(self.ctx.cache.get(weights))
        self.restored_from = self.checkpoint.prepare(self.assignment.checkpoint)

    def _checkpoint_env(self, extra: dict[str, str], root: str) -> None:
        extra.setdefault("GPULAYER_CHECKPOINT_DIR", f"{root}/{CHECKPOINT_DIR}")
        if self.restored_from is not None:
            extra.setdefault("GPULAYER_RESTORED_FROM_ATTEMPT", str(self.restored_from))

    def _prepare_image(self) -> None:
        """Fetch and unpack (or find in the cache) the job's image: TaskSetupError with the reason."""
        if self.ctx.sandbox.mode == "none":
            raise TaskSetupError("an image job needs a sandbox, and this worker runs tasks without one (--sandbox)")
        if self.ctx.images is None:
            self.ctx.images = ImageCache(self.ctx.cache)
        assert self.assignment.image is not None
        self.image = self.ctx.images.prepare(self.assignment.image, self.shipper.system)
        if self.assignment.gpus:
            try:
                self.driver = cdi.driver_mounts(cdi.load([str(n) for n in self._gpu_numbers()]))
            except (cdi.CdiError, OSError) as exc:
                raise TaskSetupError(f"the GPU driver's files for the image: {exc}") from None

    def _gpu_numbers(self) -> list[int]:
        minors = self.ctx.gpu_minors
        return [minors[i] if 0 <= i < len(minors) else i for i in self.assignment.gpus]

    def _place_artifacts(self, budget: UnpackBudget) -> None:
        source = self.assignment.source
        if source:
            count = unpack_bundle(self.ctx.cache.get(source, budget.max_bytes), self.workdir, budget)
            self.shipper.system(f"source bundle {source} unpacked: {plural(count, 'entry', 'entries')}")
        for relative, digest in sorted(self.assignment.inputs.items()):
            place_file(self.ctx.cache.get(digest, budget.max_bytes), self.workdir, relative, "input", budget)

    def _link_weights(self, cached: Path) -> str:
        """A hard link of the cached weights in the working dir, safe from eviction; a copy when the task runs as
        the agent's own user, which could change a linked file's bytes (owner of the inode) under the cache."""
        target = self.workdir / ".gpulayer-weights"
        user = self.ctx.sandbox.drops_to(self.assignment.run_as_root)
        try:
            if user is None or user.uid == os.geteuid():
                raise PermissionError("the task runs as the cache's owner")
            os.link(cached, target)
        except OSError:
            shutil.copyfile(cached, target)
        return str(target)

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        """The task's environment with ``extra`` (PORT, MASTER_*) on top."""
        extra = {**self.ctx.gpu_share_env(self.assignment), **extra}
        self._checkpoint_env(extra, TASK_DIR if self.image is not None else str(self.workdir))
        if self.image is not None:
            if self.weights:
                extra["GPULAYER_WEIGHTS"] = f"{TASK_DIR}/.gpulayer-weights"
            return task_environment(image_environment(self.image.config), self.assignment, TASK_DIR,
                                    self.ctx.device_ids, None, extra)
        if self.weights:
            extra["GPULAYER_WEIGHTS"] = self.weights
        return task_environment(
            self.ctx.base_env, self.assignment, str(self.workdir), self.ctx.device_ids, self.ctx.python, extra
        )

    def spawn(self, extra: dict[str, str], quick_exit_s: float = 0.0) -> "TaskProcess | TaskResult":
        """Start the command; a command that cannot start gives a failed result (126/127).

        ``quick_exit_s``: wait that long for the process to end before sending the start; one that ended
        by then sends none (its finish carries it, ``start_pid``).
        """
        if self.image is not None:
            weights = f"{TASK_DIR}/.gpulayer-weights" if self.weights else None
            argv = image_argv(self.image.config, task_argv(list(self.assignment.command), None, weights))
        else:
            argv = task_argv(list(self.assignment.command), self.ctx.python, self.weights)
        cpus = self._pinned_cpus()
        if cpus is not None:
            extra = {**extra, "GPULAYER_CPUS": cpu_list(cpus)}
        self.extra_env = dict(extra)
        try:
            start = self._launch(argv, self.environment(extra), cpus)
            quick = quick_exit_s > 0 and not self.pid_reported  # its output is read here if it ends that soon
            proc = TaskProcess(start.argv, start.env, str(self.workdir), self.shipper.add,
                               sandboxed=self._placed().own_sandbox, entered=start.entered, started=start.started,
                               info=start.info, init_pidfd=start.init_pidfd, cpus=cpus, defer_readers=quick)
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self.shipper.system(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
            if not self.started:
                self._send_start(None)
            return TaskResult(code, "failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}")
        log_event("task_started", task_id=self.task_id, pid=proc.pid)
        if self.ctx.running is not None:
            self.ctx.running.add(self.workdir.name, proc.pid)
        if not self.pid_reported:  # a gang rank sent its start before the rendezvous, without a pid
            self.started = self.pid_reported = True
            if quick_exit_s > 0 and _ended_within(proc, quick_exit_s):
                self.start_pid = proc.pid
            else:
                proc.start_readers()
                self._report_start(proc.pid)
        return proc

    def _pinned_cpus(self) -> frozenset[int] | None:
        """--pin-cpus: the CPUs the task's processes run on (said once in its log); None: unpinned."""
        cpus = self.ctx.pin_cpus(self.task_id, list(self.assignment.gpus), self.assignment.cpus)
        if cpus is not None and self.cpus is None:
            self.shipper.system(f"pinned to CPUs {cpu_list(cpus)}")
        self.cpus = cpus
        return cpus

    def _placed(self) -> Place:
        assert self.place is not None, "spawn() before _prepare_dir()"
        return self.place

    def _isolate(self) -> None:
        """Hand the working dir to the task's user; TaskSetupError for a job this worker cannot isolate as asked."""
        if self.assignment.network == "none" and self.ctx.sandbox.mode == "none":
            raise TaskSetupError("network none needs a sandbox, and this worker runs tasks without one (--sandbox)")
        self.ctx.sandbox.give(self.workdir, self.assignment.run_as_root)

    def _launch(self, argv: list[str], env: dict[str, str], cpus: frozenset[int] | None = None) -> Start:
        """How ``argv`` starts in the task's place, and the environment to start it with: in a sandbox, the job's
        ``LD_*`` set inside, by the inner ``env`` (raises what exec would for a command that cannot start).
        ``cpus``: what a process started elsewhere (a spare's, the job's launcher's) is to run on."""
        where = self._placed()
        if where.way == "image":
            assert self.image is not None
            return Start(*self._launch_image(self.image, argv, env))
        if where.way == "unsandboxed":
            return Start(argv, env)
        startable(argv, env, str(self.workdir))
        outer, loader = loader_variables(env)
        if where.way in ("launcher", "nsenter"):
            return self._launch_shared(where, argv, env, outer, loader, cpus)
        if where.way == "spare":  # made ahead: the command is all that starts
            assert where.spare is not None and self.ctx.spares is not None
            made_ahead = self.ctx.spares.start(where.spare, argv, env, str(self.workdir), cpus)
            init_pidfd, where.spare.init_pidfd = where.spare.init_pidfd, None  # the task's process's now
            return Start(argv, env, started=made_ahead, init_pidfd=init_pidfd)
        info = os.pipe()  # bwrap's --info-fd: the sandbox init's pid, whose end is the namespace's
        try:
            wrapped = self.ctx.sandbox.wrap([*loader, *argv], str(self.workdir), gpu_nodes=gpu_nodes(self._gpu_numbers()),
                                            network=where.network, root_asked=self.assignment.run_as_root,
                                            info_fd=info[1])
        except BaseException:
            for fd in info:
                os.close(fd)
            raise
        return Start(wrapped, outer, info=info)

    def _launch_shared(self, where: Place, argv: list[str], env: dict[str, str], outer: dict[str, str],
                       loader: list[str], cpus: frozenset[int] | None = None) -> Start:
        """Into the job's sandbox: forked by its launcher, or entered by nsenter (two execs, no bwrap)."""
        shared = self.ctx.shared
        assert where.holder is not None and shared is not None
        try:
            pid = shared.started(where.holder)
        except TaskSetupError as exc:
            raise OSError(str(exc)) from None
        if where.way == "launcher":
            launched = shared.launch(where.holder, argv, env, str(self.workdir), self.shipper.system, cpus)
            if launched is not None:  # forked inside by the job's launcher, already running
                return Start(argv, env, started=launched)
        return Start(self.ctx.sandbox.enter_argv(pid, argv, str(self.workdir), network=where.network, loader=loader),
                     outer, entered=True)

    def image_place(self, env: dict[str, str]) -> tuple[dict[str, str], str]:
        """An image job's environment (with the GPU driver's files) and working directory as its task sees them:
        where the task starts, and where exec, shell and SSH enter it (agent/relay/exec.py)."""
        assert self.image is not None
        workdir = self.image.config.workdir
        cwd = workdir if workdir and not (self.assignment.source or self.assignment.inputs) else TASK_DIR
        if self.driver is not None:
            env = {**self.driver[1], **env}
            env["LD_LIBRARY_PATH"] = ":".join(filter(None, [env.get("LD_LIBRARY_PATH"), f"{cdi.DRIVER_DIR}/lib"]))
            env["PATH"] = f"{env.get('PATH', '')}:{cdi.DRIVER_DIR}/bin"
        return env, cwd

    def _launch_image(self, image: Prepared, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """``argv`` in the sandbox with the image as its root, and the environment bwrap starts with (raises what
        exec would for a command the image lacks)."""
        env, cwd = self.image_place(env)
        startable_in(image, argv, env, cwd)
        driver = self.driver[0] if self.driver is not None else []
        return wrap_image(self.ctx.sandbox, image, argv, env, str(self.workdir), cwd,
                          gpu_nodes=gpu_nodes(self._gpu_numbers()),
                          driver=driver, network=self._placed().network,
                          root_asked=self.assignment.run_as_root)




def _ended_within(proc: TaskProcess, seconds: float) -> bool:
    """Whether the process (its leader) ended within ``seconds``; it is reaped then.

    A pidfd wakes at the exit itself; Popen.wait's timeout polls at growing intervals (0.5, 1, 2, 4 ms...).
    """
    if isinstance(proc.popen, MadeAhead):  # its end is the status bash writes, not bwrap's exit
        try:
            proc.popen.wait(seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+: poll
        fd = None
    try:
        if fd is None:
            proc.popen.wait(timeout=seconds)
        elif select.select([fd], [], [], seconds)[0]:
            proc.popen.wait()  # it has exited: reaped at once
        else:
            return False
        return True
    except subprocess.TimeoutExpired:
        return False
    finally:
        if fd is not None:
            os.close(fd)
