"""CremeBrulee with forecast arrivals: evict the lowest penalty / (size · B̂), B̂ the
forecast time to the model's next request.

CremeBrulee (§V-A) estimates the Belady boundary B as 1/λ: right for Poisson arrivals,
blind to a timer, whose next request is nearly certain. Here each model's inter-arrival
gaps are watched: after ``confirm`` gaps in a row within ``tolerance`` of its period
estimate (the running mean of the matching gaps) the model is *periodic*, or after
fewer where timers are common: as soon as the matching gaps' likelihood ratio (timer
against Poisson) times the prior odds from the timers' share of requests reaches
``odds`` (``_needed``: one gap where timers are a few % of the requests, ``confirm``
without timers). A periodic model's B̂ = last + period − now, shrinking as its next
firing nears (never below a thousandth of the period); once it is more than
``tolerance`` of a period overdue (a skipped or stopped timer) and for every other
model, B̂ = 1/λ with λ CremeBrulee's own rate estimate (``rate``, ``half_life``), the
decayed one scaled to be unbiased in its first half-lives (``rates.log_warmup``: early
on it undercounts, and rate-ranked models would lose to forecast ones they should
not).

A rate read at a model's request counts that request: for a Poisson model with n
requests in t seconds, the last now, it says n / t where (n − 1) / t is unbiased, most
off for models requested a few times an hour. Among rate-ranked models the bias is
alike for all and CremeBrulee's order is the better one (docs/benchmarks.md), but
against a timer's forecast it keeps rare models over timers. So at each request
d = ``discount`` × s of the request is taken out of the model's count, s the share of
the last ~1,000 requests (``SHARE_WEIGHT``) that came from models found periodic with a
period of a second or more, less ``SHARE_FLOOR``: 0 without timers, where the order
stays CremeBrulee's and the two policies decide alike.

Faro's forecaster (Holt-Winters over per-minute rates,
``agent.coordinator.faro.forecast``) plans replicas minutes ahead from rate series; an
eviction needs the next arrival of one model seconds ahead, and the decayed
count is already that forecaster's level term, so it is not used here.

A periodic model's utility changes with time alone, so the two kinds are kept apart:
the others in a heap by log utility (their order changes only on a request, as in
CremeBrulee), the periodic ones in a list whose utilities an eviction computes afresh;
the walk merges the two. An eviction costs O(periodic residents · victims) beside
CremeBrulee's O(victims · log n).
The eviction set is trimmed to the largest victims that suffice (§V-B).
"""

from __future__ import annotations

import math

import numpy as np

from cachepolicies import rates
from cachepolicies.base import Key, Policy
from cachepolicies.cremebrulee import log_worth
from cachepolicies.heap import (
    grow_heap, heap_first, heap_next, heap_priority, heap_remove, heap_set, new_heap)
from cachepolicies.jit import structref, types
from cachepolicies.kernels import grown, implements, kernel


@structref.register
class ForecastStateType(types.StructRef):
    pass


class ForecastState(structref.StructRefProxy):
    pass


# The shortest period of a timer counted in the share of requests from timers (seconds):
# schedulers fire at most once a second (NCRONTAB's finest field); shorter regular gaps
# are bursts, such as a batch of concurrent requests. That share is a moving average
# over requests of weight SHARE_WEIGHT (the last ~1,000), corrected for its start as
# the first requests come in; SHARE_FLOOR is taken off it (a share below it is chance:
# Poisson models found periodic for a while); the discount is capped below one request.
TIMER_MIN_PERIOD = 1.0
SHARE_WEIGHT = 1e-3
SHARE_FLOOR = 0.01
MAX_DISCOUNT = 0.95


