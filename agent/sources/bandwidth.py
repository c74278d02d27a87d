"""A token bucket that holds a pull to ``rate`` bytes per second on average, with an
injected clock and sleep (a test passes a fake clock; a pull passes its stop event's
``wait`` so that a stop ends the sleep)."""

from __future__ import annotations

from typing import Callable


class TokenBucket:
    """``take(n)`` returns once ``n`` more bytes fit in ``rate`` bytes/s with a burst of
    ``burst`` bytes; a take larger than the bucket runs it into debt, repaid by
    sleeping, so the average holds for any chunk size."""

    def __init__(self, rate: int, *, clock: Callable[[], float],
                 sleep: Callable[[float], object], burst: int | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1, rate // 10))
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._last = clock()

    def take(self, n: int) -> None:
        """Spend ``n`` bytes, sleeping first for as long as the bucket is in debt."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        if self._tokens < 0:
            self._sleep(-self._tokens / self.rate)
