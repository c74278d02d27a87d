"""Failed-authentication throttle (no or unknown tokens: guesses): a token bucket per
peer address, bounded in size.

A peer may fail ``burst`` times at once and then ``per_s`` times a second; past that
it is answered 429 with ``Retry-After`` until its bucket refills. Only peers that
failed are kept, the least recently failing dropped past ``max_peers``, so strangers
cannot grow the limiter's own state without bound.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Callable


class FailureThrottle:
    """Per-peer budget of failed authentications (see the module)."""

    def __init__(self, *, burst: int = 20, per_s: float = 2.0, max_peers: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.per_s, self.max_peers, self.clock = burst, per_s, max_peers, clock
        self._peers: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def __len__(self) -> int:
        return len(self._peers)

    def _tokens(self, peer: str, now: float) -> float:
        tokens, at = self._peers.get(peer, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.per_s)

    def retry_after(self, peer: str) -> int:
        """Whole seconds ``peer`` must wait before it may try again (0: it may now)."""
        if peer not in self._peers:
            return 0
        tokens = self._tokens(peer, self.clock())
        return 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) / self.per_s))

    def failed(self, peer: str) -> None:
        """Count one failed authentication of ``peer``."""
        now = self.clock()
        self._peers[peer] = (self._tokens(peer, now) - 1, now)
        self._peers.move_to_end(peer)
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
