"""The simulator's disk tier: a miss across three tiers, remote → disk → memory.

A model's files come from its source (``download_seconds`` in the profiles) into a disk
of ``capacity`` bytes (``disk_bytes`` each, else ``size_bytes``), from which it loads
into memory; a model with 0 bytes and 0 seconds there (a node's model without a source,
in its record) loads without the tier. The disk starts empty and is a cache of its own: a ``MemoryPool`` with its
own policy, whose penalty for a model is its download time. It records every request, as
the memory policy does, so oracles stay in step with the trace.

The rules are the live agent's (``agent/node/disktier.py``): a miss whose files are not
on disk pulls them first, then reserves its memory and loads. Room on disk is made from
the files of *idle* models (not in memory, not being pulled or loaded) when they suffice,
else from those of idle and *resident* models (in memory: they keep serving, and their
files are pulled again only if they must reload); never from models being pulled or
loaded. The memory policy's penalty for a model is ``pool.miss_penalty`` with its
download counted while its files are not on disk: a resident model whose files are
evicted is re-admitted at its new penalty, as the live cache does. Where models being
pulled or loaded hold the whole disk, the live agent refuses the pull (507); a replay
cannot fail a request, so the pull then feeds the load without keeping its files.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cachepolicies.pool import EvictionPolicy, MemoryPool, miss_penalty
from cachepolicies.traces import Profiles, SimulationInputError, Trace


class DiskBooks:
    """The disk tier's books during one replay: the files on disk, downloads per model."""

    def __init__(self, capacity: int, policy: EvictionPolicy, profiles: Profiles,
                 bandwidth: float | None = None) -> None:
        """``bandwidth``: bytes per second a pull may take (the agent's
        ``pull_bandwidth``, per pull): a download takes at least its bytes over it."""
        self.pool = MemoryPool(capacity, policy)
        self.policy = policy
        sizes = disk_bytes(profiles)
        seconds = download_seconds(profiles)
        if bandwidth:
            seconds = np.maximum(seconds, sizes / bandwidth)
        self.sizes = sizes.tolist()
        self.download_seconds = seconds.tolist()
        self.warm = profiles.penalty_seconds.tolist()  # a load from disk
        self.cold = miss_penalty(profiles.load_seconds, profiles.first_exec_seconds,
                                 profiles.exec_seconds, seconds).tolist()
        self.downloads = [0] * len(profiles)  # per model
        self.kept = 0  # downloads whose files stayed on disk

    def record_access(self, key: int, now: float) -> None:
        """A request for ``key``, hit or miss (the disk policy's rates and recency)."""
        self.policy.record_access(key, now)

    def needs_pull(self, key: int) -> bool:
        """Whether a load of ``key`` pulls its files first: not on disk, and from a source
        (0 bytes and 0 seconds: a node's model without one)."""
        return key not in self.pool and bool(self.sizes[key] or self.download_seconds[key])

    def fetch(self, key: int, now: float, memory: MemoryPool,
              busy: Callable[[int], bool] = lambda key: False) -> float:
        """Put ``key``'s files on disk for a load: the seconds its download takes, 0 when
        they are there. ``memory`` holds the resident models; ``busy`` says which are
        being pulled or loaded (their files stay)."""
        if not self.needs_pull(key):
            return 0.0
        self.downloads[key] += 1
        size = self.sizes[key]
        victims = self.pool.reserve(size, now, lambda k: k not in memory and not busy(k))
        if victims is None:
            victims = self.pool.reserve(size, now, lambda k: not busy(k))
        if victims is not None:
            self.pool.commit(key, size, size, self.download_seconds[key], now)
            self.kept += 1
            for victim in victims:
                if victim in memory:  # its next miss pulls again: re-admitted at that cost
                    memory.policy.remove(victim)
                    memory.policy.admit(victim, memory.sizes[victim], self.cold[victim], now)
        return self.download_seconds[key]

    def penalty(self, key: int) -> float:
        """What a miss on ``key`` would cost now (the memory policy's penalty): its load,
        plus its download when its files are not on disk."""
        return self.warm[key] if key in self.pool else self.cold[key]

    def totals(self) -> dict[str, float | int]:
        """The tier's result fields: downloads, bytes and seconds pulled, evictions."""
        counts = np.asarray(self.downloads, dtype=np.int64)
        return {"downloads": int(counts.sum()),
                "bytes_downloaded": int(counts @ np.asarray(self.sizes, dtype=np.int64)),
                "download_delay_seconds": float(counts @ np.asarray(self.download_seconds)),
                "disk_evictions": self.kept - len(self.pool.sizes)}


def download_seconds(profiles: Profiles) -> np.ndarray:
    """Each model's download seconds (0 where the profiles give none)."""
    if profiles.download_seconds is None:
        return np.zeros(len(profiles))
    return profiles.download_seconds


def disk_bytes(profiles: Profiles) -> np.ndarray:
    """Each model's bytes on disk (its ``size_bytes`` where the profiles give none)."""
    return profiles.size_bytes if profiles.disk_bytes is None else profiles.disk_bytes


def check_disk_capacity(trace: Trace, profiles: Profiles, capacity_bytes: int) -> None:
    """Raise when a model the trace requests cannot fit on a disk of ``capacity_bytes``
    (the live agent refuses its pull: disk full)."""
    if capacity_bytes < 0:
        raise SimulationInputError("disk capacity", f"{capacity_bytes} bytes is negative")
    sizes = disk_bytes(profiles)
    requested = np.unique(trace.model_ids)
    too_big = requested[sizes[requested] > capacity_bytes]
    if too_big.size:
        worst = int(too_big[np.argmax(sizes[too_big])])
        more = f" ({too_big.size - 1} other requested model(s) too)" if too_big.size > 1 else ""
        raise SimulationInputError(
            profiles.source,
            f"model {profiles.names[worst]!r} needs {int(sizes[worst])} bytes on disk, more "
            f"than the whole disk capacity of {capacity_bytes} bytes{more}",
            column="disk_bytes" if profiles.disk_bytes is not None else "size_bytes")