# Per id, while resident: worth = penalty / size and log_worth its log (-inf: no
# penalty); per id: last (time of the last request, NaN: none yet), period (seconds, 0:
# no estimate), streak (gaps in a row that matched it) and periodic (whether the streak
# reached ``_needed`` at its last request); pslot, the id's place in pids
# (-1: not listed). pids[:pcount] lists the resident periodic ids. A walk's scratch:
# putil, per pids slot the utility (penalty / (size · B̂), +inf once taken);
# pending_heap / pending_periodic, the next candidate of each kind (-1: none left), and
# pending_util the latter's log utility; shared, the term of the rate-based ones.
# adjust: per id, the log of the share of its count kept at its last request (0: all);
# share: the moving average of 1 per request from a timer, 0 from another model, and
# share_norm the same of 1 for every request (share / share_norm: the share so far).
structref.define_proxy(ForecastState, ForecastStateType,
                       ["res", "heap", "rates", "worth", "log_worth", "last", "period",
                        "streak", "pslot", "pids", "pcount", "putil", "pending_heap",
                        "pending_periodic", "pending_util", "shared", "tolerance", "confirm",
                        "discount", "adjust", "share", "share_norm", "odds",
                        "periodic"])


@kernel
def new_state(res, cumulative, k, tolerance, confirm, discount, odds):
    n = len(res.size)
    return ForecastState(res, new_heap(n), rates.new_rates(cumulative, k, n), np.zeros(n),
                         np.zeros(n), np.full(n, np.nan), np.zeros(n), np.zeros(n, np.int64),
                         np.full(n, -1, np.int64), np.zeros(n, np.int64), np.int64(0),
                         np.zeros(n), np.int64(-1), np.int64(-1), 0.0, 0.0, tolerance,
                         confirm, discount, np.zeros(n), 0.0, 0.0, odds,
                         np.zeros(n, np.bool_))


@kernel
def _on_access(s, i, now):
    log_score = rates.record(s.rates, i, now)
    periodic, period = _observe_gap(s, i, now)
    log_score += _discount(s, i, now, log_score, periodic and period >= TIMER_MIN_PERIOD)
    if s.res.slot[i] >= 0:
        listed = s.pslot[i] >= 0
        if periodic and not listed:
            heap_remove(s.heap, i)
            _list(s, i)
        elif not periodic:
            if listed:
                _unlist(s, i)
            heap_set(s.heap, i, s.log_worth[i] + log_score)
    return True


@kernel(inline="always")
def _observe_gap(s, i, now):
    """Match the gap since the last request against the period estimate; return
    (periodic, period) as they now are."""
    last = s.last[i]
    s.last[i] = now
    if last != last:  # the first request
        return False, 0.0
    gap = now - last
    period = s.period[i]
    if period > 0 and abs(gap - period) <= s.tolerance * period:
        streak = s.streak[i] + 1
        period += (gap - period) / (streak + 1)
    else:
        streak = 0
        period = gap
    s.streak[i] = streak
    s.period[i] = period
    # _needed is from 1 to confirm: worked out only for a streak in between
    periodic = streak >= s.confirm or (streak > 0 and streak >= _needed(s))
    s.periodic[i] = periodic
    return periodic, period


@kernel
def _needed(s):
    """The matching gaps that make a model periodic: the fewest (at least one, at most
    ``confirm``) whose likelihood ratio, timer against Poisson, times the prior odds
    that a model is a timer reaches ``odds``. A gap within ``tolerance`` of a period P
    is near certain for a timer and has a chance of at most 2 · tolerance / e for a
    Poisson model (2 · tolerance · λP · e^(−λP), largest at λP = 1), a ratio of
    e / (2 · tolerance) per gap (27 at 5 %); the prior is the timers' share of recent
    requests (``_timer_share``). Without timers, or ``odds`` 0: ``confirm``."""
    p = _timer_share(s)
    if s.odds <= 0 or p <= 0:
        return s.confirm
    gaps = math.log(s.odds * (1.0 - p) / p) / math.log(math.e / (2.0 * s.tolerance))
    return min(max(math.ceil(gaps), 1), s.confirm)


@kernel(inline="always")
def _timer_share(s):
    """The share of recent requests that came from timers, less ``SHARE_FLOOR`` (at
    most 0 without timers)."""
    return s.share / s.share_norm - SHARE_FLOOR if s.share_norm > 0 else -SHARE_FLOOR


