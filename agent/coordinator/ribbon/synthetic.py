"""Synthetic fleet-sizing grids in Ribbon's format, for tests and benches on grids the
search has never seen (other prices, shapes and numbers of types).

A pool serves a Poisson stream from one queue; an instance of type ``i`` takes
``service_ms[i]`` per query. The waiting time follows Erlang C for ``c`` servers of the
pool's mean rate; a query served by type ``i`` meets the latency target when its wait is
below ``target - service_ms[i]``, so a type slower than the target only adds misses (the
grids are not monotone, as the measured ones are not). QoS is rounded to 0.01 % with a
small seeded measurement noise; prices are sums of instance prices, rounded to cents.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load ``a`` (< c) Erlangs."""
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    term, total = 1.0, 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c * c / (c - a)
    return last / (total + last)


def pool_qos(counts, service_ms, rate_per_ms: float, target_ms: float) -> float:
    """Percent of queries within ``target_ms`` on a pool of ``counts`` instances."""
    rates = [n / s for n, s in zip(counts, service_ms)]
    mu = sum(rates)
    c = int(sum(counts))
    if c == 0 or rate_per_ms >= mu:
        return 0.0
    p_wait = erlang_c(c, rate_per_ms / (mu / c))
    ok = 0.0
    for r, s in zip(rates, service_ms):
        if r == 0 or s > target_ms:
            continue
        ok += r / mu * (1.0 - p_wait * math.exp(-(mu - rate_per_ms) * (target_ms - s)))
    return 100.0 * ok


def make_grid(seed: int, n_types: int | None = None) -> tuple[dict, dict]:
    """A (config, lookup) pair in the format of ``shared/data/ribbon``."""
    rng = np.random.default_rng(seed)
    n = int(n_types or rng.integers(2, 5))
    target = 100.0
    service = rng.uniform(20.0, 90.0, n)
    if n >= 3:
        service[rng.integers(n)] = rng.uniform(75.0, 98.0)   # a type near the target
    speed = 1.0 / service
    price = np.round(speed / speed.mean() * rng.uniform(0.3, 1.2) * rng.uniform(0.6, 1.5, n),
                     3)
    max_num = [int(m) for m in rng.integers(4, 13 if n <= 3 else 8, n)]
    capacity = float(sum(m / s for m, s in zip(max_num, service)))
    rate = capacity * rng.uniform(0.25, 0.45)
    config = {"ins_types": [f"type{i}" for i in range(n)], "max_num": max_num,
              "inter_arrival": 1.0 / rate, "qos": target, "rm": f"synthetic{seed}",
              "prices": [float(p) for p in price]}
    lookup = {}
    for counts in itertools.product(*(range(m + 1) for m in max_num)):
        if not any(counts):
            continue
        q = pool_qos(counts, service, rate, target)
        q = min(100.0, max(0.0, q + rng.normal(0.0, 0.05))) if 0 < q < 100 else q
        p = round(float(np.dot(counts, price)), 2)
        lookup[", ".join(map(str, counts))] = [p, round(q, 2)]
    return config, lookup


def optimum(lookup: dict, target: float = 99.0) -> tuple[str, float] | None:
    """(key, price) of the cheapest entry meeting ``target``, ties to the first key."""
    best = None
    for key, (p, q) in lookup.items():
        if q >= target and (best is None or p < best[1]):
            best = (key, p)
    return best
