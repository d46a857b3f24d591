"""The trace generator and the offline simulator of issue 38's bench (scripts/tracegen.py, scripts/tracesim.py).

Tiny traces whose FIFO, greedy and EASY schedules are worked out by hand (two or three workers of 8 GPUs,
limits equal to runtimes unless a test says otherwise), and the generator's determinism and shape.
"""
from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import tracegen  # noqa: E402
import tracesim  # noqa: E402
from tracegen import TraceJob  # noqa: E402


def jobs(*rows):
    """TraceJobs from (arrival, gpus, runtime[, limit]) rows, numbered from 1."""
    return [TraceJob(i, float(r[0]), r[1], float(r[2]), float(r[3] if len(r) > 3 else r[2])) for i, r in enumerate(rows, 1)]


def starts(trace, workers, policy, **kw):
    return tracesim.simulate(trace, workers, policy, **kw).starts


# A (4 GPUs) holds worker 0; B, a 16-GPU gang, needs both workers whole; 4-GPU jobs keep arriving, each
# landing on worker 0 before the one before it ends.
STREAM = jobs((0, 4, 10), (1, 16, 5), (2, 4, 10), (11, 4, 10), (20, 4, 10))


def test_greedy_starves_the_gang_behind_a_stream_of_small_jobs():
    got = starts(STREAM, 2, "greedy")
    assert got == {1: 0.0, 3: 2.0, 4: 11.0, 5: 20.0, 2: 30.0}


def test_easy_reserves_both_workers_for_the_gang_and_backfills_nothing_into_them():
    got = starts(STREAM, 2, "easy")
    # At t=2 the gang holds a reservation from t=10 (A's limit) on both workers; C (limit 10, to t=12)
    # would take 4 of worker 0's 8 GPUs then, so it waits. D and E come after the gang.
    assert got == {1: 0.0, 2: 10.0, 3: 15.0, 4: 15.0, 5: 20.0}
    assert starts(STREAM, 2, "fifo") == got


# A (8) holds worker 0 to t=10, B (4) half of worker 1 to t=20; C, a 16-GPU gang, waits for both (t=20).
BLOCKED = ((0, 8, 10), (0, 4, 20), (1, 16, 5))


def test_easy_backfills_jobs_that_end_before_the_reservation():
    trace = jobs(*BLOCKED, (2, 4, 8), (3, 8, 6))
    got = starts(trace, 2, "easy")
    # D fits beside B now and ends by t=10 <= 20; E fits on worker 0 once A ends and ends by t=16 <= 20.
    assert got == {1: 0.0, 2: 0.0, 3: 20.0, 4: 2.0, 5: 10.0}
    assert starts(trace, 2, "greedy") == got
    fifo = starts(trace, 2, "fifo")
    assert fifo[3] == 20.0 and fifo[4] == 25.0 and fifo[5] == 25.0


def test_easy_does_not_backfill_a_job_that_would_delay_the_reservation():
    trace = jobs(*BLOCKED, (2, 4, 25, 30))
    easy = starts(trace, 2, "easy")
    # D's limit takes it to t=32, past the reservation at t=20, on worker 1, which the gang needs whole.
    assert easy[3] == 20.0 and easy[4] == 25.0
    greedy = starts(trace, 2, "greedy")
    assert greedy[4] == 2.0 and greedy[3] == 27.0


def test_easy_backfills_a_long_job_onto_a_worker_the_reservation_does_not_use():
    trace = jobs((0, 8, 10), (0, 8, 20), (0, 4, 30), (1, 16, 5), (2, 4, 100))
    got = starts(trace, 3, "easy")
    # The gang is reserved workers 0 and 1 from t=20; worker 2 keeps 4 GPUs free beside C, so L runs now.
    assert got[4] == 20.0 and got[5] == 2.0
    assert starts(trace, 3, "fifo")[5] == 20.0     # behind the gang, which starts at t=20


def test_the_reservation_uses_time_limits_not_runtimes():
    # A ends at t=4 but its limit says t=40: the reservation is for t=40, and D (to t=2 + 20 = 22) is
    # backfilled on that promise; the gang then starts as soon as A and D are both gone.
    trace = jobs((0, 8, 4, 40), (1, 16, 5), (2, 8, 6, 20))
    got = starts(trace, 2, "easy")
    assert got == {1: 0.0, 2: 8.0, 3: 2.0}
    state = tracesim.State(1.0, [0, 8], 8, running=[tracesim.Running(trace[0], 0.0, 4.0, 40.0, ((0, 8),))])
    assert tracesim.reservation(state, trace[1]) == (40.0, ((0, 8), (1, 8)), [8, 8])


