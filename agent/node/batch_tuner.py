"""How big a batch may be and how long to wait for one, tuned online per model.

Two rules, both fed with measured batch latencies (``now`` is always passed in, so tests
replay recorded latencies without sleeping):

- ``AimdLimit`` (Clipper §4.3.1): the batch limit grows by a fixed step after each full
  batch whose latency stays within the budget, and is cut by 10 % when a batch exceeds
  it; never above the model's ``max_batch_size``.
- ``delay_window`` (Clipper §4.3.2, MArk §4.3): how long a worker waits for a batch to
  fill when fewer requests are queued than the limit.

Decisions where the papers are vague:

- *Budget.* A request may wait for the batch running ahead of it before its own batch
  runs, so a batch gets ``budget_fraction`` (default 0.5) of the SLO latency, not all of
  it; n* = floor((budget − base) / per_item) for a linear profile.
- *Only full batches raise the limit*: a batch smaller than the limit says nothing
  about the limit. An overshoot of a (nearly) full batch of size s also remembers s − 1
  as a ceiling, so the limit settles at the largest size within budget instead of
  oscillating between it and 90 % of it (pure AIMD's saw-tooth). The ceiling is lifted
  (and additive increase resumes) once the measured (median) time at the limit plus one
  step of the fitted per-item cost fits the budget again, so the limit follows a model
  that gets faster; one that gets slower overshoots and is cut.
- *The window.* MArk says to grow b while W + T_b ≤ RT_max and W + T_b ≤ b / μ_nb but
  not how W relates to b. Here W_b = (b − 1) / λ, the expected time for b − 1 more
  requests to arrive at the measured rate λ; μ_nb = 1 / T(1). For a linear profile the
  second rule reads 1/λ ≤ base: waiting pays only when requests arrive faster than the
  fixed cost per batch, so a low-base model is never delayed. To keep a noisy
  profile from inventing a gain, waiting must beat unbatched throughput by
  ``WAIT_GAIN`` (10 %): W_b + T_b ≤ 0.9 × b × T_1. RT_max is the same per-batch budget
  AIMD uses (``budget_fraction`` of the SLO), not the whole SLO: a request may wait for
  the batch running ahead of it (≤ budget) and then for its own window and batch
  (≤ budget), so the two together stay within the SLO. With RT_max = the SLO the rule
  spends the whole SLO waiting, and a burst then has no room left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.node.latency_stats import BatchProfile, RateMeter

#: Multiplicative decrease (Clipper: "reducing the batch size by 10 %").
BACKOFF = 0.9
#: Waiting must beat unbatched throughput by this share (guards against noisy profiles).
WAIT_GAIN = 0.1


@dataclass(frozen=True)
class TunerSettings:
    """A model's resolved batching knobs (seconds, batch sizes in rows)."""

    max_batch_size: int
    slo: float
    budget_fraction: float = 0.5
    aimd_step: int = 2
    window_max: float = 0.1
    adaptive: bool = True
    percentile: float = 99.0  # the SLO's: admission plans batch times at it

    @property
    def budget(self) -> float:
        """The latency one batch may take."""
        return self.slo * self.budget_fraction


class AimdLimit:
    """Clipper's additive-increase / multiplicative-decrease batch limit, with a ceiling
    remembered after an overshoot (see the module docstring)."""

    def __init__(self, max_size: int, budget: float, step: int = 2, start: int = 1) -> None:
        self.max_size, self.budget, self.step = max(1, max_size), budget, max(1, step)
        self.limit = max(1, min(start, self.max_size))
        self.ceiling: int | None = None
        self.increases = self.decreases = 0

    def observe(self, size: int, seconds: float, full: bool,
                profile: BatchProfile | None = None) -> int:
        """Account one batch of ``size`` rows that took ``seconds``; ``full`` when the
        limit (not a lack of requests) decided its size. Returns the new limit."""
        if seconds > self.budget:
            if full or size >= self.limit:
                self.ceiling = max(1, min(self.ceiling or size, size - 1))
            if size <= self.limit:  # an oversized single request says nothing of the limit
                self.limit = max(1, math.floor(self.limit * BACKOFF))
                if self.ceiling is not None:
                    self.limit = min(self.limit, self.ceiling)
                self.decreases += 1
            return self.limit
        if not full or size < self.limit:
            return self.limit
        target = min(self.limit + self.step, self.max_size)
        if self.ceiling is not None and target > self.ceiling:
            if self.limit < self.ceiling:
                target = self.ceiling
            elif self._room_for_a_step(profile):
                self.ceiling = None
            else:
                target = self.limit
        if target > self.limit:
            self.increases += 1
        self.limit = target
        return self.limit

    def _room_for_a_step(self, profile: BatchProfile | None) -> bool:
        """Whether the measured (median) latency at the limit plus one step of the
        fitted per-item cost fits the budget. While the limit is the only size measured
        there is no line to ask, and the answer is yes: the step is a probe, and if it
        overshoots, the cut leaves two sizes measured. (Answering no pinned a model at
        1 for good after one stalled first batch.)"""
        if profile is None:
            return False
        typical = profile.typical(self.limit)
        if typical is None:
            return False
        line = profile.line()
        return line is None or typical + line[1] * self.step <= self.budget


