"""Faro's probabilistic rate forecast and the reactive (short-term) scaler."""

import numpy as np
import pytest

from agent.coordinator.faro.forecast import forecast
from agent.coordinator.faro.reactive import ReactiveState, reactive_step


def seasonal(n=600, period=60, seed=0):
    t = np.arange(n)
    noise = np.random.default_rng(seed).normal(0, 3, n)
    return np.maximum(100 + 50 * np.sin(2 * np.pi * t / period) + noise, 0)


def test_forecast_quantiles_are_ordered_and_cover_the_future():
    y = seasonal(660)
    history, future = y[:600], y[600:607]
    f = forecast(history, 7, season_length=60)
    q = f.quantiles((0.05, 0.5, 0.95))
    assert np.all(q[0.05] <= q[0.5]) and np.all(q[0.5] <= q[0.95])
    assert np.all((future >= q[0.05] - 5) & (future <= q[0.95] + 5))
    assert f.samples.shape == (200, 7) and np.all(f.samples >= 0)
    assert f.window_quantile(0.9) > float(np.mean(f.mean))


def test_forecast_is_seeded_and_validates():
    y = seasonal(200)
    a, b = forecast(y, 5, seed=3), forecast(y, 5, seed=3)
    assert np.array_equal(a.samples, b.samples)
    with pytest.raises(ValueError):
        forecast([1.0, -2.0], 3)
    with pytest.raises(ValueError):
        forecast([], 3)
    assert forecast([5.0], 2).mean.tolist() == [5.0, 5.0]


def test_forecast_spread_grows_with_horizon():
    f = forecast(seasonal(300, seed=1), 10)
    assert np.all(np.diff(f.std) >= 0)


def test_reactive_adds_after_three_violations_and_never_scales_down():
    s = ReactiveState(replicas=4)
    for _ in range(2):
        s = reactive_step(s, 0.9, 0.72)
    assert s == ReactiveState(4, 2)
    s = reactive_step(s, 0.9, 0.72)
    assert s == ReactiveState(5, 0)
    s = reactive_step(reactive_step(s, 0.9, 0.72), 0.1, 0.72)  # a good tick resets
    assert s == ReactiveState(5, 0)
    for _ in range(30):
        s = reactive_step(s, 0.01, 0.72)
    assert s.replicas == 5
    capped = ReactiveState(6, 2)
    assert reactive_step(capped, 1.0, 0.72, max_replicas=6).replicas == 6
    assert reactive_step(capped, 1.0, 0.72, step=2).replicas == 8
