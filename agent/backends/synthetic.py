"""A synthetic model for tests and benchmarks: known latency, load time and size.

Input ``X`` FP32 [N, k] (any k) → output ``Y`` FP32 [N, 1], the row sums. A batch takes
``base_ms + per_item_ms × N`` (``jitter``: base_ms scaled lognormally, plus outliers);
``infer_async`` waits with ``asyncio.sleep`` so neither the event loop nor a worker
thread is held. Its memory is accounted as ``size_bytes`` (nothing real is allocated).

With ``classifier:`` it is a classifier for selection apps: ``X`` FP32 [N, 3] = (row id,
true label, group) → ``Y`` INT64 [N, 1], the true label except on a deterministic subset
of rows (a hash of seed, model name and row id) at the configured error rates.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import zlib
from concurrent.futures import Executor
from typing import Any

import numpy as np

from agent.backends.base import Backend, BackendError, TensorSpec
from agent.config import ClassifierOptions, SyntheticOptions

_MASK = np.uint64(2**64 - 1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64s: a deterministic hash per element."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


#: Up to this many rows are classified with Python ints: a few numpy operations on a
#: tiny array cost more than the member's work, and run in the event loop.
SMALL_BATCH = 32


def _mix_int(x: int) -> int:
    """``_mix`` of one uint64 as a Python int (the same bits)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _salt(options: ClassifierOptions, name: str) -> int:
    return ((zlib.crc32(name.encode()) << 32) ^ (options.seed & 0xFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF


def classify(options: ClassifierOptions, name: str, x: np.ndarray) -> np.ndarray:
    """The labels (INT64 [N]) model ``name`` answers for rows ``x`` = (row id, true
    label, group): the true label except where the row's hash falls under its rate."""
    if len(x) <= SMALL_BATCH:
        return _classify_small(options, _salt(options, name), x)
    rows = x[:, 0].astype(np.int64)
    truth = x[:, 1].astype(np.int64) % options.classes
    rate = np.full(len(x), options.error)
    for group, r in options.groups.items():
        rate[x[:, 2].astype(np.int64) == group] = r
    for span in options.schedule:
        rate[(rows >= span.from_row) & (rows < span.to_row)] = span.rate
    h = _mix(rows.astype(np.uint64) ^ np.uint64(_salt(options, name)))
    wrong = (h >> np.uint64(11)).astype(np.float64) / 2.0**53 < rate
    shift = 1 + (_mix(h) % np.uint64(options.classes - 1)).astype(np.int64)
    return np.where(wrong, (truth + shift) % options.classes, truth)


def _classify_small(options: ClassifierOptions, salt: int, x: np.ndarray) -> np.ndarray:
    """``classify`` row by row with Python ints: the same answers."""
    out = []
    for row_id, label, group in x[:, :3].tolist():
        row, truth = int(row_id), int(label) % options.classes
        rate = options.groups.get(int(group), options.error)
        for span in options.schedule:
            if span.from_row <= row < span.to_row:
                rate = span.rate
        h = _mix_int((row & 0xFFFFFFFFFFFFFFFF) ^ salt)
        if (h >> 11) / 2.0**53 < rate:
            truth = (truth + 1 + _mix_int(h) % (options.classes - 1)) % options.classes
        out.append(truth)
    return np.array(out, np.int64)


class SyntheticBackend(Backend):
    kind = "synthetic"
    CANCELLABLE = True  # infer_async is an asyncio.sleep
    DEFAULT_WARMUP = False  # its load time is what the config says; warmup: default adds one

    @property
    def options(self) -> SyntheticOptions:
        return self.config.synthetic or SyntheticOptions()

    def estimate(self) -> int:
        return self.options.size_bytes

    def lower_bound(self) -> int:
        return self.options.size_bytes

    def load(self) -> None:
        if self.device != "cpu":
            raise BackendError(f"synthetic model {self.name!r} runs on cpu only, "
                               f"config asks for {self.device}")
        time.sleep(self.options.load_ms / 1000)
        self._random = random.Random(f"{self.name}:{self.version}")
        c = self.options.classifier
        if c is None:
            self.inputs = [TensorSpec("X", "FP32", (-1, -1))]
            self.outputs = [TensorSpec("Y", "FP32", (-1, 1))]
        else:
            self.inputs = [TensorSpec("X", "FP32", (-1, 3))]
            self.outputs = [TensorSpec("Y", "INT64", (-1, 1))]
            if c.scores:
                self.outputs.append(TensorSpec("SCORES", "FP32", (-1, c.classes)))
        self.warm_up()

    def measured_bytes(self) -> int:
        return self.options.size_bytes

    def _seconds(self, inputs: dict[str, np.ndarray]) -> float:
        o = self.options
        base = o.base_ms
        if o.jitter is not None:
            j = o.jitter
            base *= math.exp(j.lognormal_sigma * self._random.gauss(0.0, 1.0))
            if self._random.random() < j.outlier_p:
                base += j.outlier_ms
        return (base + o.per_item_ms * len(inputs["X"])) / 1000

    def _answer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        c, x = self.options.classifier, inputs["X"]
        if c is None:
            return {"Y": x.sum(axis=1, keepdims=True, dtype=np.float32)}
        labels = classify(c, self.name, x)
        out = {"Y": labels.reshape(-1, 1)}
        if c.scores:
            scores = np.full((len(x), c.classes), 0.5 / (c.classes - 1), np.float32)
            scores[np.arange(len(x)), labels] = 0.5
            out["SCORES"] = scores
        return out

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]
              ) -> dict[str, np.ndarray]:
        time.sleep(self._seconds(inputs))
        return self._answer(inputs)

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          executor: Executor | None) -> dict[str, np.ndarray]:
        await asyncio.sleep(self._seconds(inputs))
        return self._answer(inputs)

    def unload(self) -> None:
        self.inputs, self.outputs = [], []
