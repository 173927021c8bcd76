"""The polling rules (core/rules/polling.py): pure functions of a batch's age and what batches like it took."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from batchgrader.core.rules.polling import AGE_FRACTION, MIN_DELAY, Durations, next_poll_delay


@given(
    age=st.floats(0, 200_000),
    interval=st.floats(0.1, 3600),
    left=st.none() | st.floats(-200_000, 200_000),
)
def test_the_wait_is_within_the_bounds(age, interval, left):
    d = next_poll_delay(age, interval, left)
    assert min(MIN_DELAY, interval) <= d <= interval
    # never later than the age rule allows, whatever is expected (issue 38: a batch that ends
    # sooner than batches like it is seen ended within 15 % of its age all the same)
    assert d <= max(AGE_FRACTION * age, MIN_DELAY)
    if left is not None and left > 0:
        assert d <= max(left + 0.25, MIN_DELAY) + 1e-9  # there just after the expected end


def test_the_wait_grows_with_the_age_up_to_the_interval():
    assert next_poll_delay(0, 60) == MIN_DELAY
    assert next_poll_delay(100, 60) == 15.0
    assert next_poll_delay(10_000, 60) == 60
    assert next_poll_delay(10_000, 600) == 600
    assert next_poll_delay(0, 0.05) == 0.05  # a shorter poll_interval_seconds wins (tests use it)


def test_the_expected_end_brings_the_poll_forward_and_then_backs_off():
    assert next_poll_delay(100, 60, expected_left=5) == 5.25
    assert next_poll_delay(100, 60, expected_left=-1) == 0.5  # just overdue: look again soon
    assert next_poll_delay(100, 60, expected_left=-20) == 10  # half the time since, up to the age rule
    assert next_poll_delay(100, 60, expected_left=-1000) == 15


def test_durations_are_the_median_of_the_last_five_per_model():
    d = Durations()
    assert d.expected("m") is None
    for s in (100, 10, 30, 20, 1000, 40):
        d.record("m", s)
    assert d.expected("m") == 30  # 10, 30, 20, 1000, 40: the first one is forgotten
    d.record("m", -1)  # nonsense is ignored
    assert d.expected("m") == 30 and d.expected("other") is None


def test_progress_left_is_the_rest_at_the_rate_seen():
    from batchgrader.core.rules.polling import progress_left

    assert progress_left((10.0, 2), (30.0, 6), 10) == 20.0  # 4 requests in 20 s: 4 more in 20 s
    assert progress_left((10.0, 2), (30.0, 2), 10) is None  # not moved: nothing known
    assert progress_left((10.0, 2), (30.0, 10), 10) == 0.0
