"""Backoff arithmetic with pinned randomness and pinned run durations."""

from agent.link.backoff import next_restart_delay, retry_delay


def test_service_restart_delays_double_to_30_and_reset_after_a_minute():
    delays, previous = [], None
    for _ in range(8):
        previous = next_restart_delay(previous, run_seconds=2.0)
        delays.append(previous)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert next_restart_delay(30, run_seconds=61) == 1
    assert next_restart_delay(8, run_seconds=60) == 16


def test_retry_delay_grows_with_jitter_and_caps():
    assert retry_delay(1, rand=lambda: 0.0) == 0.125
    assert retry_delay(1, rand=lambda: 1.0) == 0.25
    assert retry_delay(3, rand=lambda: 1.0) == 1.0
    assert retry_delay(50, rand=lambda: 1.0) == 10.0
    assert retry_delay(50, rand=lambda: 0.0) == 5.0
