"""The search space of a fleet-sizing problem and Ribbon's objective (SC'21, Eq. 2).

A *configuration* is a tuple of integer counts, one per instance type, each between 0
and that type's maximum. The all-zero pool serves nothing, so it is never a candidate.

Decisions written down here:

- The QoS target is a percentage of queries within the latency target (Ribbon's
  ``T_qos``, 99 % in the paper and in the shared grids).
- Eq. 2 with ``R_sat`` and ``T_qos`` both in percent: ``f = R_sat / T_qos / 2`` for a
  configuration below target, ``f = 1/2 + (1 - price / max_price) / 2`` otherwise, where
  ``max_price`` is the price of the largest pool (every type at its maximum). Any
  configuration that meets QoS scores above any that does not, and the cheaper the better.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

DEFAULT_TARGET_PERCENT = 99.0


@dataclass(frozen=True)
class SearchSpace:
    """Instance types (in order), the maximum count of each, and the QoS target (%)."""

    types: tuple[str, ...]
    max_counts: tuple[int, ...]
    target_percent: float = DEFAULT_TARGET_PERCENT

    def __post_init__(self) -> None:
        if not self.types or len(self.types) != len(self.max_counts):
            raise ValueError("one maximum count per instance type is needed")
        if len(set(self.types)) != len(self.types):
            raise ValueError(f"instance types repeat: {list(self.types)}")
        if any(not isinstance(m, int) or isinstance(m, bool) or m < 0
               for m in self.max_counts) or not any(self.max_counts):
            raise ValueError(f"max counts must be integers >= 0, not all 0: "
                             f"{list(self.max_counts)}")
        if not 0.0 < self.target_percent <= 100.0:
            raise ValueError(f"QoS target must be a percent in (0, 100], "
                             f"got {self.target_percent!r}")

    @property
    def size(self) -> int:
        """Number of candidate configurations (every grid point but all-zero)."""
        return int(np.prod([m + 1 for m in self.max_counts])) - 1

    def contains(self, counts: tuple[int, ...]) -> bool:
        return (len(counts) == len(self.max_counts) and any(counts)
                and all(0 <= c <= m for c, m in zip(counts, self.max_counts)))

    def grid(self) -> np.ndarray:
        """Every candidate as an int array of shape (size, n_types), in lexicographic
        order (the first type varies slowest); all-zero left out."""
        axes = [np.arange(m + 1) for m in self.max_counts]
        mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, len(axes))
        return mesh[1:]

    def iter_grid(self):
        """The same order as :meth:`grid`, lazily (for spaces too big to hold)."""
        it = itertools.product(*(range(m + 1) for m in self.max_counts))
        next(it)
        return it

    @property
    def largest(self) -> tuple[int, ...]:
        return tuple(self.max_counts)


def objective(qos_percent: float, price: float, max_price: float, target_percent: float
              ) -> float:
    """Ribbon's Eq. 2: in [0, 1/2) below the QoS target (closer is better), in [1/2, 1]
    at or above it (cheaper is better)."""
    if qos_percent < target_percent:
        return 0.5 * max(0.0, qos_percent) / target_percent
    return 0.5 + 0.5 * (1.0 - price / max_price) if max_price > 0 else 1.0


def search_objective(qos_percent: float, price: float, max_price: float,
                     target_percent: float) -> float:
    """Eq. 2 as the BO search scores a sample: the same above the target; below it, the
    miss on a log scale, ``(1 - log(1 + miss/u) / log(1 + target/u)) / 2`` with
    ``u = 100 - target`` (0 at QoS 0, 1/2 at the target), so that 97 % and 98.9 % differ
    by 0.07 rather than Eq. 2's 0.01 (see ``search.py``)."""
    if qos_percent >= target_percent:
        return objective(qos_percent, price, max_price, target_percent)
    unit = max(100.0 - target_percent, 1e-6)
    miss = target_percent - max(0.0, qos_percent)
    return 0.5 * max(0.0, 1.0 - math.log1p(miss / unit) / math.log1p(target_percent / unit))
