"""Online request-rate estimators for popularity-based policies.

CremeBrulee (§V-A) estimates the Belady boundary as B(m) ≈ 1/λ_m. Both estimators
here keep, per key, a *score* whose order between two keys changes only when one of
them is requested, so policies can rank keys in a heap instead of rescanning:

- ``cumulative`` — λ = count / (now − t0), with t0 the first request the estimator saw
  (one t0 for all keys, as the CremeBrulee artifact counts). Order = request count.
  Never forgets: a model popular an hour ago still outranks one popular now.
- ``decayed`` — an exponentially decayed count with half-life h:
  λ(now) = (ln 2 / h) · Σ_i 2^(−(now − t_i)/h). Kept in the log domain as
  L = log Σ_i exp(t_i · ln 2 / h), which is time-invariant between requests, so the
  order of two keys does not change while neither is requested.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable
from math import exp, log, log1p

Key = Hashable


class RateEstimator(ABC):
    """Per-key request-rate estimate; ``log_score`` ranks keys like the rate does."""

    name: str

    @abstractmethod
    def record(self, key: Key, now: float) -> float:
        """Count one request for ``key`` at ``now``; return its new ``log_score``."""

    @abstractmethod
    def log_score(self, key: Key) -> float:
        """log(rate) up to a term shared by all keys; -inf for a key never seen."""

    @abstractmethod
    def rate(self, key: Key, now: float) -> float:
        """Requests per second for ``key`` at ``now``."""


class CumulativeRate(RateEstimator):
    """λ = count / (now − t0): the whole history, weighted equally."""

    name = "cumulative"

    def __init__(self) -> None:
        self._counts: dict[Key, int] = {}
        self._t0: float | None = None

    def record(self, key: Key, now: float) -> float:
        if self._t0 is None:
            self._t0 = now
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        return log(count)

    def log_score(self, key: Key) -> float:
        count = self._counts.get(key, 0)
        return math.log(count) if count else -math.inf

    def rate(self, key: Key, now: float) -> float:
        count = self._counts.get(key, 0)
        if not count or self._t0 is None:
            return 0.0
        # One second floor on the elapsed time so the first requests do not divide by ~0.
        return count / max(now - self._t0, 1.0)


class DecayedRate(RateEstimator):
    """Exponentially decayed request count with half-life ``half_life`` seconds."""

    name = "decayed"

    def __init__(self, half_life: float = 600.0) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 seconds, got {half_life}")
        self.half_life = float(half_life)
        self._k = math.log(2.0) / self.half_life
        self._log_sums: dict[Key, float] = {}

    def record(self, key: Key, now: float) -> float:
        x = now * self._k
        log_sums = self._log_sums
        old = log_sums.get(key)
        if old is None:
            new = x
        elif old >= x:
            new = old + log1p(exp(x - old))
        else:
            new = x + log1p(exp(old - x))
        log_sums[key] = new
        return new

    def log_score(self, key: Key) -> float:
        return self._log_sums.get(key, -math.inf)

    def rate(self, key: Key, now: float) -> float:
        log_sum = self._log_sums.get(key)
        if log_sum is None:
            return 0.0
        return self._k * math.exp(log_sum - now * self._k)


def make_rate_estimator(rate: str = "decayed", half_life: float = 600.0) -> RateEstimator:
    """The estimator named ``rate`` (``cumulative`` or ``decayed``)."""
    if rate == "cumulative":
        return CumulativeRate()
    if rate == "decayed":
        return DecayedRate(half_life)
    raise ValueError(f"unknown rate estimator {rate!r}: expected 'cumulative' or 'decayed'")
