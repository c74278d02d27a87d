"""Per-model-version counters in the shape of Triton's statistics extension
(``GET /v2/models[/{name}[/versions/{v}]]/stats``), counted where requests are served
(``agent.node.serving``: success, fail, cache hits; ``agent.node.batching``: queue and
compute times, executions), never parsed back from ``/metrics``.

Meanings, as Triton documents them:
- ``inference_count``: rows (batch elements) of successful requests, cache hits excluded;
  ``execution_count``: model executions (batches);
- ``inference_stats.success``/``fail``: requests and their whole time in the agent,
  arrival to answer; ``queue``: time from entering the model's queue to its batch's
  start; ``compute_input``: gathering the batch's inputs (concatenation),
  ``compute_infer``: the model run, ``compute_output``: splitting the outputs, each
  counted once per request with its batch's duration; ``cache_hit``/``cache_miss``:
  requests answered by the prediction cache / that looked it up and computed;
- ``batch_stats``: per batch size (rows), executions and their compute durations;
- ``last_inference``: wall-clock milliseconds since the epoch of the last success.
"""

from __future__ import annotations

import time
from typing import Any, Callable

_KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
          "cache_hit", "cache_miss")
_BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")


def _ns(seconds: float) -> int:
    return max(int(seconds * 1e9), 0)


class ModelStats:
    """Counters of one model version since the agent started (they survive unloads)."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self.wall_clock = wall_clock
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.durations = {kind: [0, 0] for kind in _KINDS}  # kind -> [count, ns]
        self.batches: dict[int, dict[str, list[int]]] = {}

    def _add(self, kind: str, seconds: float, count: int = 1) -> None:
        slot = self.durations[kind]
        slot[0] += count
        slot[1] += _ns(seconds) * count

    def succeeded(self, rows: int, seconds: float, *, cache_hit: bool = False) -> None:
        """A request answered after ``seconds`` in the agent (``rows`` batch elements)."""
        self._add("success", seconds)
        self.last_inference_ms = int(self.wall_clock() * 1000)
        if cache_hit:
            self._add("cache_hit", seconds)
        else:
            self.inference_count += max(rows, 1)

    def cache_miss(self, seconds: float) -> None:
        self._add("cache_miss", seconds)

    def failed(self, seconds: float) -> None:
        """A request for this model that got an error after ``seconds``."""
        self._add("fail", seconds)

    def executed(self, rows: int, queued: list[float], gather: float, infer: float,
                 split: float) -> None:
        """One model execution of ``rows`` rows for requests that waited ``queued``
        seconds each, with its input gathering, run and output splitting times."""
        self.execution_count += 1
        n = len(queued)
        for wait in queued:
            self._add("queue", wait)
        for kind, seconds in zip(_BATCH_KINDS, (gather, infer, split)):
            self._add(kind, seconds, n)
        batch = self.batches.setdefault(rows, {kind: [0, 0] for kind in _BATCH_KINDS})
        for kind, seconds in zip(_BATCH_KINDS, (gather, infer, split)):
            batch[kind][0] += 1
            batch[kind][1] += _ns(seconds)

    def as_json(self, name: str, version: int) -> dict[str, Any]:
        """One ``model_stats`` element."""
        def stat(slot: list[int]) -> dict[str, int]:
            return {"count": slot[0], "ns": slot[1]}

        return {
            "name": name, "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {kind: stat(slot) for kind, slot in self.durations.items()},
            "batch_stats": [{"batch_size": size, **{k: stat(v) for k, v in kinds.items()}}
                            for size, kinds in sorted(self.batches.items())],
        }
