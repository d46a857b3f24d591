"""Where a task starts (agent/run/place.py): one choice among the ways, made once, and what it holds.

The ways themselves run for real in tests/agent/test_agent_spares.py, tests/integration/test_sandbox.py,
test_shared_sandbox.py, test_launcher.py and test_images.py; here, only the choice.
"""
from dataclasses import replace
from pathlib import Path

from agent.run.place import Place, place, unplace
from gpulayer.protocol.assignment import Assignment
from gpulayer.protocol.jobspec import ImageSpec

TASKS = Path("/tasks")
PLAIN = Assignment(task_id=7, job_id=3, attempt=2, command=["true"])
ELEMENT = replace(PLAIN, array_index=0)


class FakeSandbox:
    def __init__(self, mode="bwrap", shares=True):
        self.mode, self._shares = mode, shares

    def shares(self, root_asked):
        return self._shares and not root_asked


class FakeHolder:
    def __init__(self, job_dir):
        self.job_dir = job_dir


class FakeShared:
    def __init__(self, python="python3"):
        self.python, self.held, self.released = python, [], []

    def hold(self, job_id, network):
        self.held.append((job_id, network))
        return FakeHolder(TASKS / f"job-{job_id}{'' if network else '-netless'}")

    def release(self, holder):
        self.released.append(holder)


class FakeSpare:
    box = Path("/tasks/spare-1")


class FakeSpares:
    def __init__(self, ready=True):
        self.ready, self.taken, self.done_with = ready, [], []

    def take(self, network):
        self.taken.append(network)
        return FakeSpare() if self.ready else None

    def done(self, spare):
        self.done_with.append(spare)


def test_a_worker_without_a_sandbox_starts_the_command_as_it_is():
    where = place(PLAIN, FakeSandbox(mode="none", shares=False), TASKS, None, None)
    assert where == Place("unsandboxed", TASKS / "7-2", True)
    assert not where.own_sandbox


def test_a_plain_task_takes_a_ready_spare_and_its_dir_is_in_the_spares_box():
    spares = FakeSpares()
    where = place(PLAIN, FakeSandbox(), TASKS, FakeShared(), spares)
    assert (where.way, where.workdir, where.holder) == ("spare", FakeSpare.box / "7-2", None)
    assert spares.taken == [True] and where.own_sandbox
    unplace(where, None, spares)
    assert spares.done_with == [where.spare]


def test_with_no_spare_ready_a_plain_task_gets_a_bwrap_of_its_own():
    where = place(replace(PLAIN, network="none"), FakeSandbox(), TASKS, None, FakeSpares(ready=False))
    assert where == Place("bwrap", TASKS / "7-2", False)


def test_what_may_not_use_a_spare_gets_a_bwrap_of_its_own_without_asking_for_one():
    spares = FakeSpares()
    for task in (replace(PLAIN, gpus=[0]), replace(PLAIN, world_size=2), replace(PLAIN, run_as_root=True)):
        assert place(task, FakeSandbox(), TASKS, None, spares).way == "bwrap"
    assert spares.taken == []


def test_an_array_element_holds_its_jobs_shared_sandbox_through_the_launcher_or_nsenter():
    shared = FakeShared()
    where = place(ELEMENT, FakeSandbox(), TASKS, shared, FakeSpares())
    assert (where.way, where.workdir) == ("launcher", TASKS / "job-3" / "7-2")
    assert shared.held == [(3, True)] and not where.own_sandbox
    netless = place(replace(ELEMENT, network="none"), FakeSandbox(), TASKS, FakeShared(python=None), None)
    assert (netless.way, netless.workdir) == ("nsenter", TASKS / "job-3-netless" / "7-2")
    unplace(where, shared, None)
    assert shared.released == [where.holder]


def test_an_element_the_sandbox_cannot_share_is_placed_as_a_task_of_its_own():
    shared = FakeShared()
    assert place(ELEMENT, FakeSandbox(shares=False), TASKS, shared, None).way == "bwrap"
    assert place(replace(ELEMENT, run_as_root=True), FakeSandbox(), TASKS, shared, None).way == "bwrap"
    assert shared.held == []


def test_an_image_job_starts_in_its_image_whatever_else_it_could_share():
    shared, spares = FakeShared(), FakeSpares()
    where = place(replace(ELEMENT, image=ImageSpec(ref="busybox")), FakeSandbox(), TASKS, shared, spares)
    assert where == Place("image", TASKS / "7-2", True) and where.own_sandbox
    assert shared.held == [] and spares.taken == []
