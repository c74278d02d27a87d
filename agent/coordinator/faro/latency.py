"""Latency estimators of Faro §3.3/§3.4: the upper bound and the (relaxed) M/D/c percentile.

Times are in seconds, rates in requests per second, percentiles in (0, 100).

Decisions where the paper is vague:

* Upper bound ``c × κ / N``: κ is the number of requests that arrive in one second
  (``κ = λ × 1 s``), the reading that reproduces the paper's example (p = 150 ms,
  λ = 40/s, SLO 600 ms → 10 replicas). It is floored at ``p``: one request still takes
  its processing time. It ignores the percentile and needs no stability relaxation.
* M/D/c: the k-th percentile of the M/D/c waiting time is taken as ½ of the M/M/c one,
  ``P(W > t) = C(N, a) · exp(-(N/p - λ) t)`` (Erlang C), plus the processing time p.
  The percentile of the waiting time is 0 when ``C(N, a) <= 1 - k/100``.
* Relaxation (§3.4): for ``ρ = pλ/N > ρ_max`` the latency is the one at
  ``λ' = ρ_max N / p`` inflated by ``λ / λ'``; continuous at ``ρ = ρ_max`` and
  increasing in λ beyond it.
* Stability cap (our addition): with a loose SLO the relaxed latency of an *unstable*
  queue can fall under the SLO (λ = 100/s, p = 180 ms, SLO 720 ms at p99 is "met" by
  17 replicas although 19 are needed for ρ < 1). ``stable_fraction`` = min(1, ρ_max/ρ)
  is the share of the load the replicas can serve stably; the solvers cap utility by
  it, so utility 1 (and Stage-3 shrinking) never lands on an unstable queue while the
  relaxed utility keeps rising without a plateau.
* Erlang B by the recursion ``B(n) = a B(n-1) / (n + a B(n-1))``: stable for any N.
"""

from __future__ import annotations

import math

from numba import njit

from agent.coordinator.choices import ESTIMATORS, RHO_MAX

UPPER_BOUND_WINDOW_S = 1.0


@njit(cache=True)
def erlang_b(servers, load):
    """Erlang B blocking probability for ``servers`` servers and offered load ``load``."""
    b = 1.0
    for n in range(1, servers + 1):
        b = load * b / (n + load * b)
    return b


@njit(cache=True)
def erlang_c_from_b(servers, load, b):
    """Erlang C (probability of waiting) from Erlang B; 1 when the queue is unstable."""
    rho = load / servers
    if rho >= 1.0:
        return 1.0
    return b / (1.0 - rho * (1.0 - b))


@njit(cache=True)
def erlang_c(servers, load):
    """Erlang C: probability that an arrival waits in an M/M/c queue."""
    return erlang_c_from_b(servers, load, erlang_b(servers, load))


@njit(cache=True)
def _mdc_from_c(percentile, proc, rate, servers, c_wait):
    """M/D/c k-th percentile latency given Erlang C; ``inf`` when unstable."""
    drain = servers / proc - rate
    if drain <= 0.0:
        return math.inf
    tail = 1.0 - percentile / 100.0
    if c_wait <= tail:
        return proc
    return proc + 0.5 * math.log(c_wait / tail) / drain


@njit(cache=True)
def mdc_latency(percentile, proc, rate, servers):
    """k-th percentile latency of an M/D/c queue (½ M/M/c wait + p); ``inf`` if ρ >= 1."""
    load = rate * proc
    if load >= servers:
        return math.inf
    return _mdc_from_c(percentile, proc, rate, servers, erlang_c(servers, load))


@njit(cache=True)
def mdc_latency_relaxed(percentile, proc, rate, servers, rho_max):
    """Faro's relaxed M/D/c latency: finite for any λ, continuous and increasing in λ."""
    if rate * proc <= rho_max * servers:
        return mdc_latency(percentile, proc, rate, servers)
    stable_rate = rho_max * servers / proc
    return rate / stable_rate * mdc_latency(percentile, proc, stable_rate, servers)


@njit(cache=True)
def stable_fraction(proc, rate, servers, rho_max):
    """min(1, ρ_max / ρ): the share of the load ``servers`` replicas serve stably."""
    load = rate * proc
    if load <= rho_max * servers:
        return 1.0
    return rho_max * servers / load


def mdc_within_slo(proc, rate, servers, slo, rho_max=RHO_MAX):
    """The share of requests answered within ``slo`` by ``servers`` replicas (M/D/c as
    ``mdc_latency``: ``P(W > t) = C(N, a) · exp(-2 (N/p - λ) t)``). Beyond ``rho_max``
    only the ``stable_fraction`` of the load is served, at the stable rate; the rest
    misses. 0 when ``slo < proc`` or there are no replicas."""
    if servers < 1 or slo < proc:
        return 0.0
    if rate <= 0.0:
        return 1.0
    share = stable_fraction(proc, rate, servers, rho_max)
    rate = min(rate, rho_max * servers / proc)
    drain = servers / proc - rate
    waits = erlang_c(servers, rate * proc)
    return share * max(0.0, 1.0 - waits * math.exp(-2.0 * drain * (slo - proc)))


@njit(cache=True)
def upper_bound_latency(proc, rate, servers, window):
    """Pessimistic bound ``p × κ / N`` with κ = λ × window requests, floored at p."""
    return max(proc, proc * rate * window / servers)


def estimate_latency(
    percentile: float,
    proc_s: float,
    rate: float,
    replicas: int,
    estimator: str = "mdc",
    rho_max: float = RHO_MAX,
) -> float:
    """The estimated ``percentile``-th latency in seconds (relaxed for unstable queues)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    if not 0.0 < percentile < 100.0:
        raise ValueError(f"percentile must be in (0, 100), got {percentile}")
    if not proc_s > 0.0 or not math.isfinite(proc_s):
        raise ValueError(f"processing time must be > 0, got {proc_s}")
    if not rate >= 0.0 or not math.isfinite(rate):
        raise ValueError(f"rate must be >= 0, got {rate}")
    if int(replicas) != replicas or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas}")
    if not 0.0 < rho_max < 1.0:
        raise ValueError(f"rho_max must be in (0, 1), got {rho_max}")
    if estimator == "upper":
        return float(upper_bound_latency(proc_s, rate, int(replicas), UPPER_BOUND_WINDOW_S))
    return float(mdc_latency_relaxed(percentile, proc_s, rate, int(replicas), rho_max))
