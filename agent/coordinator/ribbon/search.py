"""Ribbon's search for the cheapest pool that meets QoS, and two baselines.

``bo`` (Ribbon, SC'21 §4): Bayesian optimisation over the integer grid.

Two GPs, both scikit-learn ``GaussianProcessRegressor`` (targets normalised, as in the
artifact) with Matérn ν=2.5 kernels on inputs rounded to the integer grid
(``RoundedMatern``, the paper's Eq. 3 ``k'(x, x') = k(R(x), R(x'))``), and constrained
expected improvement (Gardner et al., ICML'14) over them:

- Objective GP (Ribbon's): on the score of each sample, Eq. 2 (a pool that meets QoS
  scores 1/2 + (1 - price / max price) / 2), except that below the target the miss is on
  a log scale (:func:`~agent.coordinator.ribbon.space.search_objective`). Expected
  improvement over the best score, with an exploration margin ``xi`` (0.005, i.e. 1 % of
  the largest pool's price).
- QoS GP (a departure: price is known before measuring, QoS is the unknown): on
  ``log(100 - QoS)`` (clipped to [0.01, 10 x (100 - target)] points, so that pools far
  below the target do not dominate the fit) minus a least-squares linear trend in the
  counts (QoS rises with capacity); kernel ``C x RoundedMatern`` with one length scale per
  type, fitted by maximum likelihood at every step from the last fit (warm start), within
  [0.5 instance, 4 x the type's range]. The objective GP uses the same fitted kernel:
  fitting its scales on Eq. 2 itself, which jumps at the QoS boundary, gave scales too
  long or too short (more samples to the optimum in ``bench/ribbon.py``).
- P(feasible) at a candidate ``x``: the smaller of the QoS GP's P(QoS >= target) and a
  monotone envelope, the least over every ``y >= x`` (no fewer of any type) of
  P(QoS(y) >= target - threshold), measured pools counting as 0 or 1. That is the
  paper's pruning rule (below a miss by more than the threshold nothing meets QoS)
  applied to predictions: a small pool is unlikely to work when a larger one is
  predicted to miss by more than the threshold.
- Acquisition: EI(objective) x P(feasible), maximised over the candidates not yet pruned
  (up to ``EI_POOL``, a seeded subset beyond); exact ties are broken with the seed.

Why (issue 12): with Ribbon's single GP on Eq. 2 the search stalled on 5-type grids in
a band of pools cheaper than the incumbent that miss QoS by less than the threshold (Eq.
2 scores 97 % and 98.9 % alike once ``normalize_y`` scales the targets against the
feasible ones); a GP on QoS alone with EI = P(feasible) x the known gain fixed that but
spent samples on cheap pools on the measured grids' plateaus (slow types cap QoS just
below the target). The product needs both to agree. Measured in ``bench/ribbon.py``
(figures in docs/benchmarks.md).
- Initial samples: two configurations drawn uniformly from the grid with the seed, as
  the artifact does (``maximize(init_points=1)`` twice before the guided steps). They
  count as samples here (the artifact's counter starts after them).
- Active pruning (§4, "Ribbon performs active pruning"): after each sample, a
  configuration that missed the QoS target by more than ``threshold`` percentage points
  (1 in the paper) removes every configuration with no more of any type than it has
  (itself included); one that met the target removes every configuration pricier than
  the best feasible price (they cannot win). The threshold matters: the measured grids are
  not monotone (adding slow instances can lower QoS), and pruning below every miss would
  remove the optimum of resnet, vgg and dien. Sampled configurations are never sampled
  again. The search ends at ``max_samples`` or when nothing is left to sample (then the
  best found is the optimum, up to the pruning rule).

``random``: the paper's RANDOM baseline (§5.3): uniform draws among the configurations
the same pruning has not removed (``prune=False``: plain random search).
``exhaustive``: every configuration in grid order, no pruning: the ground truth.

Everything is seeded (``numpy.random.default_rng(seed)``; the GP fits have no random
part: one L-BFGS run from the last fit):
the same seed gives the same samples. Configurations the evaluator cannot measure are
dropped and not counted. ``best`` is the cheapest sampled configuration that met QoS
(the earliest sampled among equal prices), or ``None`` when none did.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from agent.coordinator.choices import SIZE_MAX_SAMPLES, SIZE_METHODS
from agent.coordinator.ribbon.evaluators import Evaluator, SizingError
from agent.coordinator.ribbon.space import SearchSpace, search_objective

PRUNE_THRESHOLD = 1.0       # percentage points below the QoS target (the paper's 1 %)
XI = 0.005                  # EI exploration margin, in objective units (range 0..1)
GLOBAL_DIVISOR = 4.0        # initial Matérn length scale: a quarter of each type's range
SCALE_MIN = 0.5             # fitted length scales between half an instance
SCALE_MAX = 4.0             # and four times each type's range
MISS_FLOOR = 0.01           # QoS GP target: log(100 - QoS), 100 - QoS clipped to
MISS_CAP = 10.0             # [0.01, 10 x (100 - target)] points
INITIAL_SAMPLES = 2
MAX_SPACE = 2_000_000       # candidates held in memory
EI_POOL = 50_000            # candidates scored per BO step (a seeded subset beyond)


@dataclass(frozen=True)
class Sample:
    counts: tuple[int, ...]
    price: float
    qos_percent: float

    def to_json(self) -> dict:
        return {"counts": list(self.counts), "price": self.price,
                "qos_percent": self.qos_percent}


@dataclass
class SearchResult:
    method: str
    space: SearchSpace
    history: list[Sample] = field(default_factory=list)
    best_index: int | None = None     # 0-based index into history
    exhausted: bool = False           # nothing left to sample when the search ended
    unmeasured: int = 0               # candidates the evaluator could not measure

    @property
    def best(self) -> Sample | None:
        return None if self.best_index is None else self.history[self.best_index]

    @property
    def samples(self) -> int:
        return len(self.history)

    @property
    def samples_to_best(self) -> int | None:
        return None if self.best_index is None else self.best_index + 1

    def to_json(self) -> dict:
        """The ``plan size --json`` object (and the API's)."""
        best = self.best
        return {
            "best": None if best is None else list(best.counts),
            "price": None if best is None else best.price,
            "qos_percent": None if best is None else best.qos_percent,
            "samples": self.samples,
            "samples_to_best": self.samples_to_best,
            "history": [s.to_json() for s in self.history],
        }


def _rounded_matern():
    from sklearn.gaussian_process.kernels import Matern

    class RoundedMatern(Matern):
        """Matérn on inputs rounded to the nearest integer (Ribbon's Eq. 3)."""

        def __call__(self, X, Y=None, eval_gradient=False):
            X = np.round(np.asarray(X, dtype=float))
            Y = None if Y is None else np.round(np.asarray(Y, dtype=float))
            return super().__call__(X, Y, eval_gradient)

        def diag(self, X):
            return super().diag(np.round(np.asarray(X, dtype=float)))

    return RoundedMatern


class _State:
    """Candidates, what pruning and sampling removed, the samples and the best."""

    def __init__(self, evaluator: Evaluator, method: str, threshold: float | None):
        space = evaluator.space
        if space.size > MAX_SPACE:
            raise SizingError(f"search space has {space.size} configurations; at most "
                              f"{MAX_SPACE} are supported")
        self.evaluator, self.space, self.threshold = evaluator, space, threshold
        self.grid = space.grid()
        self.alive = np.ones(len(self.grid), dtype=bool)
        self.prices = np.array([evaluator.price(tuple(int(c) for c in row))
                                for row in self.grid], dtype=float)
        self.max_price = float(evaluator.price(space.largest))
        self.result = SearchResult(method, space)
        self.X: list[tuple[int, ...]] = []
        self.y: list[float] = []
        self.best_price = math.inf
        self.envelope_threshold = PRUNE_THRESHOLD if threshold is None else threshold

    def evaluate(self, index: int) -> Sample | None:
        counts = tuple(int(c) for c in self.grid[index])
        self.alive[index] = False
        m = self.evaluator.measure(counts)
        if m is None:
            self.result.unmeasured += 1
            return None
        sample = Sample(counts, float(m.price), float(m.qos_percent))
        self.result.history.append(sample)
        target = self.space.target_percent
        self.X.append(counts)
        self.y.append(search_objective(sample.qos_percent, sample.price, self.max_price,
                                       target))
        feasible = sample.qos_percent >= target
        if feasible and sample.price < self.best_price:
            self.best_price = sample.price
            self.result.best_index = len(self.result.history) - 1
        if self.threshold is not None:
            if feasible:
                self.alive &= ~(self.prices > self.best_price + 1e-9)
            elif sample.qos_percent < target - self.threshold:
                self.alive &= ~np.all(self.grid <= np.array(counts), axis=1)
        return sample


OnSample = Callable[[int, Sample, "Sample | None"], None]


def search(evaluator: Evaluator, method: str = "bo", *, seed: int = 0,
           max_samples: int | None = None, threshold: float = PRUNE_THRESHOLD,
           xi: float = XI, prune: bool = True, on_sample: OnSample | None = None,
           until: Callable[[SearchResult], bool] | None = None) -> SearchResult:
    """Search ``evaluator``'s space with ``method`` (``bo``, ``random``, ``exhaustive``).

    ``max_samples``: the most configurations to measure (default 100; exhaustive: all).
    ``prune=False`` turns active pruning off (``random`` then is plain random search
    without replacement; exhaustive never prunes).
    ``on_sample(i, sample, best)`` is called after each measured sample (1-based ``i``);
    ``until(result)``, when given, ends the search early once it returns true (benches
    stop at a known optimum: the samples before it are the same either way).
    """
    if method not in SIZE_METHODS:
        raise SizingError(f"unknown method {method!r}; choose from {', '.join(SIZE_METHODS)}")
    if max_samples is None:
        max_samples = evaluator.space.size if method == "exhaustive" else SIZE_MAX_SAMPLES
    if max_samples < 1:
        raise SizingError("max_samples must be >= 1")
    state = _State(evaluator, method,
                   threshold if prune and method != "exhaustive" else None)
    rng = np.random.default_rng(seed)
    chooser = {"bo": _BoChooser(state, rng, seed, xi),
               "random": lambda: int(rng.choice(np.flatnonzero(state.alive))),
               "exhaustive": lambda: int(np.flatnonzero(state.alive)[0])}[method]
    with _one_blas_thread(method):
        _run(state, chooser, max_samples, on_sample, until)
    state.result.exhausted = not state.alive.any()
    return state.result


def _one_blas_thread(method: str):
    """BO's GP algebra on one thread (numpy's and scipy's BLAS, scikit-learn's OpenMP):
    its matrices are small (at most 100 x the grid), and threaded BLAS on busy cores
    made bench/ribbon.py several times slower for the same samples (docs/benchmarks.md).
    The limit is process-wide while the search runs (threadpoolctl)."""
    if method != "bo":
        return contextlib.nullcontext()
    import scipy.linalg  # noqa: F401  (load the libraries first: only loaded ones
    import sklearn.gaussian_process  # noqa: F401  are limited)
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1)


