"""A model-inference workload from function invocation counts (CremeBrulee §VI-A).

Steps, in the paper's order: (i) events: each minute's invocations get random times
within that minute; functions above the popularity quantile and one-hit wonders are
dropped; (ii) association: each function is paired with one model profile; (iii)
uniform downsampling of the requests. The time window is cut first (by the caller, see
``InvocationCounts.window``), so popularity and one-hit wonders are judged within it.
A share of the kept functions may fire as timers instead (``timer_share``,
``cachepolicies.workloads.timers``): periodic-heavy workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepolicies.traces import Profiles, Trace, make_profiles
from cachepolicies.workloads.association import ASSOCIATIONS, associate
from cachepolicies.workloads.errors import WorkloadError
from cachepolicies.workloads.events import spread_over_minutes
from cachepolicies.workloads.invocations import InvocationCounts
from cachepolicies.workloads.popularity import PopularityFilter, filter_by_popularity
from cachepolicies.workloads.timers import (
    TIMER_JITTER, TIMER_PERIODS, check_timer_options, timer_events)

NAMINGS = ("distinct", "real")


@dataclass(frozen=True)
class TraceOptions:
    """How to build a trace; see ``build_workload``."""

    association: str = "uniform"
    quantile: float = 0.9
    drop_one_hit: bool = True
    downsample: float = 1.0
    names: str = "distinct"
    seed: int = 0
    timer_share: float = 0.0
    timer_periods: tuple[float, float] = TIMER_PERIODS
    timer_jitter: float = TIMER_JITTER

    def __post_init__(self) -> None:
        if self.association not in ASSOCIATIONS:
            raise WorkloadError(f"unknown association {self.association!r}: expected one of "
                                f"{', '.join(ASSOCIATIONS)}")
        if self.names not in NAMINGS:
            raise WorkloadError(f"unknown naming {self.names!r}: expected one of "
                                f"{', '.join(NAMINGS)}")
        if not 0.0 < self.quantile <= 1.0:
            raise WorkloadError(f"quantile must be in (0, 1], got {self.quantile}")
        if not 0.0 < self.downsample <= 1.0:
            raise WorkloadError(f"downsample fraction must be in (0, 1], got {self.downsample}")
        check_timer_options(self.timer_share, self.timer_periods, self.timer_jitter)


@dataclass(frozen=True)
class Workload:
    """A trace and the profiles of exactly the models it requests.

    ``trace.timestamps`` are seconds from the start of the window; ``trace.model_ids``
    index ``profiles``. ``functions`` is how many functions survived the popularity filter,
    ``timers`` how many of them fire as timers.
    """

    trace: Trace
    profiles: Profiles
    popularity: PopularityFilter
    functions: int
    timers: int = 0

    def model_names(self) -> list[str]:
        """The model name of every request, in trace order."""
        names = np.array(self.profiles.names, dtype=object)
        return names[self.trace.model_ids].tolist()


def build_workload(invocations: InvocationCounts, profiles: Profiles,
                   options: TraceOptions = TraceOptions()) -> Workload:
    """The requests of ``invocations`` (all its minutes), each for a model of ``profiles``.

    - Functions above the ``quantile`` of popularity and, if ``drop_one_hit``, those
      invoked once are dropped (``filter_by_popularity``).
    - Each kept function gets a profile by ``association`` (``associate``), ranked by
      load penalty (``Profiles.penalty_seconds``: load plus any cold-run surplus).
    - ``timer_share`` > 0: that share of the kept functions (rounded, chosen at random)
      fire as timers instead of by their minute counts: a period in ``timer_periods``
      seconds, ``timer_jitter`` of it either way (``timer_events``).
    - ``downsample`` < 1 keeps exactly ``round(downsample × requests)`` requests chosen
      uniformly without replacement.
    - ``names="real"``: a request names its profile (testbed: the real models).
      ``names="distinct"``: kept function ``n`` is its own model ``<profile>-<n>`` with
      that profile's size and timings (simulation: many models).

    One seed drives it all. Association and event times do not depend on ``downsample``,
    and with the same seed a smaller fraction keeps a subset of a larger one's requests.
    """
    rng = np.random.default_rng(options.seed)
    totals = invocations.totals()
    popularity = filter_by_popularity(totals, options.quantile, options.drop_one_hit)
    kept = np.flatnonzero(popularity.keep)
    profile_of_function = associate(totals[kept], profiles.penalty_seconds,
                                    options.association, rng)
    times, function_of_request = spread_over_minutes(invocations.counts[kept], rng)
    timers = round(options.timer_share * len(kept))
    if timers:
        times, function_of_request = _with_timers(
            times, function_of_request, len(kept), timers, 60.0 * invocations.n_minutes,
            options, rng)
    if options.downsample < 1.0 and len(times):
        chosen = _downsample(len(times), options.downsample, options.seed)
        times, function_of_request = times[chosen], function_of_request[chosen]

    if options.names == "real":
        model_of_function = profile_of_function
        used, model_ids = np.unique(model_of_function[function_of_request], return_inverse=True)
        names = [profiles.names[i] for i in used]
        source_rows = used
    else:
        used, model_ids = np.unique(function_of_request, return_inverse=True)
        source_rows = profile_of_function[used]
        names = [f"{profiles.names[p]}-{f}" for p, f in zip(source_rows.tolist(), used.tolist())]
    out_profiles = _subset(profiles, source_rows, names)
    trace = Trace(timestamps=times, model_ids=model_ids.astype(np.int64),
                  source="<workload>")
    return Workload(trace, out_profiles, popularity, len(kept), timers)


def _with_timers(times: np.ndarray, rows: np.ndarray, functions: int, count: int,
                 seconds: float, options: TraceOptions, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The requests with ``count`` of the ``functions`` (chosen at random) firing as
    timers over ``seconds`` instead of their own requests, sorted by time."""
    timers = np.sort(rng.choice(functions, count, replace=False))
    fired, timer_of_firing = timer_events(count, seconds, rng,
                                          periods=options.timer_periods,
                                          jitter=options.timer_jitter)
    keep = ~np.isin(rows, timers)
    times = np.concatenate([times[keep], fired])
    rows = np.concatenate([rows[keep], timers[timer_of_firing]])
    order = np.argsort(times, kind="stable")
    return times[order], rows[order]


def _downsample(requests: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted positions of ``round(fraction × requests)`` requests, uniformly chosen.

    Each request gets a seeded random priority and the lowest ones are kept, so the
    choice for a smaller fraction is nested in that for a larger one.
    """
    keep = round(fraction * requests)
    priority = np.random.default_rng([seed, 1]).random(requests)
    if keep >= requests:
        return np.arange(requests)
    return np.sort(np.argpartition(priority, keep)[:keep])


def _subset(profiles: Profiles, rows: np.ndarray, names: list[str]) -> Profiles:
    """Profiles ``rows`` of ``profiles`` under ``names``; empty when no rows."""
    first_exec = profiles.first_exec_seconds
    if not names:
        empty = np.zeros(0)
        return Profiles(names=[], size_bytes=empty.astype(np.int64), load_seconds=empty,
                        exec_seconds=empty, first_exec_seconds=None, penalty_seconds=empty,
                        index={}, source="<workload>")
    download, disk = profiles.download_seconds, profiles.disk_bytes
    return make_profiles(names, profiles.size_bytes[rows], profiles.load_seconds[rows],
                         profiles.exec_seconds[rows],
                         None if first_exec is None else first_exec[rows],
                         download_seconds=None if download is None else download[rows],
                         disk_bytes=None if disk is None else disk[rows],
                         source="<workload>")