@kernel(inline="always")
def _discount(s, i, now, log_score, timer):
    """log((count − d) / count) for ``i`` just requested (``log_score`` its new score;
    ``timer``: it is periodic, a period of ``TIMER_MIN_PERIOD`` or more), kept in
    ``adjust[i]`` until its next request: d = ``discount`` × the share of recent
    requests that came from timers, this one counted, less ``SHARE_FLOOR`` (0 without
    timers: CremeBrulee's order)."""
    share = s.share + ((1.0 if timer else 0.0) - s.share) * SHARE_WEIGHT
    norm = s.share_norm + (1.0 - s.share_norm) * SHARE_WEIGHT
    s.share = share
    s.share_norm = norm
    d = s.discount * _timer_share(s)
    adjust = 0.0
    if d > 0:
        r = s.rates  # the count: log_score is log(count) + k · now (decayed), log(count)
        count = math.exp(log_score if r.cumulative else log_score - now * r.k)
        adjust = math.log1p(-min(d, MAX_DISCOUNT) / max(count, 1.0))
    s.adjust[i] = adjust
    return adjust


@kernel
def _on_admit(s, i, now):
    worth = log_worth(s.res, i)
    s.worth[i] = s.res.penalty[i] / max(s.res.size[i], 1)
    s.log_worth[i] = worth
    if s.periodic[i]:
        _list(s, i)
    else:
        heap_set(s.heap, i, worth + rates.log_score(s.rates, i) + s.adjust[i])


@kernel
def _on_remove(s, i):
    if s.pslot[i] >= 0:
        _unlist(s, i)
    else:
        heap_remove(s.heap, i)


@kernel
def _list(s, i):
    s.pslot[i] = s.pcount
    s.pids[s.pcount] = i
    s.pcount += 1


@kernel
def _unlist(s, i):
    """Take ``i`` out of pids: the last one moves into its place."""
    k = s.pslot[i]
    s.pslot[i] = -1
    s.pcount -= 1
    if k < s.pcount:
        last = s.pids[s.pcount]
        s.pids[k] = last
        s.pslot[last] = k


@kernel
def _first_candidate(s, now):
    """Utilities of the periodic residents as of ``now`` (those on time from their
    forecast, at once), then the lowest of both kinds."""
    n = s.pcount
    s.shared = rates.log_shared(s.rates, now) + rates.log_warmup(s.rates, now)
    if n > 0:
        ids = s.pids[:n]
        period = s.period[ids]
        ahead = s.last[ids] + period - now
        putil = s.putil
        putil[:n] = s.worth[ids] / np.maximum(ahead, 1e-3 * period)
        for k in np.flatnonzero(ahead < -s.tolerance * period):  # overdue: by its rate
            putil[k] = math.exp(_rate_log_utility(s, ids[k]))
    s.pending_heap = heap_first(s.heap)
    s.pending_periodic = _take_lowest_periodic(s)
    return _lower_pending(s)


@kernel
def _next_candidate(s, now, previous):
    if previous == s.pending_heap:
        s.pending_heap = heap_next(s.heap, previous)
    else:
        s.pending_periodic = _take_lowest_periodic(s)
    return _lower_pending(s)


@kernel
def _take_lowest_periodic(s):
    """The periodic resident of lowest utility not taken yet in this walk (-1: none)."""
    n = s.pcount
    if n == 0:
        return -1
    putil = s.putil
    k = np.argmin(putil[:n])
    utility = putil[k]
    if utility == math.inf:
        return -1
    putil[k] = math.inf
    s.pending_util = _log(utility)
    return s.pids[k]


@kernel
def _lower_pending(s):
    """Of the two kinds' next candidates, the one of lower utility (ties: the heap's)."""
    h, p = s.pending_heap, s.pending_periodic
    if p < 0:
        return h
    if h < 0:
        return p
    if heap_priority(s.heap, h) + s.shared <= s.pending_util:
        return h
    return p