def _run(state: _State, chooser, max_samples: int, on_sample: OnSample | None,
         until: Callable[[SearchResult], bool] | None) -> None:
    while state.result.samples < max_samples and state.alive.any():
        sample = state.evaluate(chooser())
        if sample is not None and on_sample is not None:
            on_sample(state.result.samples, sample, state.result.best)
        if sample is not None and until is not None and until(state.result):
            break


class _BoChooser:
    """Constrained EI: EI on the objective GP times P(feasible) from the QoS GP."""

    def __init__(self, state: _State, rng: np.random.Generator, seed: int, xi: float):
        self.state, self.rng, self.seed, self.xi = state, rng, seed, xi
        self.kernel = None        # the QoS GP's kernel, refitted (warm-started) each step
        self.shape = tuple(m + 1 for m in state.space.max_counts)
        self.strides = np.array([int(np.prod(self.shape[i + 1:]))
                                 for i in range(len(self.shape))])

    def __call__(self) -> int:
        from scipy.stats import norm

        st = self.state
        alive = np.flatnonzero(st.alive)
        if len(st.X) < INITIAL_SAMPLES:
            return int(self.rng.choice(alive))
        if len(alive) > EI_POOL:
            alive = np.sort(self.rng.choice(alive, EI_POOL, replace=False))
        # P(feasible) on the whole grid when it is small enough (the envelope then sees
        # the pools pruning removed too), else on the scored candidates only.
        scored = np.arange(len(st.grid)) if len(st.grid) <= EI_POOL else alive
        p_ok = self._p_feasible(scored)[alive if len(scored) == len(st.grid) else
                                        np.arange(len(alive))]
        mu, sd = self._objective_posterior(st.grid[alive].astype(float))
        sd = np.maximum(sd, 1e-12)
        imp = mu - max(st.y) - self.xi
        z = imp / sd
        ei = np.nan_to_num((imp * norm.cdf(z) + sd * norm.pdf(z)) * p_ok, nan=0.0)
        ties = np.flatnonzero(ei == ei.max())
        return int(alive[int(ties[0] if len(ties) == 1 else self.rng.choice(ties))])

    def _p_feasible(self, scored: np.ndarray) -> np.ndarray:
        """min(P(QoS >= target), monotone envelope) at ``st.grid[scored]``."""
        import warnings

        from scipy.stats import norm
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel

        st = self.state
        target = st.space.target_percent
        qos = np.array([s.qos_percent for s in st.result.history])
        cap = max(MISS_CAP * (100.0 - target), 2 * MISS_FLOOR)     # target 100: 0.02
        miss = np.log(np.clip(100.0 - qos, MISS_FLOOR, cap))
        X = np.array(st.X, dtype=float)
        beta = np.linalg.lstsq(np.hstack([np.ones((len(X), 1)), X]), miss, rcond=None)[0]
        if self.kernel is None:
            maxima = np.maximum(np.array(st.space.max_counts, dtype=float), 1.0)
            self.kernel = ConstantKernel(1.0, (1e-3, 1e3)) * _rounded_matern()(
                length_scale=maxima / GLOBAL_DIVISOR,
                length_scale_bounds=[(SCALE_MIN, SCALE_MAX * m) for m in maxima], nu=2.5)
        gp = GaussianProcessRegressor(kernel=self.kernel, alpha=1e-6, normalize_y=True,
                                      optimizer="fmin_l_bfgs_b")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # scales at their bounds, early on
            gp.fit(X, miss - beta[0] - X @ beta[1:])
        self.kernel = gp.kernel_
        cand = st.grid[scored].astype(float)
        mu, sd = gp.predict(cand, return_std=True)
        mu = mu + beta[0] + cand @ beta[1:]
        sd = np.maximum(sd, 1e-9)
        p_ok = norm.cdf((math.log(max(100.0 - target, MISS_FLOOR)) - mu) / sd)
        # Envelope: P(x feasible) <= P(QoS(y) >= target - threshold) for every y >= x
        # (pruning's rule, on predictions; measured pools count as what they measured).
        margin = st.envelope_threshold
        near = np.ones(int(np.prod(self.shape)))
        near[np.asarray(scored) + 1] = norm.cdf(
            (math.log(max(100.0 - target + margin, MISS_FLOOR)) - mu) / sd)
        for s in st.result.history:
            near[int(np.dot(s.counts, self.strides))] = float(
                s.qos_percent >= target - margin)
        dense = near.reshape(self.shape)
        for axis in range(dense.ndim):
            dense = np.flip(np.minimum.accumulate(np.flip(dense, axis), axis=axis), axis)
        return np.minimum(p_ok, dense.reshape(-1)[np.asarray(scored) + 1])

    def _objective_posterior(self, candidates: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
        """The objective GP, with the kernel just fitted on QoS (not refitted here)."""
        from sklearn.gaussian_process import GaussianProcessRegressor

        gp = GaussianProcessRegressor(kernel=self.kernel, alpha=1e-6, normalize_y=True,
                                      optimizer=None)
        gp.fit(np.array(self.state.X, dtype=float), np.array(self.state.y))
        return gp.predict(candidates, return_std=True)
