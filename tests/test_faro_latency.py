"""Faro latency estimators: Erlang C, the paper's example, the relaxation."""

import math

import numpy as np
import pytest

from agent.coordinator.faro.latency import (
    erlang_b,
    erlang_c,
    estimate_latency,
    mdc_latency,
    mdc_latency_relaxed,
    stable_fraction,
)


def direct_erlang_c(n: int, a: float) -> float:
    top = a**n / math.factorial(n) * n / (n - a)
    return top / (sum(a**k / math.factorial(k) for k in range(n)) + top)


@pytest.mark.parametrize("n", range(1, 12))
def test_erlang_c_matches_direct_formula(n):
    for a in np.linspace(0.05, n - 0.05, 9):
        assert erlang_c(n, a) == pytest.approx(direct_erlang_c(n, a), rel=1e-10)


def test_erlang_is_finite_for_large_n():
    for n, a in [(2000, 1900.0), (10000, 9990.0), (50000, 40000.0)]:
        c = erlang_c(n, a)
        assert 0.0 < c < 1.0 and math.isfinite(c)
        assert 0.0 <= erlang_b(n, a) < 1.0
    assert erlang_c(5000, 4000.0) < 1e-10  # light load: almost nobody waits


def test_mm1_waiting_percentile():
    # M/M/1: P(W > t) = rho exp(-(mu - lam) t); M/D/c takes half the M/M/c wait.
    p, lam, q = 0.1, 5.0, 0.99
    t = math.log(0.5 / (1 - q)) / (1 / p - lam)
    assert mdc_latency(99.0, p, lam, 1) == pytest.approx(p + t / 2)


def test_paper_example_replica_counts():
    """§3.3: p = 150 ms, 40 req/s, SLO 600 ms at p99.99 → 8 (M/D/c) and 10 (upper)."""
    def needed(estimator):
        return next(n for n in range(1, 50)
                    if estimate_latency(99.99, 0.15, 40.0, n, estimator) <= 0.6 + 1e-12)
    assert needed("mdc") == 8
    assert needed("upper") == 10


def test_unstable_queue_is_infinite_unless_relaxed():
    assert math.isinf(mdc_latency(99.0, 0.15, 40.0, 6))
    assert math.isfinite(mdc_latency_relaxed(99.0, 0.15, 40.0, 6, 0.95))


@pytest.mark.parametrize("servers", [1, 2, 5, 17, 100])
def test_relaxation_is_monotone_and_continuous_in_rate(servers):
    p, rho_max = 0.18, 0.95
    rates = np.linspace(0.0, 4 * servers / p, 400)
    lat = [mdc_latency_relaxed(99.0, p, r, servers, rho_max) for r in rates]
    assert all(np.isfinite(lat))
    assert all(b >= a - 1e-12 for a, b in zip(lat, lat[1:]))
    edge = rho_max * servers / p
    below = mdc_latency_relaxed(99.0, p, edge * (1 - 1e-9), servers, rho_max)
    above = mdc_latency_relaxed(99.0, p, edge * (1 + 1e-9), servers, rho_max)
    assert above == pytest.approx(below, rel=1e-6)
    assert mdc_latency_relaxed(99.0, p, 2 * edge, servers, rho_max) == pytest.approx(
        2 * mdc_latency_relaxed(99.0, p, edge, servers, rho_max))


def test_latency_decreases_with_replicas():
    lat = [estimate_latency(99.0, 0.18, 100.0, n) for n in range(1, 60)]
    assert all(b <= a + 1e-12 for a, b in zip(lat, lat[1:]))
    assert lat[-1] == pytest.approx(0.18)


def test_stable_fraction():
    assert stable_fraction(0.1, 10.0, 2, 0.95) == 1.0
    assert stable_fraction(0.1, 40.0, 2, 0.95) == pytest.approx(0.95 * 2 / 4)


@pytest.mark.parametrize("kwargs", [
    dict(percentile=100.0), dict(proc_s=0.0), dict(rate=-1.0), dict(replicas=0),
    dict(estimator="mmc"),
])
def test_bad_inputs_raise(kwargs):
    args = dict(percentile=99.0, proc_s=0.1, rate=1.0, replicas=1, estimator="mdc")
    args.update(kwargs)
    with pytest.raises(ValueError):
        estimate_latency(**args)