def test_placement_is_best_fit_and_gangs_take_whole_workers():
    assert tracesim.place(4, [8, 4, 6], 8) == ((1, 4),)
    assert tracesim.place(4, [8, 3, 8], 8) == ((0, 4),)
    assert tracesim.place(16, [8, 7, 8, 8], 8) == ((0, 8), (2, 8))
    assert tracesim.place(16, [8, 7, 6], 8) is None
    assert tracesim.place(8, [8, 8], 8, allowed=lambda w, g: w == 1) == ((1, 8),)


def test_estimates_replay_the_queue_with_time_limits():
    trace = jobs(*BLOCKED, (2, 4, 8), (2, 4, 25, 30))
    out = tracesim.simulate(trace, 2, "easy")
    # The gang's estimate at t=1 is B's limit (t=20); D starts at once; E (to t=32) must wait for the gang.
    assert out.estimates == {1: 0.0, 2: 0.0, 3: 20.0, 4: 2.0, 5: 25.0}
    assert out.starts[3] == 20.0 and out.starts[5] == 25.0


def test_an_estimate_is_off_by_as_much_as_the_limits_overestimate():
    # A's limit (40) is 4x its runtime (10): at t=1 the gang is told t=40 and starts at t=10.
    trace = jobs((0, 8, 10, 40), (1, 16, 5))
    out = tracesim.simulate(trace, 2, "easy")
    assert out.estimates[2] == 40.0 and out.starts[2] == 10.0
    assert tracesim.estimate_error(trace, out.starts, out.estimates) == pytest.approx(30 / 9)
    # Nothing had ended at t=1, so the learned ratio is still 1 (the limit itself).
    assert out.learned[2] == 40.0


def test_learned_estimates_scale_limits_by_the_runtime_over_limit_of_ended_jobs():
    # A (runtime 5, limit 10) has ended by t=6: the ratio learned is 0.5, so B's limit 40 counts as 20.
    trace = jobs((0, 8, 5, 10), (1, 8, 20, 40), (6, 16, 5))
    out = tracesim.simulate(trace, 2, "easy")
    assert out.starts[3] == 21.0
    assert out.estimates[3] == 41.0 and out.learned[3] == 21.0


def test_a_learned_replay_still_reserves_from_time_limits():
    # By t=6 A has ended at half its limit (ratio 0.5), so B (limit 60) is expected to end at t=31, but the
    # gang C is reserved from B's limit (t=61), as the real scheduler reserves: D (limit 40, to t=46) is
    # backfilled at once in the replay, as it is in the run. Reserving from t=31 would have kept D waiting.
    trace = jobs((0, 8, 5, 10), (1, 8, 50, 60), (6, 16, 5), (6, 8, 10, 40))
    out = tracesim.simulate(trace, 2, "easy")
    assert out.starts == {1: 0.0, 2: 1.0, 3: 51.0, 4: 6.0}
    assert (out.estimates[3], out.learned[3]) == (61.0, 31.0)
    assert out.learned[4] == 6.0


def test_a_conditional_estimate_expects_a_running_job_to_outlast_what_it_has_run():
    # When the gang D arrives (t=61), A and B have ended at 0.2 and 0.6 of their limits; C (runtime 70, limit
    # 100, from t=5) has run 56 s. Learned: C lasts the median ratio 0.4 x 100 = 40, so it has outlived that
    # and ends at once; conditional: only 0.6 x 100 outlasts its 56 s, so it ends at t=65, nearer t=75.
    trace = jobs((0, 8, 2, 10), (0, 8, 60, 100), (5, 8, 70, 100), (61, 16, 5))
    out = tracesim.simulate(trace, 2, "easy")
    assert out.starts[4] == 75.0
    assert out.learned[4] == 61.0 and out.conditional[4] == 65.0


def test_the_error_counts_only_jobs_that_waited_at_least_two_seconds():
    trace = jobs((0, 8, 1), (0, 8, 1), (0, 8, 1))
    started = {1: 0.0, 2: 1.0, 3: 10.0}
    assert tracesim.estimate_error(trace, started, {1: 5.0, 2: 9.0, 3: 12.0}) == pytest.approx(0.2)
    assert tracesim.estimate_error(trace, started, {1: 5.0, 2: 9.0, 3: None}) is None


