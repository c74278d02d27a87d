"""Latency statistics a model's scheduler needs: recent request latencies (percentiles),
the arrival rate, and the processing time of a batch as a function of its size.

Everything takes ``now`` (seconds on any monotonic clock) as an argument and never reads
a clock itself, so tests drive these objects with recorded measurements.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np


class LatencyWindow:
    """The last ``size`` request latencies, for percentiles (p50/p95/p99 and the SLO's)."""

    def __init__(self, size: int = 2048) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._values.append(seconds)

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100) in seconds, None before the first sample."""
        if not self._values:
            return None
        return float(np.percentile(np.fromiter(self._values, float), q))

    def percentiles(self, qs: tuple[float, ...] = (50, 95, 99)) -> dict[float, float | None]:
        if not self._values:
            return {q: None for q in qs}
        values = np.fromiter(self._values, float)
        return {q: float(v) for q, v in zip(qs, np.percentile(values, qs))}


class RateMeter:
    """Events per second, exponentially weighted with time constant ``tau`` seconds.

    Each event adds 1 to a counter that decays as ``exp(-dt / tau)``; in steady state the
    counter holds ``rate × tau`` events. The estimate follows a change in about ``tau``.
    """

    def __init__(self, tau: float = 1.0) -> None:
        self.tau = tau
        self._level = 0.0
        self._last: float | None = None

    def add(self, now: float, count: float = 1.0) -> None:
        if self._last is not None and now > self._last:
            self._level *= math.exp(-(now - self._last) / self.tau)
        if self._last is None or now > self._last:
            self._last = now
        self._level += count

    def rate(self, now: float) -> float:
        if self._last is None:
            return 0.0
        return self._level * math.exp(-max(now - self._last, 0.0) / self.tau) / self.tau


class BatchProfile:
    """Processing time per batch size, from the last ``window`` samples of each size
    observed: their median (``typical``, what predictions use: one stalled batch must not
    move it) and mean (reported), and a least-squares line ``T(b) = base + per_item × b``
    through the medians (weighted by samples), so sizes not (yet) observed can be
    predicted. A window of plain samples rather than an exponential average: the line's
    intercept is an extrapolation and amplifies noise in the per-size figures.

    ``predict_high`` is the time at the SLO's ``percentile``, what admission plans with
    (the SLO holds at a percentile, not on average): the size's typical time plus the
    ``percentile`` of the measured excess of a sample over its size's median, in
    seconds, pooled over sizes (one size alone rarely has enough samples for a p99),
    from the last ``EXCESSES``. Absolute, not relative: the noise of a short batch is
    scheduling jitter, which a ratio would blow up tenfold for a batch of a few ms."""

    #: A size needs this many samples before its own median is trusted over the line.
    MIN_SAMPLES = 3
    #: The line is refitted after this many new samples (it is a numpy fit).
    REFIT_EVERY = 8
    #: Excesses kept for ``predict_high``, and how many it needs before it trusts them.
    EXCESSES, MIN_EXCESSES = 512, 20

    def __init__(self, window: int = 32, percentile: float = 99.0) -> None:
        self.window = window
        self._percentile = percentile
        self._excess: deque[float] = deque(maxlen=self.EXCESSES)
        self._high: float | None = None  # the excess at ``percentile``, computed lazily
        self._sizes: dict[int, deque[float]] = {}
        self._typical: dict[int, float] = {}
        self._line: tuple[float, float] | None = None
        self._new = 0

    def observe(self, size: int, seconds: float) -> None:
        samples = self._sizes.get(size)
        if samples is None:
            samples = self._sizes[size] = deque(maxlen=self.window)
        if len(samples) >= self.MIN_SAMPLES:
            typical = self._typical[size]
            self._excess.append(seconds - typical)
            self._high = None
        samples.append(seconds)
        ordered = sorted(samples)
        n = len(ordered)
        self._typical[size] = (ordered[n // 2] if n % 2 else
                               (ordered[n // 2 - 1] + ordered[n // 2]) / 2)
        self._new += 1

    def __bool__(self) -> bool:
        return bool(self._sizes)

    def means(self) -> dict[int, float]:
        """Mean processing seconds by batch size (the sizes observed), for reports."""
        return {b: sum(v) / len(v) for b, v in sorted(self._sizes.items())}

    def typical(self, size: int) -> float | None:
        """The median of the size's recent samples (None if never observed)."""
        return self._typical.get(size)

    def count(self, size: int) -> int:
        samples = self._sizes.get(size)
        return len(samples) if samples else 0

    def line(self) -> tuple[float, float] | None:
        """(base, per_item) seconds fitted over the observed sizes (weighted by samples,
        both clamped at >= 0); None until two distinct sizes have been seen."""
        if self._new and (self._line is None or self._new >= self.REFIT_EVERY):
            self._line = self._fit()
            self._new = 0
        return self._line

    def _fit(self) -> tuple[float, float] | None:
        if len(self._sizes) < 2:
            return None
        b = np.fromiter(self._sizes, float)
        t = np.fromiter((self._typical[k] for k in self._sizes), float)
        w = np.fromiter((len(v) for v in self._sizes.values()), float)
        bm, tm = np.average(b, weights=w), np.average(t, weights=w)
        var = float(np.sum(w * (b - bm) ** 2))
        if var <= 0:
            return None
        slope = max(float(np.sum(w * (b - bm) * (t - tm))) / var, 0.0)
        return max(float(tm - slope * bm), 0.0), slope

    def predict(self, size: int) -> float | None:
        """Typical seconds for a batch of ``size``: the size's own median once it has
        ``MIN_SAMPLES``, else the fitted line, else, while only one size ``s`` is known
        with median ``t``, a lower bound of any ``base + per_item × size`` line through
        it (``base, per_item >= 0``): ``t`` for a larger size, ``t × size / s`` for a
        smaller one (optimistic both ways: a model is not refused on a guess); None
        before any observation."""
        if self.count(size) >= self.MIN_SAMPLES:
            return self._typical[size]
        line = self.line()
        if line is not None:
            return line[0] + line[1] * size
        if size in self._typical:
            return self._typical[size]
        if not self._sizes:
            return None
        known = min(self._sizes, key=lambda s: abs(s - size))
        typical = self._typical[known]
        return typical * max(size, 0) / known if size < known else typical

    @property
    def percentile(self) -> float:
        return self._percentile

    @percentile.setter
    def percentile(self, value: float) -> None:
        self._percentile, self._high = value, None

    def excess(self) -> float:
        """Seconds a batch takes over its typical time at the ``percentile`` (>= 0; 0
        until ``MIN_EXCESSES`` samples)."""
        if len(self._excess) < self.MIN_EXCESSES:
            return 0.0
        if self._high is None:
            self._high = max(0.0, float(np.percentile(np.fromiter(self._excess, float),
                                                      self.percentile)))
        return self._high

    def predict_high(self, size: int) -> float | None:
        """The time of a batch of ``size`` at the ``percentile`` (see the class doc)."""
        t = self.predict(size)
        return None if t is None else t + self.excess()
