"""The record of what the node served, for its twin (``edgeagent simulate --from``): a
fixed ring of the last requests and each model's measured profile, written out in the
simulator's own CSV formats (``cachepolicies.traces``).

The ring is preallocated columns (arrival time, model, rows, status, latency): adding a
request writes five cells and never allocates, so it costs the request path nothing
measurable; its memory is ``capacity × ENTRY_BYTES`` from the start and never grows.
The oldest requests are overwritten first. Nothing is written to disk: the files exist
only where ``GET /v1/trace`` and ``GET /v1/profiles`` (``edgeagent cache trace``) put
them.
"""

from __future__ import annotations

import csv
import io
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

#: Bytes one recorded request takes: arrival (float64), latency (float32), model id
#: (int32), rows (int32), HTTP status (int16).
ENTRY_BYTES = 8 + 4 + 4 + 4 + 2

#: The trace file's columns: the simulator's ``timestamp,model`` (seconds from the
#: first request written), then what it ignores.
TRACE_HEADER = ("timestamp", "model", "rows", "status", "latency_seconds", "unix_time")

#: The profiles file's columns: the simulator's, then the twin's and the agent's
#: settings of the model and of the node (load and pull slots, pull bandwidth: the same
#: on every row),
#: then its last pull into the disk tier (0 without a source): what ``simulate --from``
#: replays it with (``--disk-capacity`` replays the disk tier).
PROFILE_HEADER = ("model", "size_bytes", "load_seconds", "exec_seconds",
                  "first_exec_seconds", "exec_seconds_per_row", "load_slot_seconds",
                  "load_peak", "workers", "max_batch_size", "slo_seconds",
                  "load_concurrency", "max_concurrent_pulls", "pull_bandwidth",
                  "download_seconds", "disk_bytes")


class RequestRecord:
    """The last ``capacity`` requests, oldest overwritten first (0: none kept)."""

    def __init__(self, capacity: int, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.capacity = int(capacity)
        self.wall_clock = wall_clock
        # typed arrays (item stores are cheaper than numpy's), read as numpy by ``since``
        self._arrival = array("d", bytes(8 * self.capacity))  # wall clock, seconds
        self._latency = array("f", bytes(4 * self.capacity))
        self._model = array("i", bytes(4 * self.capacity))
        self._rows = array("i", bytes(4 * self.capacity))
        self._status = array("h", bytes(2 * self.capacity))
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self.added = 0  # requests ever added

    @property
    def nbytes(self) -> int:
        """Bytes the ring holds (allocated up front)."""
        return self.capacity * ENTRY_BYTES

    def __len__(self) -> int:
        return min(self.added, self.capacity)

    def add(self, model: str, rows: int, status: int, latency: float) -> None:
        """Record one answered request: ``latency`` seconds from arrival to answer."""
        if not self.capacity:
            return
        ident = self._ids.get(model)
        if ident is None:
            ident = self._ids[model] = len(self._names)
            self._names.append(model)
        i = self.added % self.capacity
        self._arrival[i] = self.wall_clock() - latency
        self._latency[i] = latency
        self._model[i] = ident
        self._rows[i] = min(rows, 2**31 - 1)
        self._status[i] = status
        self.added += 1

    def since(self, when: float) -> "Requests":
        """The recorded requests that arrived at ``when`` (Unix seconds) or later, in
        arrival order; to the microsecond, as the trace file writes them (so a
        ``unix_time`` read back from one selects its own request)."""
        kept = len(self)

        def column(values: array) -> np.ndarray:
            return np.frombuffer(values, dtype=values.typecode)[:kept].copy()

        arrival = column(self._arrival)
        order = np.argsort(arrival, kind="stable")
        order = order[arrival[order] >= when - 1e-6]
        return Requests(arrival[order], column(self._latency)[order],
                        [self._names[i] for i in column(self._model)[order]],
                        column(self._rows)[order], column(self._status)[order])


@dataclass(frozen=True)
class Requests:
    """Recorded requests in arrival order, column by column."""

    arrival: np.ndarray
    latency: np.ndarray
    models: list[str]
    rows: np.ndarray
    status: np.ndarray

    def to_csv(self) -> str:
        """The simulator's trace file (``timestamp`` from the first request)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(TRACE_HEADER)
        start = float(self.arrival[0]) if len(self.arrival) else 0.0
        for t, model, rows, status, latency in zip(
                self.arrival.tolist(), self.models, self.rows.tolist(),
                self.status.tolist(), self.latency.tolist()):
            writer.writerow((f"{t - start:.6f}", model, rows, status, f"{latency:.6f}",
                             f"{t:.6f}"))
        return out.getvalue()


def profiles_csv(rows: Iterable[dict[str, object]]) -> str:
    """The simulator's profiles file from one dict per model (``PROFILE_HEADER`` keys;
    None: not measured, an empty cell)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PROFILE_HEADER)
    for row in rows:
        writer.writerow(["" if row.get(k) is None else row[k] for k in PROFILE_HEADER])
    return out.getvalue()
