"""Probabilistic arrival-rate forecast for the next planning window (Faro §3.5).

Faro's N-HiTS + Gaussian head is replaced by a light forecaster with the same output:
additive Holt-Winters (damped trend; a seasonal term when ``season_length`` is given
and the history covers two seasons), fitted by grid search on one-step-ahead squared
error, and a Gaussian predictive distribution per step whose spread comes from the
one-step residuals, widened with the horizon as for simple exponential smoothing
(``σ_h² = σ² (1 + (h − 1) α²)``). Samples are drawn with a seeded generator and clipped
at 0. The planner uses a high quantile of the window (``window_quantile``), not the
mean, to cover the fluctuation a point forecast misses (§3.5.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy.stats import norm

_ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)
_BETAS = (0.0, 0.1, 0.3)
_GAMMAS = (0.1, 0.3)
_DAMPING = 0.9


@dataclass(frozen=True)
class RateForecast:
    """Predictive distribution of the rate for each of the next ``horizon`` steps."""

    mean: np.ndarray
    std: np.ndarray
    samples: np.ndarray  # (n_samples, horizon), >= 0

    def quantiles(self, qs=(0.1, 0.5, 0.9, 0.99)) -> dict[float, np.ndarray]:
        """Per-step quantiles of the Gaussian predictive distribution, clipped at 0."""
        return {float(q): np.maximum(self.mean + norm.ppf(q) * self.std, 0.0) for q in qs}

    def window_quantile(self, q: float = 0.9) -> float:
        """The ``q`` quantile of all sampled rates over the window: what Faro plans for."""
        return float(np.quantile(self.samples, q))


@njit(cache=True)
def _smooth(y, alpha, beta, gamma, damping, m):
    """One-step SSE and final (level, trend, seasonals) of additive Holt-Winters."""
    n = y.shape[0]
    season = np.zeros(max(m, 1))
    if m > 0:
        base = y[:m].mean()
        for k in range(m):
            season[k] = y[k] - base
        level = base
        start = m
    else:
        level = y[0]
        start = 1
    trend = 0.0
    sse = 0.0
    count = 0
    for t in range(start, n):
        s = season[t % m] if m > 0 else 0.0
        pred = level + damping * trend + s
        err = y[t] - pred
        sse += err * err
        count += 1
        new_level = alpha * (y[t] - s) + (1 - alpha) * (level + damping * trend)
        trend = beta * (new_level - level) + (1 - beta) * damping * trend
        level = new_level
        if m > 0:
            season[t % m] = gamma * (y[t] - level) + (1 - gamma) * s
    return sse / max(count, 1), level, trend, season


def forecast(history, horizon: int, *, season_length: int | None = None,
             n_samples: int = 200, seed: int = 0) -> RateForecast:
    """Forecast ``horizon`` future rates from ``history`` (oldest first, one per step)."""
    y = np.asarray(history, dtype=float)
    if y.ndim != 1 or y.size == 0 or not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError("history must be a non-empty 1-D sequence of rates >= 0")
    if horizon < 1:
        raise ValueError("horizon must be >= 1")
    m = int(season_length) if season_length and y.size >= 2 * season_length else 0
    if y.size < 3:
        mean = np.full(horizon, y.mean())
        std = np.full(horizon, y.std() if y.size > 1 else 0.0)
    else:
        best = None
        for a in _ALPHAS:
            for b in _BETAS:
                for g in (_GAMMAS if m else (0.0,)):
                    mse, level, trend, season = _smooth(y, a, b, g, _DAMPING, m)
                    if best is None or mse < best[0]:
                        best = (mse, a, level, trend, season.copy())
        mse, a, level, trend, season = best
        steps = np.arange(1, horizon + 1)
        damp = np.cumsum(_DAMPING ** steps)
        mean = level + damp * trend
        if m:
            mean = mean + season[(y.size + steps - 1) % m]
        std = np.sqrt(mse * (1.0 + (steps - 1) * a * a))
    rng = np.random.default_rng(seed)
    samples = np.maximum(rng.normal(mean, std, size=(n_samples, horizon)), 0.0)
    return RateForecast(mean=np.maximum(mean, 0.0), std=std, samples=samples)
