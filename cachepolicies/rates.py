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

The estimate is a ``Rates`` structref over ids that policies embed in their state and
update with the kernels below; ``RateEstimator`` is the same over arbitrary keys.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from cachepolicies.base import INITIAL_CAPACITY, Ids, Key
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, kernel


def rate_parameters(rate: str, half_life: float) -> tuple[bool, float]:
    """(cumulative, k = ln 2 / half_life) for the estimator named ``rate``."""
    if rate not in ("cumulative", "decayed"):
        raise ValueError(f"unknown rate estimator {rate!r}: expected 'cumulative' or 'decayed'")
    if rate == "cumulative":
        return True, 0.0
    if not half_life > 0:
        raise ValueError(f"half_life must be > 0 seconds, got {half_life}")
    return False, math.log(2.0) / float(half_life)


@structref.register
class RatesType(types.StructRef):
    pass


class Rates(structref.StructRefProxy):
    """Per id: ``count`` (requests seen) and ``log_sum`` (decayed: L); ``t0`` is the
    first request's time (of any id) once ``started``."""


structref.define_proxy(Rates, RatesType, ["cumulative", "k", "started", "t0", "count", "log_sum"])


@kernel
def new_rates(cumulative, k, capacity):
    return Rates(cumulative, k, False, 0.0, np.zeros(capacity, np.int64), np.zeros(capacity))


@kernel
def grow_rates(r, capacity):
    r.count = grown(r.count, capacity, 0)
    r.log_sum = grown(r.log_sum, capacity, 0.0)


@kernel(inline="always")
def record(r, i, now):
    """Count one request for id ``i`` at ``now``; return its new log score."""
    count = r.count  # (a field read once: each read costs a reference count)
    count[i] += 1
    if not r.started:
        r.started = True
        r.t0 = now
    if r.cumulative:
        return math.log(count[i])
    log_sum = r.log_sum
    x = now * r.k
    if count[i] == 1:
        new = x
    else:
        old = log_sum[i]
        if old >= x:
            new = old + math.log1p(math.exp(x - old))
        else:
            new = x + math.log1p(math.exp(old - x))
    log_sum[i] = new
    return new


@kernel(inline="always")
def log_score(r, i):
    """log(rate) up to a term shared by all ids; -inf for an id never seen."""
    if r.count[i] == 0:
        return -math.inf
    if r.cumulative:
        return math.log(r.count[i])
    return r.log_sum[i]


@kernel(inline="always")
def log_shared(r, now):
    """The term shared by all ids at ``now``: log(rate) = log_score + log_shared."""
    if r.cumulative:
        return -math.log(max(now - r.t0, 1.0)) if r.started else 0.0
    return math.log(r.k) - now * r.k


@kernel(inline="always")
def log_warmup(r, now):
    """log of the factor that makes a decayed rate unbiased this soon after ``t0``.

    The decayed count of a steady Poisson stream of rate λ approaches λ / k only after a
    few half-lives; ``now − t0`` after the first request it is λ (1 − e^(−k (now − t0)))
    / k, so λ = rate / (1 − e^(−k (now − t0))) (one second floor, as the cumulative
    one's). The same for every id, so it never changes their order: it matters where
    rates are weighed against something else. 0 for ``cumulative``.
    """
    if r.cumulative or not r.started:
        return 0.0
    return -math.log(-math.expm1(-r.k * max(now - r.t0, 1.0)))


@kernel(inline="always")
def rate(r, i, now):
    """Requests per second for id ``i`` at ``now``."""
    count = r.count[i]
    if count == 0:
        return 0.0
    if r.cumulative:
        # One second floor on the elapsed time so the first requests do not divide by ~0.
        elapsed = now - r.t0
        if 1.0 > elapsed:
            elapsed = 1.0
        return count / elapsed
    return r.k * math.exp(r.log_sum[i] - now * r.k)


class RateEstimator:
    """Per-key request-rate estimate; ``log_score`` ranks keys like the rate does."""

    name: ClassVar[str]

    def __init__(self, cumulative: bool, k: float) -> None:
        self._ids = Ids()
        self._rates = new_rates(cumulative, k, INITIAL_CAPACITY)
        self._capacity = INITIAL_CAPACITY

    def record(self, key: Key, now: float) -> float:
        """Count one request for ``key`` at ``now``; return its new ``log_score``."""
        i = self._ids.intern(key)
        if i >= self._capacity:
            self._capacity *= 2
            grow_rates(self._rates, self._capacity)
        return record(self._rates, i, float(now))

    def log_score(self, key: Key) -> float:
        """log(rate) up to a term shared by all keys; -inf for a key never seen."""
        i = self._ids.get(key)
        return -math.inf if i is None else log_score(self._rates, i)

    def rate(self, key: Key, now: float) -> float:
        """Requests per second for ``key`` at ``now``."""
        i = self._ids.get(key)
        return 0.0 if i is None else rate(self._rates, i, float(now))


class CumulativeRate(RateEstimator):
    """λ = count / (now − t0): the whole history, weighted equally."""

    name = "cumulative"

    def __init__(self) -> None:
        super().__init__(*rate_parameters("cumulative", 0.0))


class DecayedRate(RateEstimator):
    """Exponentially decayed request count with half-life ``half_life`` seconds."""

    name = "decayed"

    def __init__(self, half_life: float = 600.0) -> None:
        super().__init__(*rate_parameters("decayed", half_life))
        self.half_life = float(half_life)


def make_rate_estimator(rate: str = "decayed", half_life: float = 600.0) -> RateEstimator:
    """The estimator named ``rate`` (``cumulative`` or ``decayed``)."""
    rate_parameters(rate, half_life)
    return CumulativeRate() if rate == "cumulative" else DecayedRate(half_life)