def test_summary_measures_utilisation_completion_and_the_largest_jobs_waits():
    out = tracesim.simulate(STREAM, 2, "easy")
    row = tracesim.summary(STREAM, out, 2)
    assert row["makespan_s"] == 30.0
    assert row["utilisation"] == pytest.approx((4 * 40 + 16 * 5) / (16 * 30))
    assert row["mean_jct_s"] == pytest.approx((10 + 14 + 23 + 14 + 10) / 5)
    assert (row["largest_gpus"], row["largest_jobs"], row["largest_mean_wait_s"], row["largest_worst_wait_s"]) == (16, 1, 9, 9)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        tracesim.simulate(STREAM, 2, "sjf")
    with pytest.raises(ValueError, match="fits no placement"):
        tracesim.simulate(jobs((0, 32, 1)), 2, "easy")
    with pytest.raises(ValueError, match="whole workers"):
        tracegen.generate(10, mix={12: 1.0})
    with pytest.raises(ValueError, match="band"):
        tracegen.generate(10, band=(1.0, 1e5))
    with pytest.raises(ValueError, match="line 1"):
        tracegen.load('{"id": 1}\n')


def test_the_generator_is_deterministic():
    assert tracegen.generate(200, seed=7) == tracegen.generate(200, seed=7)
    assert tracegen.generate(200, seed=7) != tracegen.generate(200, seed=8)
    trace = tracegen.generate(50)
    assert tracegen.load(tracegen.dumps(trace)) == trace


def test_the_trace_keeps_its_declared_load_sizes_and_limits():
    trace = tracegen.generate(400, workers=8, load=1.4)
    assert tracegen.offered_load(trace, 8) == pytest.approx(1.4, rel=1e-3)
    assert trace[0].arrival == 0.0 and all(a.arrival <= b.arrival for a, b in zip(trace, trace[1:]))
    assert {j.gpus for j in trace} <= {4, 8, 16, 32}
    assert all(1.5 <= j.limit / j.runtime <= 3.0 + 0.01 / j.runtime for j in trace)
    assert all(1.0 - 0.01 <= j.runtime <= 100.0 + 0.01 for j in trace)     # 10..1,000 min / 600


def test_the_size_mix_matches_the_declared_weights():
    trace = tracegen.generate(20_000, seed=1)
    counts = Counter(j.gpus for j in trace)
    total = sum(tracegen.SIZE_MIX.values())
    for gpus, weight in tracegen.SIZE_MIX.items():
        assert counts[gpus] / len(trace) == pytest.approx(weight / total, abs=0.01), gpus


def test_runtimes_follow_figure_2_within_the_band():
    compression = 600.0
    trace = tracegen.generate(20_000, seed=2, compression=compression)
    for curve in tracegen.RUNTIME_CDF:
        minutes = sorted(j.runtime * compression / 60.0 for j in trace if tracegen.bucket(j.gpus) == curve)
        assert len(minutes) > 2000, curve
        ks = max(abs((i + 1) / len(minutes) - tracegen.band_cdf(curve, m)) for i, m in enumerate(minutes))
        assert ks < 0.03, (curve, ks)


def test_figure_2_readings_invert():
    for curve in tracegen.RUNTIME_CDF:
        for minutes in (0.5, 10.0, 200.0, 5000.0):
            p = tracegen.runtime_cdf(curve, minutes)
            assert tracegen.runtime_quantile(curve, p) == pytest.approx(minutes, rel=1e-9)
    # The medians the figure shows: the 5-8 and >8 GPU jobs run for hours, the 2-4 GPU jobs for half an hour.
    assert 25 < tracegen.runtime_quantile("2-4", 0.5) < 40
    assert 100 < tracegen.runtime_quantile(">8", 0.5) < tracegen.runtime_quantile("5-8", 0.5) < 250
    assert math.isclose(tracegen.band_cdf("5-8", 10.0), 0.0) and math.isclose(tracegen.band_cdf("5-8", 1000.0), 1.0)


def test_the_command_lines(capsys):
    assert tracegen.main(["--jobs", "30", "--seed", "3"]) == 0
    written = capsys.readouterr().out
    assert tracegen.load(written) == tracegen.generate(30, seed=3)
    assert tracesim.main(["--jobs", "30", "--seed", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in rows] == ["fifo", "greedy", "easy"]
    assert all(0 < r["utilisation"] <= 1 for r in rows)


@pytest.mark.parametrize("policy", tracesim.POLICIES)
def test_a_generated_trace_never_overfills_the_cluster(policy):
    trace = tracegen.generate(150, workers=4, load=1.4, seed=11)
    out = tracesim.simulate(trace, 4, policy, estimates=False)
    assert all(out.starts[j.id] >= j.arrival and out.ends[j.id] == pytest.approx(out.starts[j.id] + j.runtime)
               for j in trace)
    for t in sorted(set(out.starts.values())):
        busy = sum(j.gpus for j in trace if out.starts[j.id] <= t < out.ends[j.id])
        assert busy <= 4 * 8, (t, busy)
    if policy == "fifo":
        order = [out.starts[j.id] for j in sorted(trace, key=lambda j: (j.arrival, j.id))]
        assert order == sorted(order)
