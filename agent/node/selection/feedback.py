"""The pending log: each answered prediction of an app, kept by ``id`` until its feedback
arrives, ``window_s`` passes or ``max_pending`` newer ones push it out (counted, never
an error). What a prediction keeps is what its feedback needs: the context, the members
asked with the probability each was picked with, and each member's answer."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Prediction:
    """One answered request awaiting feedback."""

    context: str | None
    rows: int
    probabilities: dict[int, float]   # member → the probability it was picked with
    answers: dict[int, np.ndarray]    # member → its output (those that answered)
    failed: tuple[int, ...]           # members asked that erred or missed the deadline
    sleeping: tuple[int, ...]         # members asked that were cold or shed
    at: float


class PendingLog:
    """Predictions by id, oldest first, bounded in count and age."""

    def __init__(self, window_s: float, max_pending: int, clock: Callable[[], float]) -> None:
        self.window_s, self.max_pending, self.clock = window_s, max_pending, clock
        self._items: OrderedDict[str, Prediction] = OrderedDict()
        self.expired = 0   # fell out by age
        self.dropped = 0   # pushed out by newer ones (max_pending)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, rid: str, prediction: Prediction) -> None:
        self._items.pop(rid, None)  # an id reused: the newest prediction holds it
        self._items[rid] = prediction
        while len(self._items) > self.max_pending:
            self._items.popitem(last=False)
            self.dropped += 1
        self._expire()

    def peek(self, rid: str) -> Prediction | None:
        self._expire()
        return self._items.get(rid)

    def take(self, rid: str) -> Prediction | None:
        self._expire()
        return self._items.pop(rid, None)

    def _expire(self) -> None:
        horizon = self.clock() - self.window_s
        while self._items:
            rid, oldest = next(iter(self._items.items()))
            if oldest.at >= horizon:
                break
            del self._items[rid]
            self.expired += 1
