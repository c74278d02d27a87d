"""Prediction cache (Clipper §4.2): recent outputs of one model version by input digest.

- Key: a digest of the input tensors (names, datatypes, shapes, bytes) and of the
  parameters that reach the backend; one cache per model version, so the model and
  version are implied and an unload or a new version never serves stale outputs.
- Eviction: CLOCK (second chance), as Clipper uses: entries sit in a ring in insertion
  order with a reference bit set on each hit; the hand evicts the first entry whose bit
  is clear, clearing bits as it passes.
- Bounded in bytes (outputs' nbytes plus a fixed overhead per entry); an entry larger
  than the whole bound is not cached.
- Single flight: concurrent identical requests share one computation; if it fails they
  all get its error; if its owner is cancelled, a waiter takes over.

Clipper's request/fetch API is non-blocking because its cache fronts an RPC layer; here
``get_or_compute`` awaits, which is the same contract for an asyncio server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np

#: Bytes charged per entry on top of its arrays (key, dict, array headers).
ENTRY_OVERHEAD = 256


def input_digest(inputs: dict[str, np.ndarray], parameters: dict[str, Any] | None = None
                 ) -> bytes:
    """A 16-byte digest of the tensors and parameters (equal inputs, equal digest)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        array = inputs[name]
        h.update(name.encode() + b"\0" + str(array.dtype).encode() + b"\0"
                 + repr(array.shape).encode() + b"\0")
        if array.dtype == object:
            for item in array.reshape(-1):
                data = item if isinstance(item, bytes) else str(item).encode()
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        else:
            h.update(np.ascontiguousarray(array).data)
    if parameters:
        h.update(json.dumps(parameters, sort_keys=True, default=str).encode())
    return h.digest()


def result_bytes(outputs: dict[str, np.ndarray]) -> int:
    """The bytes an entry holding ``outputs`` is charged."""
    total = ENTRY_OVERHEAD
    for array in outputs.values():
        if array.dtype == object:
            total += sum(len(x) if isinstance(x, (bytes, str)) else 64
                         for x in array.reshape(-1)) + 8 * array.size
        else:
            total += array.nbytes
    return total


class _LeaderGone(Exception):
    """The request computing a shared result was cancelled; a waiter computes instead."""


@dataclass
class _Entry:
    value: dict[str, np.ndarray]
    size: int
    referenced: bool = False


class PredictionCache:
    """Outputs by input digest for one model version, CLOCK-evicted under ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._ring: OrderedDict[bytes, _Entry] = OrderedDict()
        self._computing: dict[bytes, asyncio.Future] = {}
        self._generation = 0

    def __len__(self) -> int:
        return len(self._ring)

    def __contains__(self, key: bytes) -> bool:
        return key in self._ring

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        entry = self._ring.get(key)
        if entry is None:
            return None
        entry.referenced = True
        return entry.value

    def put(self, key: bytes, value: dict[str, np.ndarray]) -> bool:
        """Store ``value`` (read-only from then on); False when it is over the bound."""
        size = result_bytes(value)
        if size > self.max_bytes:
            return False
        old = self._ring.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        while self._ring and self.bytes + size > self.max_bytes:
            self._evict_one()
        # A view of a whole batch's output would keep the batch alive: store compact copies.
        value = {k: (a.copy() if a.base is not None else a) for k, a in value.items()}
        for array in value.values():
            array.flags.writeable = False
        self._ring[key] = _Entry(value, size)
        self.bytes += size
        return True

    def _evict_one(self) -> None:
        while True:  # terminates: each pass clears a bit, the second pass evicts
            key, entry = next(iter(self._ring.items()))
            if entry.referenced:
                entry.referenced = False
                self._ring.move_to_end(key)
                continue
            del self._ring[key]
            self.bytes -= entry.size
            self.evictions += 1
            return

    def clear(self) -> None:
        """Invalidate everything, including results still being computed."""
        self._ring.clear()
        self.bytes = 0
        self._generation += 1

    async def get_or_compute(self, key: bytes,
                             compute: Callable[[], Awaitable[dict[str, np.ndarray]]]
                             ) -> tuple[dict[str, np.ndarray], bool]:
        """(outputs, True if no computation was started for this call): a cached value,
        a share of an identical computation in progress, or ``compute()``'s result."""
        while True:
            value = self.get(key)
            if value is not None:
                self.hits += 1
                return value, True
            pending = self._computing.get(key)
            if pending is None:
                break
            try:
                value = await asyncio.shield(pending)
            except _LeaderGone:
                continue
            self.hits += 1
            return value, True
        self.misses += 1
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._computing[key] = future
        generation = self._generation
        try:
            value = await compute()
        except asyncio.CancelledError:
            future.set_exception(_LeaderGone())
            raise
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            if self._computing.get(key) is future:
                del self._computing[key]
        if generation == self._generation:
            self.put(key, value)
        future.set_result(value)
        return value, False

    def describe(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._ring),
                "bytes": self.bytes, "max_bytes": self.max_bytes,
                "evictions": self.evictions}
