"""When a batch create whose outcome is unknown is believed absent, and how long a chunk created
again after such a create is watched for the late one: pure rules on the monotonic clock.

A create can be carried out by the provider after the client stopped waiting for its reply (a
late create).  The request is stamped when it leaves and when its reply was given up on (or an
error answer came), both on the monotonic clock of the process that sent it; after a restart
only the event log's wall-clock time of the intent is known, and the rules are then applied on
the wall clock (``sent`` and ``now`` from the same clock, never mixed).
"""

from __future__ import annotations

from dataclasses import dataclass

from batchgrader.core.configuration.config import Config

#: s a provider may still carry out a create after the client gave up waiting for its reply
#: (the request may have reached it just before); counted from the give-up, not from the send
LOST_REPLY_SLACK = 3.0
#: s before a create answered with an error (a 5xx) is looked for: the provider answered, so
#: what it did is in its batch list at once (a listing shortly after sees it)
ANSWERED_SETTLE = 1.0
#: s between two listings while the duplicate watch after a create sent again lasts
DUPLICATE_CHECK_EVERY = 2.0


def create_settle_seconds(config: Config) -> float:
    """How long after a create request left a listing must be taken before "absent" is believed
    when no reply came (:func:`absent_after` counts it from the give-up); also how far back a
    reconciliation listing reaches before the request."""
    return config.default.request_timeout_seconds + LOST_REPLY_SLACK


@dataclass(frozen=True)
class CreateSent:
    """One create request: when it left and when its outcome became unknown (both monotonic);
    ``answered``: an error reply came (5xx, 408), rather than none (timeout, connection lost)."""

    sent: float
    gave_up: float | None = None
    answered: bool = False


def absent_after(request: CreateSent, request_timeout: float) -> float:
    """From when on a listing that does not show the create means it was not carried out.

    An answered error: :data:`ANSWERED_SETTLE` after the answer.  No reply: the provider may
    have received the request until the client gave up on it (``request_timeout`` after it left
    at least: connecting and sending are not counted in a read timeout) and carry it out
    :data:`LOST_REPLY_SLACK` after that.  Unknown give-up (after a restart): the request timeout
    after the send stands for it."""
    if request.answered and request.gave_up is not None:
        return request.gave_up + ANSWERED_SETTLE
    gave_up = request.sent + request_timeout
    if request.gave_up is not None:
        gave_up = max(gave_up, request.gave_up)
    return gave_up + LOST_REPLY_SLACK


def next_listing_in(request: CreateSent, request_timeout: float, now: float) -> float:
    """Seconds until a create still unknown is listed again: at the moment it may be believed
    absent, and every few seconds before (a late create is adopted as soon as it is seen)."""
    due = absent_after(request, request_timeout)
    return max(0.0, min(due - now, max(0.5, min(5.0, (request_timeout + LOST_REPLY_SLACK) / 4))))


def duplicate_watch_ends(created: float, request_timeout: float) -> float:
    """Until when a chunk created again after an absent or refused create of the same attempt
    is listed by its ``bg_key`` for a late batch of the earlier request (from the new batch's
    creation, on the same clock): as long as a request can still be carried out after it left."""
    return created + request_timeout + LOST_REPLY_SLACK


def duplicate_check_in(now: float, ends: float) -> float:
    """Seconds until the next duplicate listing: every :data:`DUPLICATE_CHECK_EVERY` seconds,
    and once more at the end of the watch (the final check, recorded in the log)."""
    return max(0.0, min(DUPLICATE_CHECK_EVERY, ends - now))