def delay_window(profile: BatchProfile, rate: float, limit: int, rt_max: float,
                 window_max: float) -> tuple[int, float]:
    """MArk's rule: (target batch size N, window W seconds). Grows b from 1 while
    W_b + T_b ≤ rt_max and W_b + T_b ≤ (1 − WAIT_GAIN) × b × T_1, with
    W_b = (b − 1) / rate ≤ window_max.
    (1, 0.0) means "dispatch at once": no delay pays, or nothing is measured yet."""
    t1 = profile.predict(1)
    if t1 is None or rate <= 0 or window_max <= 0 or limit < 2:
        return 1, 0.0
    best = (1, 0.0)
    for b in range(2, limit + 1):
        window = (b - 1) / rate
        t_b = profile.predict(b)
        if t_b is None or window > window_max:
            break
        if window + t_b > rt_max or window + t_b > (1 - WAIT_GAIN) * b * t1:
            break
        best = (b, window)
    return best


class BatchTuner:
    """One model's limit, target and window, re-tuned as batches and arrivals come in."""

    #: Seconds between two window re-computations (the rule loops over batch sizes).
    RETUNE_EVERY = 0.05

    def __init__(self, settings: TunerSettings, *, rate_tau: float = 1.0) -> None:
        self.profile = BatchProfile()
        self.arrivals = RateMeter(rate_tau)
        self.settings = settings
        self.aimd = AimdLimit(settings.max_batch_size, settings.budget, settings.aimd_step)
        self.target, self.window = 1, 0.0
        self._retuned: float | None = None
        self.configure(settings)

    def configure(self, settings: TunerSettings) -> None:
        """Adopt new settings (a reload with an edited config.yaml); keeps measurements."""
        self.settings = settings
        self.profile.percentile = settings.percentile
        self.aimd.max_size = max(1, settings.max_batch_size)
        self.aimd.budget, self.aimd.step = settings.budget, max(1, settings.aimd_step)
        self.aimd.limit = min(self.aimd.limit, self.aimd.max_size)
        if not settings.adaptive:
            self.target, self.window = self.aimd.max_size, settings.window_max
        self._retuned = None

    @property
    def limit(self) -> int:
        """The most rows one batch may hold now."""
        return self.aimd.max_size if not self.settings.adaptive else self.aimd.limit

    def growth(self) -> tuple[int, int]:
        """(step, cap): how the limit grows per full batch from now on, as admission
        plans it: AIMD's step up to the remembered ceiling, the model's maximum, and the
        largest size the profile's line fits in the budget. (0, limit) when static."""
        if not self.settings.adaptive:
            return 0, self.limit
        cap = self.aimd.ceiling or self.aimd.max_size
        line = self.profile.line()
        if line is not None and line[1] > 0:
            cap = min(cap, max(1, math.floor((self.settings.budget - line[0]) / line[1])))
        return self.aimd.step, max(cap, self.aimd.limit)

    def observe_arrival(self, now: float, rows: int = 1) -> None:
        self.arrivals.add(now, rows)

    def observe_batch(self, now: float, rows: int, seconds: float, full: bool) -> None:
        self.profile.observe(rows, seconds)
        if self.settings.adaptive:
            before = self.aimd.limit
            self.aimd.observe(rows, seconds, full, self.profile)
            if self.aimd.limit != before:
                self._retuned = None
        self.maybe_retune(now)

    def maybe_retune(self, now: float) -> None:
        if self._retuned is None or now - self._retuned >= self.RETUNE_EVERY:
            self.retune(now)

    def retune(self, now: float) -> None:
        """Recompute the target and window from the current profile and arrival rate."""
        self._retuned = now
        if not self.settings.adaptive:
            return
        self.target, self.window = delay_window(
            self.profile, self.arrivals.rate(now), self.aimd.limit,
            self.settings.budget, self.settings.window_max)
