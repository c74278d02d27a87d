"""A synthetic model for tests and benchmarks: known latency, load time and size.

Input ``X`` FP32 [N, k] (any k) → output ``Y`` FP32 [N, 1], the row sums. A batch takes
``base_ms + per_item_ms × N``; ``infer_async`` waits with ``asyncio.sleep`` so neither
the event loop nor a worker thread is held. Its memory is accounted as ``size_bytes``
(nothing real is allocated).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Any

import numpy as np

from agent.backends.base import Backend, BackendError, TensorSpec
from agent.config import SyntheticOptions


class SyntheticBackend(Backend):
    kind = "synthetic"
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
        self.inputs = [TensorSpec("X", "FP32", (-1, -1))]
        self.outputs = [TensorSpec("Y", "FP32", (-1, 1))]
        self.warm_up()

    def measured_bytes(self) -> int:
        return self.options.size_bytes

    def _seconds(self, inputs: dict[str, np.ndarray]) -> float:
        return (self.options.base_ms + self.options.per_item_ms * len(inputs["X"])) / 1000

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]
              ) -> dict[str, np.ndarray]:
        time.sleep(self._seconds(inputs))
        return {"Y": inputs["X"].sum(axis=1, keepdims=True, dtype=np.float32)}

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          executor: Executor | None) -> dict[str, np.ndarray]:
        await asyncio.sleep(self._seconds(inputs))
        return {"Y": inputs["X"].sum(axis=1, keepdims=True, dtype=np.float32)}

    def unload(self) -> None:
        self.inputs, self.outputs = [], []