@kernel
def _rate_log_utility(s, i):
    """log(penalty · λ / size) of resident ``i`` in the walk: CremeBrulee's own."""
    return s.log_worth[i] + rates.log_score(s.rates, i) + s.adjust[i] + s.shared


@kernel(inline="always")
def _log(x):
    return math.log(x) if x > 0 else -math.inf


@kernel
def _grow(s, capacity):
    grow_heap(s.heap, capacity)
    rates.grow_rates(s.rates, capacity)
    s.worth = grown(s.worth, capacity, 0.0)
    s.log_worth = grown(s.log_worth, capacity, 0.0)
    s.last = grown(s.last, capacity, np.nan)
    s.period = grown(s.period, capacity, 0.0)
    s.streak = grown(s.streak, capacity, 0)
    s.periodic = grown(s.periodic, capacity, False)
    s.adjust = grown(s.adjust, capacity, 0.0)
    s.pslot = grown(s.pslot, capacity, -1)
    s.pids = grown(s.pids, capacity, 0)
    s.putil = grown(s.putil, capacity, 0.0)


implements(ForecastStateType, on_access=_on_access, on_admit=_on_admit,
           on_remove=_on_remove, first_candidate=_first_candidate,
           next_candidate=_next_candidate, grow=_grow)


@kernel
def _utility(s, i, now):
    """penalty / (size · B̂) of ``i`` at ``now``, as an eviction would rank it."""
    if s.res.slot[i] < 0:
        return 0.0
    period = s.period[i]
    if s.pslot[i] >= 0:
        ahead = s.last[i] + period - now
        if ahead >= -s.tolerance * period:
            return s.worth[i] / max(ahead, 1e-3 * period)
    log_rate = (rates.log_score(s.rates, i) + s.adjust[i] + rates.log_shared(s.rates, now)
                + rates.log_warmup(s.rates, now))
    return math.exp(s.log_worth[i] + log_rate)


@kernel
def _rate(s, i, now):
    """The decayed rate, unbiased for the time the policy has run (``log_warmup``)."""
    return rates.rate(s.rates, i, now) * math.exp(rates.log_warmup(s.rates, now)
                                                  + s.adjust[i])


@kernel
def _period(s, i):
    return s.period[i] if s.periodic[i] else 0.0


class CremeBruleeForecast(Policy):
    name = "cremebrulee-forecast"
    trims_eviction_set = True

    def __init__(self, rate: str = "decayed", half_life: float = 600.0,
                 tolerance: float = 0.05, confirm: int = 3, discount: float = 1.0,
                 odds: float = 1.0) -> None:
        cumulative, k = rates.rate_parameters(rate, half_life)
        if not discount >= 0:
            raise ValueError(f"discount must be >= 0, got {discount}")
        if not odds >= 0:
            raise ValueError(f"odds must be >= 0, got {odds}")
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
        if confirm < 1:
            raise ValueError(f"confirm must be >= 1 gap, got {confirm}")
        super().__init__()
        self.rate, self.half_life = rate, float(half_life)
        self.tolerance, self.confirm = float(tolerance), int(confirm)
        self.discount, self.odds = float(discount), float(odds)
        self.state_parameters = (cumulative, k, self.tolerance, np.int64(self.confirm),
                                 self.discount, self.odds)
        self._state = new_state(self._res, *self.state_parameters)

    def priority(self, key: Key, now: float) -> float:
        """Utility: seconds of load time saved per byte per second, as forecast."""
        i = self._ids.get(key)
        return 0.0 if i is None else _utility(self._state, i, float(now))

    def request_rate(self, key: Key, now: float) -> float:
        i = self._ids.get(key)
        return 0.0 if i is None else _rate(self._state, i, float(now))

    def period(self, key: Key) -> float:
        """The period detected for ``key`` in seconds, 0 when it is not periodic."""
        i = self._ids.get(key)
        return 0.0 if i is None else float(_period(self._state, i))
