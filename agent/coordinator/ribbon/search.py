"""Ribbon's search for the cheapest pool that meets QoS, and two baselines.

``bo`` (Ribbon, SC'21 §4): Bayesian optimisation over the integer grid.

- Surrogate: scikit-learn's ``GaussianProcessRegressor`` (targets normalised, as in the
  artifact) with Matérn ν=2.5 kernels on inputs rounded to the integer grid
  (``RoundedMatern``, the paper's Eq. 3 ``k'(x, x') = k(R(x), R(x'))``). Decision: the
  kernel is the sum of a local Matérn (length scale one instance, the grid's step) and a
  global one (a quarter of each type's range, at least one), both fixed rather than fitted.
  Maximum-likelihood length scales, fitted on 2-100 samples of an objective that jumps at
  the QoS boundary, came out either too long (the jump smeared over the grid) or too short
  (no guidance beyond the neighbours): with fitted anisotropic scales the median samples
  to the optimum were 27-38 on the shared grids (mtwnd 37.5 against the paper's 17); the
  local kernel alone found vgg's optimum in only 16 of 20 seeds; the sum finds it in 20 of
  20 on all five (bench/ribbon.py). The scales are in instances and type ranges, not
  fitted to any grid.
- Acquisition: expected improvement with an exploration margin ``xi`` (0.005 in objective
  units, i.e. 1 % of the largest pool's price) over the best objective seen, maximised
  over the candidates not yet pruned; exact ties are broken with the seed. A smaller
  margin matters because the last steps to the optimum improve the objective by little
  (vgg: $5.08 -> $5.03 is 0.002). Objective: Eq. 2
  (:func:`~agent.coordinator.ribbon.space.objective`).
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
the same pruning has not removed (``prune=False``: plain random search). ``exhaustive``: every configuration in grid order, no
pruning: the ground truth.

Everything is seeded (``numpy.random.default_rng(seed)``; the GP has no random part):
the same seed gives the same samples. Configurations the evaluator cannot measure are
dropped and not counted. ``best`` is the cheapest sampled configuration that met QoS
(the earliest sampled among equal prices), or ``None`` when none did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from agent.coordinator.ribbon.evaluators import Evaluator, SizingError
from agent.coordinator.ribbon.space import SearchSpace, objective

METHODS = ("bo", "random", "exhaustive")
DEFAULT_MAX_SAMPLES = 100
PRUNE_THRESHOLD = 1.0       # percentage points below the QoS target (the paper's 1 %)
XI = 0.005                  # EI exploration margin, in objective units (range 0..1)
LOCAL_SCALE = 1.0           # Matérn length scales, in instances: one step of the grid
GLOBAL_DIVISOR = 4.0        # and a quarter of each type's range
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
        self.y.append(objective(sample.qos_percent, sample.price, self.max_price, target))
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
    if method not in METHODS:
        raise SizingError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if max_samples is None:
        max_samples = evaluator.space.size if method == "exhaustive" else DEFAULT_MAX_SAMPLES
    if max_samples < 1:
        raise SizingError("max_samples must be >= 1")
    state = _State(evaluator, method,
                   threshold if prune and method != "exhaustive" else None)
    rng = np.random.default_rng(seed)
    chooser = {"bo": _BoChooser(state, rng, seed, xi),
               "random": lambda: int(rng.choice(np.flatnonzero(state.alive))),
               "exhaustive": lambda: int(np.flatnonzero(state.alive)[0])}[method]
    while state.result.samples < max_samples and state.alive.any():
        sample = state.evaluate(chooser())
        if sample is not None and on_sample is not None:
            on_sample(state.result.samples, sample, state.result.best)
        if sample is not None and until is not None and until(state.result):
            break
    state.result.exhausted = not state.alive.any()
    return state.result


class _BoChooser:
    def __init__(self, state: _State, rng: np.random.Generator, seed: int, xi: float):
        self.state, self.rng, self.seed, self.xi = state, rng, seed, xi
        self.kernel = None

    def __call__(self) -> int:
        st = self.state
        alive = np.flatnonzero(st.alive)
        if len(st.X) < INITIAL_SAMPLES:
            return int(self.rng.choice(alive))
        if len(alive) > EI_POOL:
            alive = np.sort(self.rng.choice(alive, EI_POOL, replace=False))
        mu, sd = self._posterior(st.grid[alive].astype(float))
        best = max(st.y)
        with np.errstate(divide="ignore", invalid="ignore"):
            imp = mu - best - self.xi
            z = np.where(sd > 0, imp / sd, 0.0)
            from scipy.stats import norm
            ei = np.where(sd > 0, imp * norm.cdf(z) + sd * norm.pdf(z), 0.0)
        ei = np.nan_to_num(ei, nan=0.0)
        ties = np.flatnonzero(ei == ei.max())
        return int(alive[int(ties[0] if len(ties) == 1 else self.rng.choice(ties))])

    def _posterior(self, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from sklearn.gaussian_process import GaussianProcessRegressor

        if self.kernel is None:
            rounded = _rounded_matern()
            maxima = np.array(self.state.space.max_counts, dtype=float)
            self.kernel = (rounded(length_scale=LOCAL_SCALE, length_scale_bounds="fixed",
                                   nu=2.5)
                           + rounded(length_scale=np.maximum(LOCAL_SCALE,
                                                             maxima / GLOBAL_DIVISOR),
                                     length_scale_bounds="fixed", nu=2.5))
        gp = GaussianProcessRegressor(kernel=self.kernel, alpha=1e-6, normalize_y=True,
                                      optimizer=None)
        gp.fit(np.array(self.state.X, dtype=float), np.array(self.state.y))
        return gp.predict(candidates, return_std=True)
