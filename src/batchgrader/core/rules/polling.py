"""When to look at a batch in flight again: pure rules (no clock, no I/O).

A batch of the Batch API takes anything from a minute to a day, and the API does not say when it
will end.  The wait before the next poll of a batch is:

* **a fraction of its age**: :data:`AGE_FRACTION` of the time since it was created, at least
  :data:`MIN_DELAY` and at most ``poll_interval_seconds``.  A batch is seen done at most about
  15 % of its run time late (or ``poll_interval_seconds``, whichever is less), and a long batch
  costs a poll per ``poll_interval_seconds``;
* **shorter when its end is expected sooner**: the expected end is the batch's own progress
  while it is in progress and its count of finished requests moves (the rate since the first
  poll that saw some finished, :func:`progress_left`), else the run time of the last batches of
  the same model (:class:`Durations`, kept in memory only).  The batch is polled just after
  that time; once it has passed, soon and then less and less often (:data:`OVERDUE_FRACTION`
  of the time since).  An expectation only ever brings a poll forward: a batch that ends
  sooner than expected is still seen ended within the age rule.  Batches that take about as
  long as the ones before them are so collected within about a second of their end.

With several batches in flight a poll round is one paged ``batches.list`` for all of them
(``core/decide.list_round_due``), so these rules set how often a round is due.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: s, the shortest wait between two polls of a batch (and the first, after its create): a batch
#: that ends within its first seconds (a fast server, a small batch) is seen ended within about
#: this much, a tenth of a second on average (issue 38), for a few polls more per batch (about 7
#: in its first 1.3 s, after which the age rule's wait is longer)
MIN_DELAY = 0.2
AGE_FRACTION = 0.15  # the wait is at most this share of the batch's age
OVERDUE_FRACTION = 0.5  # past the expected end: this share of the time since it
EXPECTED_SLACK = 0.25  # s, polled this long after the expected end
KEPT_DURATIONS = 5  # the expected run time is the median of a model's last few batches


def next_poll_delay(age: float, poll_interval: float, expected_left: float | None = None) -> float:
    """Seconds until the next poll of a batch created ``age`` seconds ago (never more than
    ``poll_interval``; at least :data:`MIN_DELAY` unless ``poll_interval`` is shorter).

    ``expected_left``: seconds until the batch is expected to end (negative once that time has
    passed), or None when nothing is known yet."""
    delay = max(AGE_FRACTION * age, MIN_DELAY)
    if expected_left is not None and expected_left > 0:
        delay = min(delay, max(expected_left + EXPECTED_SLACK, MIN_DELAY))
    elif expected_left is not None:
        delay = min(delay, max(MIN_DELAY, OVERDUE_FRACTION * -expected_left))
    return min(delay, poll_interval)


def progress_left(first: tuple[float, int], last: tuple[float, int], total: int) -> float | None:
    """Seconds until ``total`` requests are done, at the rate seen between two polls of a batch in
    progress (``(time, requests done)`` each); None until the count has moved."""
    (t1, n1), (t2, n2) = first, last
    if n2 <= n1 or t2 <= t1:
        return None
    return (total - n2) * (t2 - t1) / (n2 - n1)


@dataclass
class Durations:
    """How long the last batches of each model took (created to seen completed), in memory: the
    daemon starts without it and learns again from the next batches."""

    kept: dict[str, deque[float]] = field(default_factory=dict)

    def record(self, model: str, seconds: float) -> None:
        if seconds > 0:
            self.kept.setdefault(model, deque(maxlen=KEPT_DURATIONS)).append(seconds)

    def expected(self, model: str) -> float | None:
        """The median of the model's last batches' run times, or None."""
        got = sorted(self.kept.get(model, ()))
        return got[len(got) // 2] if got else None
