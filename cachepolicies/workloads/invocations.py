"""Per-minute invocation counts of functions, the shape of the Azure Functions 2019 trace."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepolicies.workloads.errors import WorkloadError


@dataclass(frozen=True)
class InvocationCounts:
    """Row ``i`` is one function; ``counts[i, j]`` its invocations in minute ``start_minute + j``.

    Minutes are 0-based: minute ``m`` is the Azure CSV column labelled ``m + 1``.
    ``owners``, ``apps``, ``functions`` (hashes) and ``triggers`` are string arrays, one
    entry per row; ``counts`` is a non-negative integer matrix (functions × minutes).
    """

    owners: np.ndarray
    apps: np.ndarray
    functions: np.ndarray
    triggers: np.ndarray
    counts: np.ndarray
    start_minute: int = 0

    def __post_init__(self) -> None:
        if self.counts.ndim != 2:
            raise WorkloadError(f"counts must be a 2-D matrix, got shape {self.counts.shape}")
        rows = self.counts.shape[0]
        for name in ("owners", "apps", "functions", "triggers"):
            if len(getattr(self, name)) != rows:
                raise WorkloadError(f"{name} has {len(getattr(self, name))} entries, "
                                    f"counts has {rows} rows")
        if self.start_minute < 0:
            raise WorkloadError(f"start_minute must be >= 0, got {self.start_minute}")

    @property
    def n_functions(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_minutes(self) -> int:
        return int(self.counts.shape[1])

    def totals(self) -> np.ndarray:
        """Invocations of each function over all the minutes held (int64)."""
        return self.counts.sum(axis=1, dtype=np.int64)

    def select(self, rows: np.ndarray) -> InvocationCounts:
        """The functions at ``rows`` (indices or a boolean mask), same minutes."""
        return InvocationCounts(self.owners[rows], self.apps[rows], self.functions[rows],
                                self.triggers[rows], self.counts[rows], self.start_minute)

    def with_trigger(self, trigger: str) -> InvocationCounts:
        """Only the functions whose trigger is ``trigger`` (e.g. ``"http"``)."""
        return self.select(self.triggers == trigger)

    def window(self, start_minute: int, minutes: int | None = None) -> InvocationCounts:
        """Minutes ``[start_minute, start_minute + minutes)``, absolute and 0-based
        (to the end if ``minutes`` is None)."""
        first = start_minute - self.start_minute
        end = self.n_minutes if minutes is None else first + minutes
        if first < 0 or end > self.n_minutes or end <= first:
            held = f"[{self.start_minute}, {self.start_minute + self.n_minutes})"
            raise WorkloadError(f"window of minutes [{start_minute}, "
                                f"{self.start_minute + end}) is not inside the minutes held {held}")
        return InvocationCounts(self.owners, self.apps, self.functions, self.triggers,
                                self.counts[:, first:end], start_minute)
