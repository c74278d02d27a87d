"""Memory accounting: estimates before load, measurements after, heap given back.

- ``FootprintModel``: estimate = overhead + factor × model-file bytes, per backend kind.
  The factor starts conservative and is learned from clean measurements (max observed
  ratio + 10 %), so the estimate stays an upper bound as TF Serving's Loader asks.
- ``MemoryMeter``: process-RSS deltas around loads/unloads. RSS is process-wide, so a
  window that overlapped another load or unload is flagged unreliable and the caller
  keeps the estimate instead (``size_estimated`` stays true).
- ``malloc_trim``: glibc keeps freed heap; without trimming, RSS never shows an unload.
- GPU memory via NVML (nvidia-ml-py), where present.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

import psutil

MiB = 2**20


class FootprintModel:
    """Per-backend ``overhead + factor × file_bytes`` estimates, learned from loads."""

    # ONNX Runtime CPU on MLPs, with ``tune_malloc`` and the runtime primed: RSS ≈ 1.0-1.15 ×
    # file + ~0.1 MiB per session (bench/memory_accounting.py). Without the malloc tuning
    # load-time scratch stays resident and it reads 2-3 ×; 2 × keeps the first guess safe.
    DEFAULTS = {"onnx": (2.0, 2 * MiB), "tfserving": (4.0, 64 * MiB)}
    MARGIN = 1.10
    KEEP = 32

    def __init__(self, factors: dict[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._learned: dict[str, float] = dict(factors or {})
        self._ratios: dict[str, deque[float]] = {}

    def factor(self, kind: str) -> float:
        return self._learned.get(kind, self.DEFAULTS.get(kind, (4.0, 0))[0])

    def overhead(self, kind: str) -> int:
        return self.DEFAULTS.get(kind, (4.0, 64 * MiB))[1]

    def estimate(self, kind: str, file_bytes: int) -> int:
        return int(self.overhead(kind) + self.factor(kind) * file_bytes)

    #: Smaller models say more about per-session overhead than about the factor.
    MIN_LEARN_BYTES = 4 * MiB

    def observe(self, kind: str, file_bytes: int, measured: int) -> None:
        """Learn from one clean measurement of a model of ``file_bytes``."""
        if file_bytes < self.MIN_LEARN_BYTES or measured <= 0:
            return
        ratio = measured / file_bytes
        with self._lock:
            ratios = self._ratios.setdefault(kind, deque(maxlen=self.KEEP))
            ratios.append(ratio)
            self._learned[kind] = max(1.0, max(ratios) * self.MARGIN)

    def to_json(self) -> dict[str, float]:
        with self._lock:
            return dict(self._learned)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _process_rss() -> int:
    """This process's RSS: /proc/self/statm where there is one (~µs), else psutil."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return psutil.Process().memory_info().rss


@dataclass
class Window:
    """One measurement window; ``clean`` turns false when another window overlaps it."""

    start_rss: int
    clean: bool = True


class MemoryMeter:
    """RSS deltas around blocking operations, with overlap detection."""

    def __init__(self, rss: Callable[[], int] | None = None) -> None:
        self._rss = rss or _process_rss
        self._lock = threading.Lock()
        self._open: list[Window] = []

    def rss(self) -> int:
        return self._rss()

    def begin(self) -> Window:
        with self._lock:
            window = Window(self._rss())
            if self._open:
                window.clean = False
                for other in self._open:
                    other.clean = False
            self._open.append(window)
            return window

    def end(self, window: Window) -> tuple[int, bool]:
        """(RSS delta since ``begin``, whether no other window overlapped)."""
        with self._lock:
            self._open.remove(window)
            return self._rss() - window.start_rss, window.clean


_libc: ctypes.CDLL | None | bool = False


def _get_libc() -> ctypes.CDLL | None:
    global _libc  # a process-wide handle to libc, not state: loaded once
    if _libc is False:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _libc = None
    return _libc  # type: ignore[return-value]


def malloc_trim() -> bool:
    """Return free heap to the OS (glibc); False where there is no malloc_trim."""
    libc = _get_libc()
    try:
        return bool(libc.malloc_trim(ctypes.c_size_t(0))) if libc else False
    except AttributeError:  # musl
        return False


_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int = 256 * 1024) -> bool:
    """Serve allocations >= ``mmap_threshold`` from mmap, always (glibc ``mallopt``).

    glibc raises its mmap threshold dynamically (up to 32 MiB) after large frees, after
    which model weights and load-time scratch buffers land in the heap: scratch freed
    after a load then stays in RSS and is billed to the model, and an unloaded model's
    weights only partly leave RSS. Measured on the demo MLPs, a fixed threshold cuts the
    apparent load footprint by ~30 % and lets an unload free 80-100 % instead of ~50 %.
    """
    libc = _get_libc()
    try:
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) if libc else False
    except AttributeError:
        return False


def cpu_budget_default(margin: float) -> int:
    """Bytes for models on the CPU: available memory now, less ``margin``."""
    return int(psutil.virtual_memory().available * (1 - margin))


def gpu_devices() -> dict[str, int]:
    """``cuda:N`` → total bytes for each GPU NVML sees; empty without NVML or GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: all mean "none"
        return {}
    try:
        return {f"cuda:{i}": int(pynvml.nvmlDeviceGetMemoryInfo(
                    pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                for i in range(pynvml.nvmlDeviceGetCount())}
    except Exception:  # noqa: BLE001
        return {}


def gpu_used_bytes(device: str) -> int | None:
    """Bytes in use on ``cuda:N`` per NVML, None where NVML cannot tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.split(":")[1]))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001
        return None
