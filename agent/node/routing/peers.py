"""Which node serves a request, and which peers to skip.

``choose`` picks among a model's planned nodes (this one included: its share is served
without a hop) the one with the fewest requests outstanding per replica; ties, the
usual case under light load, go by smooth weighted round robin (nginx's), so that a
model's requests split over its nodes as the plan's replicas say. A peer that failed
(refused, timed out, answered 5xx) is skipped for ``backoff_s``, doubling while it
keeps failing up to ``backoff_max_s``; the first request after that tries it again,
and a success clears its record. Times come from the caller's clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PeerHealth:
    """One peer's failures in a row and until when it is skipped."""

    failures: int = 0
    down_until: float = 0.0
    last_error: str | None = None


class PeerBook:
    """Peers' health, the requests outstanding at each, and the weighted round robin's
    state per model."""

    def __init__(self, backoff_s: float, backoff_max_s: float) -> None:
        self.backoff_s, self.backoff_max_s = backoff_s, max(backoff_s, backoff_max_s)
        self.health: dict[str, PeerHealth] = {}
        self.outstanding: dict[tuple[str, str], int] = {}  # (model, peer) -> requests
        self._current: dict[str, dict[str, float]] = {}  # model -> node -> SWRR weight

    def up(self, peer: str, now: float) -> bool:
        """Whether ``peer`` may be tried now (never failed, or its backoff is over)."""
        h = self.health.get(peer)
        return h is None or now >= h.down_until

    def failed(self, peer: str, now: float, why: str) -> float:
        """Record a failure of ``peer``; the seconds it is skipped for."""
        h = self.health.setdefault(peer, PeerHealth())
        h.failures += 1
        h.last_error = why
        skip = min(self.backoff_max_s, self.backoff_s * 2 ** min(h.failures - 1, 30))
        h.down_until = now + skip
        return skip

    def succeeded(self, peer: str) -> None:
        self.health.pop(peer, None)

    def started(self, model: str, peer: str) -> None:
        key = (model, peer)
        self.outstanding[key] = self.outstanding.get(key, 0) + 1

    def ended(self, model: str, peer: str) -> None:
        key = (model, peer)
        left = self.outstanding.get(key, 0) - 1
        if left > 0:
            self.outstanding[key] = left
        else:
            self.outstanding.pop(key, None)

    def choose(self, model: str, weights: dict[str, int], local: str,
               local_outstanding: int, now: float) -> str | None:
        """The node among ``weights`` (node -> replicas) that serves the next request
        for ``model``: ``local`` (this node) whatever its health, peers while up; None
        when none may (every planned peer is down and this node is not planned)."""
        candidates = {n: w for n, w in weights.items()
                      if w > 0 and (n == local or self.up(n, now))}
        if not candidates:
            return None
        if len(candidates) == 1:
            return next(iter(candidates))
        current = self._current.setdefault(model, {})
        if current.keys() != candidates.keys():  # the set changed: start the rotation over
            current.clear()
            current.update(dict.fromkeys(candidates, 0.0))
        total = sum(candidates.values())
        for node, weight in candidates.items():
            current[node] += weight

        def load(node: str) -> float:
            busy = local_outstanding if node == local \
                else self.outstanding.get((model, node), 0)
            return busy / candidates[node]

        best = min(candidates, key=lambda n: (load(n), -current[n], n))
        current[best] -= total
        return best

    def forget(self, keep: set[str]) -> None:
        """Drop the health of peers no longer in the table (a table naming a node that
        no longer exists leaves nothing behind once it is gone)."""
        for peer in set(self.health) - keep:
            del self.health[peer]
