"""Evaluators: what a configuration costs and how much of the load it serves within SLO.

One interface, :class:`Evaluator`:

- ``space``: the :class:`~agent.coordinator.ribbon.space.SearchSpace` it answers for;
- ``price(counts)``: the pool's price per hour, known without measuring anything;
- ``measure(counts)``: a :class:`Measurement` (price and QoS percent), or ``None`` when
  the configuration cannot be measured. The search then drops it from its candidates and
  does not count it as a sample (nothing was learned).

:class:`LookupGridEvaluator` answers from a measured grid in the format of Ribbon's
artifact (``shared/data/ribbon/``): a config JSON (``ins_types``, ``max_num``; the other
keys describe the load and are ignored) and a lookup JSON mapping ``"a, b, c"`` to
``[price_per_hour, qos_percent]``. A configuration missing from the lookup was not
measured: ``measure`` returns ``None`` for it. Its price (needed only for the objective's
normaliser, the price of the largest pool) comes from the per-type prices, given in the
config as ``prices`` (a list in type order or a mapping by type) or else fitted to the
lookup by least squares (pool prices are sums of instance prices).
Optional config key ``qos_target_percent`` (default 99) sets the QoS target.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np

from agent.coordinator.ribbon.space import DEFAULT_TARGET_PERCENT, SearchSpace


class SizingError(ValueError):
    """A sizing problem that cannot be read or searched (bad config, bad lookup)."""


@dataclass(frozen=True)
class Measurement:
    price: float          # $ per hour
    qos_percent: float    # share of queries within the latency target, in percent


class Evaluator(Protocol):
    space: SearchSpace

    def price(self, counts: tuple[int, ...]) -> float: ...

    def measure(self, counts: tuple[int, ...]) -> Measurement | None: ...


def parse_counts(key: str, n_types: int) -> tuple[int, ...]:
    """``"6, 0, 2"`` -> ``(6, 0, 2)``; ValueError when it is not ``n_types`` integers."""
    parts = [p.strip() for p in str(key).split(",")]
    if len(parts) != n_types or not all(p.lstrip("-").isdigit() for p in parts):
        raise ValueError(f"{key!r} is not {n_types} comma-separated integers")
    return tuple(int(p) for p in parts)


def format_counts(counts) -> str:
    return ", ".join(str(int(c)) for c in counts)


class LookupGridEvaluator:
    """Answers from a table ``{counts: (price, qos_percent)}`` over ``space``."""

    def __init__(self, space: SearchSpace,
                 table: Mapping[tuple[int, ...], tuple[float, float]],
                 unit_prices: list[float] | None = None):
        self.space = space
        self.table = {tuple(int(c) for c in k): (float(p), float(q))
                      for k, (p, q) in table.items()}
        for counts in self.table:
            if len(counts) != len(space.types) or any(
                    not 0 <= c <= m for c, m in zip(counts, space.max_counts)):
                raise SizingError(f"lookup entry {format_counts(counts)!r} is outside the "
                                  f"space (max counts {list(space.max_counts)})")
        if unit_prices is None:
            unit_prices = self._fit_unit_prices()
        if len(unit_prices) != len(space.types):
            raise SizingError("one price per instance type is needed")
        self.unit_prices = [float(p) for p in unit_prices]

    def _fit_unit_prices(self) -> list[float]:
        rows = [(k, p) for k, (p, _) in self.table.items() if any(k)]
        if not rows:
            return [0.0] * len(self.space.types)
        a = np.array([k for k, _ in rows], dtype=float)
        b = np.array([p for _, p in rows], dtype=float)
        sol, *_ = np.linalg.lstsq(a, b, rcond=None)
        return [max(0.0, float(x)) for x in sol]

    def price(self, counts: tuple[int, ...]) -> float:
        hit = self.table.get(tuple(counts))
        if hit is not None:
            return hit[0]
        return float(sum(c * p for c, p in zip(counts, self.unit_prices)))

    def measure(self, counts: tuple[int, ...]) -> Measurement | None:
        hit = self.table.get(tuple(counts))
        return None if hit is None else Measurement(hit[0], hit[1])

    @classmethod
    def from_files(cls, config_path: str | Path, lookup_path: str | Path
                   ) -> "LookupGridEvaluator":
        config = _load_json(config_path)
        lookup = _load_json(lookup_path)
        return cls.from_dicts(config, lookup, str(config_path), str(lookup_path))

    @classmethod
    def from_dicts(cls, config: Any, lookup: Any, config_name: str = "config",
                   lookup_name: str = "lookup") -> "LookupGridEvaluator":
        space, prices = space_from_config(config, config_name)
        if not isinstance(lookup, dict) or not lookup:
            raise SizingError(f"{lookup_name}: must be a non-empty JSON object "
                              f"mapping \"a, b, c\" to [price, qos_percent]")
        table = {}
        n = len(space.types)
        for key, value in lookup.items():
            try:
                counts = parse_counts(key, n)
            except ValueError as exc:
                raise SizingError(f"{lookup_name}: {exc}") from None
            if (not isinstance(value, (list, tuple)) or len(value) != 2
                    or not all(_is_number(v) for v in value)
                    or value[0] < 0 or not 0 <= value[1] <= 100):
                raise SizingError(f"{lookup_name}: {key!r} must map to [price >= 0, "
                                  f"qos_percent in 0..100], got {value!r}")
            table[counts] = (float(value[0]), float(value[1]))
        try:
            return cls(space, table, prices)
        except SizingError as exc:
            raise SizingError(f"{lookup_name}: {exc}") from None


def space_from_config(config: Any, name: str = "config"
                      ) -> tuple[SearchSpace, list[float] | None]:
    """The search space (and per-type prices, if given) of a Ribbon config JSON."""
    if not isinstance(config, dict):
        raise SizingError(f"{name}: must be a JSON object")
    types, maxima = config.get("ins_types"), config.get("max_num")
    if (not isinstance(types, list) or not types
            or not all(isinstance(t, str) and t for t in types)):
        raise SizingError(f"{name}: ins_types must be a non-empty list of names")
    if (not isinstance(maxima, list) or len(maxima) != len(types)
            or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 0
                       for m in maxima)):
        raise SizingError(f"{name}: max_num must list one integer >= 0 per instance type")
    target = config.get("qos_target_percent", DEFAULT_TARGET_PERCENT)
    if not _is_number(target):
        raise SizingError(f"{name}: qos_target_percent must be a number")
    prices = config.get("prices")
    if prices is not None:
        if isinstance(prices, dict):
            missing = [t for t in types if t not in prices]
            if missing:
                raise SizingError(f"{name}: prices lacks {missing}")
            prices = [prices[t] for t in types]
        if (not isinstance(prices, list) or len(prices) != len(types)
                or not all(_is_number(p) and p >= 0 for p in prices)):
            raise SizingError(f"{name}: prices must give a price >= 0 per instance type")
        prices = [float(p) for p in prices]
    try:
        space = SearchSpace(tuple(types), tuple(maxima), float(target))
    except ValueError as exc:
        raise SizingError(f"{name}: {exc}") from None
    return space, prices


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _load_json(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise SizingError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SizingError(f"{path}: not valid JSON ({exc})") from None
