"""The autoscaler's decision (scheduler/autoscale.py `decide`) and its memory (runtime/autoscale.py `Windows`),
pure: no state file, no process."""
from __future__ import annotations

from gpulayer.server.runtime.autoscale import Windows
from gpulayer.server.scheduler.autoscale import Replica, Service, decide

SCALE = {"min": 1, "max": 4, "target_concurrency": 2.0, "up_after_s": 10, "down_after_s": 60}


def _service(n: int, ready: int | None = None, draining: int = 0, **scale) -> Service:
    ready = n if ready is None else ready
    live = [Replica(i + 1, i, "running", i < ready, False) for i in range(n)]
    gone = [Replica(100 + i, n + i, "running", False, True) for i in range(draining)]
    return Service(7, "running", {**SCALE, **scale}, tuple(live + gone))


def test_up_to_what_the_mean_load_needs_in_one_step_capped_at_max():
    assert decide(_service(1), [8, 7, 9, 8], None).to == 4        # 4x one replica's target: four at once
    made = decide(_service(1), [8, 7, 9, 8], None)
    assert (made.why, made.load, made.in_flight) == ("up", 8.0, 8.0)
    assert decide(_service(1), [30, 30], None).to == 4            # never past max
    assert decide(_service(2), [5, 5], None).to == 3              # 2.5 per replica: one more
    assert decide(_service(4), [30], None) is None                # at max already


def test_up_needs_every_sample_over_target_and_a_full_window():
    assert decide(_service(1), [8, 1, 8], None) is None           # one dip under target: not "stays over"
    assert decide(_service(1), None, None) is None                # the window is not full yet
    assert decide(_service(2, ready=1), [5, 5], None).to == 3     # starting replicas count against the load


def test_down_to_what_the_peak_needs_never_under_min_and_to_zero_with_min_0():
    assert decide(_service(4), None, [3, 2, 1]).to == 2
    assert decide(_service(4), None, [3, 2, 1]).why == "down"
    assert decide(_service(4), None, [0, 0]).to == 1              # min 1
    zero = decide(_service(2, min=0), None, [0, 0, 0])
    assert (zero.to, zero.why) == (0, "zero")
    assert decide(_service(2), None, [4, 0]) is None              # the peak still needs both
    assert decide(_service(1, min=0), None, [1]) is None
    assert decide(_service(2, ready=1, min=0), None, [0, 0]) is None   # a replica still starting: not yet
    queued = Service(7, "running", {**SCALE, "min": 0}, (Replica(1, 0, "running", True, False), Replica(2, 1, "queued", False, False)))
    assert decide(queued, None, [0, 0]).to == 0                         # one no worker takes: no reason to wait


def test_below_min_goes_up_at_once_and_draining_replicas_do_not_count():
    assert (decide(_service(0), None, None).to, decide(_service(0), None, None).why) == (1, "min")
    assert decide(_service(1, draining=3), [3, 3], None).to == 2
    assert decide(_service(5), None, None).to == 4                # above max (never made so): back to it


def test_windows_fill_reset_and_forget():
    w = Windows()
    for t in range(12):
        w.add(7, 100.0 + t, t, keep_s=10)
    assert w.window(7, 111.0, 10) == list(range(1, 12))
    assert w.window(7, 111.0, 20) is None                          # 11 s of samples: not 20
    w.reset(7, 111.0)
    assert w.window(7, 111.0, 0) == [] and w.window(7, 115.0, 10) is None
    w.add(7, 112.0, 5, keep_s=10)
    assert w.window(7, 121.5, 10) == [5]
    w.keep(set())
    assert w.window(7, 200.0, 0) is None
