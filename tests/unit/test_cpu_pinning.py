"""`worker start --pin-cpus` (issue 40, point 3): the CPU lists' text (agent/cpusets.py), which CPUs each task
gets (agent/gpu/pinning.py) and the affinity a process started under `pinned` is born with."""
from __future__ import annotations

import subprocess

import pytest

from agent.cpusets import cpu_list, parse_cpu_list, pinned, readable_affinity
from agent.gpu.pinning import CpuPins, Held, choose, start

NODE0, NODE1 = frozenset(range(0, 8)), frozenset(range(8, 16))
ALL = NODE0 | NODE1
#: an 8-GPU box: GPUs 0-3 on NUMA node 0 (CPUs 0-7), 4-7 on node 1 (CPUs 8-15)
LOCAL = {g: NODE0 if g < 4 else NODE1 for g in range(8)}


@pytest.mark.parametrize("text, cpus", [("0-3,8", {0, 1, 2, 3, 8}), ("5", {5}), ("", set()), ("0-1,1-2\n", {0, 1, 2})])
def test_cpu_lists_read_as_the_kernel_writes_them(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "1-x"])
def test_a_bad_cpu_list_is_refused(text):
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_cpu_sets_written_as_ranges():
    assert cpu_list({8, 0, 1, 2, 3, 10}) == "0-3,8,10" and cpu_list([]) == "" and cpu_list({7}) == "7"


def test_a_gpu_task_gets_its_numa_node_and_the_union_across_nodes():
    assert choose(ALL, LOCAL, [1], 0, []) == NODE0
    assert choose(ALL, LOCAL, [5, 6], 0, []) == NODE1
    assert choose(ALL, LOCAL, [3, 4], 0, []) == ALL


def test_a_gpu_without_known_cpus_gets_the_whole_worker():
    assert choose(ALL, {}, [0], 0, []) == ALL
    assert choose(ALL, {0: frozenset({99})}, [0], 0, []) == ALL  # outside the worker's own affinity


def test_tasks_asking_cpus_split_their_node_without_overlap():
    first = choose(ALL, LOCAL, [0], 4, [])
    second = choose(ALL, LOCAL, [1], 3.5, [Held(first, True, True)])
    assert first == {0, 1, 2, 3} and second == {4, 5, 6, 7}
    # the node is full: a third overlaps the least-used CPUs, and never leaves its node
    third = choose(ALL, LOCAL, [2], 2, [Held(first, True, True), Held(second, True, True)])
    assert len(third) == 2 and third <= NODE0


def test_more_cpus_than_the_node_has_gives_the_node():
    assert choose(ALL, LOCAL, [0], 64, []) == NODE0


def test_a_task_without_a_count_avoids_counted_cpus_where_it_can():
    held = [Held(frozenset({0, 1, 2, 3}), True, True)]
    assert choose(ALL, LOCAL, [1], 0, held) == {4, 5, 6, 7}
    assert choose(ALL, LOCAL, [1], 0, [Held(NODE0, True, True)]) == NODE0  # none left: the whole node


def test_a_task_without_gpus_gets_the_cpus_no_gpu_task_holds():
    assert choose(ALL, LOCAL, [], 0, [Held(NODE0, True, False)]) == NODE1
    assert choose(ALL, LOCAL, [], 2, [Held(NODE0, True, False)]) == {8, 9}
    assert choose(ALL, LOCAL, [], 0, [Held(ALL, True, False)]) == ALL  # all held: all of them
    assert choose(ALL, LOCAL, [], 0, [Held(NODE0, False, True)]) == NODE1  # a counted CPU task's are avoided


def test_pins_are_taken_once_per_task_and_given_back():
    pins = CpuPins(ALL, LOCAL)
    one = pins.take(1, [0], 4)
    assert pins.take(1, [0], 4) == one  # a service's restart keeps its CPUs
    assert pins.take(2, [1], 4) == NODE0 - one
    pins.release(1)
    assert pins.take(3, [2], 4) == one


def test_local_cpus_are_kept_within_the_workers_own():
    pins = CpuPins(frozenset({0, 1}), {0: frozenset({0, 5}), 1: frozenset({6, 7})})
    assert pins.local == {0: {0}, 1: {0, 1}}


def test_pinning_where_the_affinity_cannot_be_read_runs_unpinned_and_says_so():
    pins, why = start(LOCAL, read=lambda: (None, "the CPU affinity of this machine cannot be read (no)"))
    assert pins is None and why == "--pin-cpus: the CPU affinity of this machine cannot be read (no): tasks run unpinned"
    pins, why = start(LOCAL, read=lambda: (ALL, None))
    assert pins is not None and why is None and pins.allowed == ALL


def test_a_process_started_under_pinned_is_born_on_those_cpus_and_the_thread_gets_its_own_back():
    mine, _ = readable_affinity()
    assert mine
    one = frozenset({min(mine)})
    with pinned(one):
        status = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"], capture_output=True, text=True)
    assert parse_cpu_list(status.stdout.split(":")[1]) == one
    assert readable_affinity()[0] == mine
    with pinned(None):
        assert readable_affinity()[0] == mine
