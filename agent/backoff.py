"""When to try a server again that failed or refused: exponential backoff with full
jitter, and the server's own ``Retry-After``.

A fleet that loses its coordinator fails at once; if every node then waited the same
``base * 2**n``, they would all come back in the same second, and again after each
refusal. Full jitter (a uniform draw between 0 and the exponential bound, as in AWS'
"Exponential Backoff and Jitter") spreads them over the whole bound. A server that says
when to come back (``Retry-After`` on a 429 or 503) is obeyed: never sooner, and spread
over ``[R, 2R]`` so that the nodes it refused together do not return together.

A shared leaf: the agent's reporter and the bench's simulated nodes both use it.
"""

from __future__ import annotations

import email.utils
import random
from typing import Callable

#: The longest ``Retry-After`` obeyed (a server asking for more gets this).
MAX_RETRY_AFTER_S = 600.0
#: The longest wait between tries of a periodic report (full jitter below it).
MAX_BACKOFF_S = 30.0


def backoff_cap(interval_s: float) -> float:
    """The bound of the jitter for a report sent every ``interval_s``: 8 intervals, at
    most ``MAX_BACKOFF_S`` (never under one interval). A node thus tries more than once
    within a directive's lifetime (60 s by default), and is back at most that long after
    its coordinator."""
    return max(interval_s, min(MAX_BACKOFF_S, interval_s * 8))


def retry_delay(failures: int, base_s: float, cap_s: float,
                retry_after_s: float | None = None, *,
                rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (1 for the first):
    with ``retry_after_s`` (the server's), a draw in ``[R, 2R]``; else full jitter, a
    draw in ``[0, min(cap_s, base_s * 2**failures)]``."""
    if retry_after_s is not None:
        wait = min(max(0.0, retry_after_s), MAX_RETRY_AFTER_S)
        return wait * (1.0 + rng())
    bound = min(cap_s, base_s * 2.0 ** min(max(failures, 0), 30))
    return bound * rng()


def parse_retry_after(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header's seconds from ``now`` (a Unix time): delta-seconds or
    an HTTP-date (RFC 9110 §10.2.3); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
