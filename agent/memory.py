"""Memory accounting: estimates before load, measurements after, heap given back.

Shared by the backends and the node (a layer below both: it imports neither).

- ``FootprintModel``: estimate = overhead + factor × weight bytes, per (backend kind,
  device class). A backend supplies the weights' bytes (read from the model file, no
  session) and a ``Prior`` (its factor and per-model overhead before any measurement);
  the factor is then learned from clean measurements — a high quantile of the observed
  ratios plus a small margin, so the estimate stays tight — and kept across restarts in
  a JSON file (``save``/``load``, written atomically).
- ``MemoryMeter``: deltas of a reading (process RSS, or this process's GPU memory)
  around loads/unloads. The reading is process-wide, so a window that overlapped
  another one is flagged unreliable and the caller keeps the estimate instead.
- ``malloc_trim`` / ``tune_malloc``: glibc keeps freed heap; without trimming, RSS never
  shows an unload, and without a fixed mmap threshold load-time scratch stays resident.
- ``GpuMemoryReader``: this process's bytes on a GPU through NVML's per-process figures;
  ``GpuAccounting``: per-GPU budgets, a meter per GPU and the runtime's one-time context
  overhead, which is the pool's overhead and never a model's size.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

log = logging.getLogger("edgeagent.memory")

MiB = 2**20


@dataclass(frozen=True)
class Prior:
    """What a backend expects before any measurement: resident bytes per weight byte,
    bytes per loaded model besides its weights (session, arena, handles), and the peak
    a load reaches over the model's steady size (scratch while the runtime builds it)."""

    factor: float
    overhead: int
    load_peak: float = 1.0


#: For callers that name no prior: weights as they are, nothing besides.
PLAIN = Prior(1.0, 0)


def device_class(device: str) -> str:
    """``cpu`` or ``cuda``: learned factors are shared by GPUs of one process."""
    return device.split(":", 1)[0]


def write_atomic(path: Path, text: str, *, open_file: Callable[..., Any] = open) -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old file or the new one,
    never half of one: a temporary file beside it, flushed and fsynced, then renamed
    over it. On any failure (a full disk: ENOSPC) the temporary file is removed and the
    error raised; ``path`` is untouched. ``open_file`` opens the temporary file (tests
    inject one that fails)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open_file(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


class FootprintModel:
    """Per (backend kind, device class) estimates ``overhead + factor × weight_bytes``,
    learned from clean measurements and optionally persisted to ``path`` (JSON).

    Before any measurement a backend's ``Prior`` applies. From the recent measurements
    (weights w, measured m): overhead = the lower median of the excesses max(m − w, 0)
    of models under ``MIN_LEARN_BYTES`` (mostly overhead) together with the prior's
    overhead, which counts as one more observation (one odd window cannot set it) and is
    capped by the smallest excess of the larger models; factor = the 0.9 quantile of
    (m − overhead) / w over the larger models (at least 1: weights are held); the
    estimate gets ``MARGIN`` on top: tight, yet above nearly every measurement."""

    QUANTILE = 0.9
    MARGIN = 1.03
    KEEP = 32
    #: Smaller models say more about per-session overhead than about the factor.
    MIN_LEARN_BYTES = 4 * MiB

    def __init__(self, *, path: Path | None = None,
                 open_file: Callable[..., Any] = open) -> None:
        self._lock = threading.Lock()
        self.open_file = open_file  # for ``write_atomic`` (tests inject a failing one)
        self._seen: dict[str, deque[tuple[int, int]]] = {}
        self._peaks: dict[str, deque[float]] = {}  # peak during load / steady size
        self._weights: dict[tuple[str, int, int], int] = {}
        self.path = path

    @classmethod
    def load(cls, path: Path, open_file: Callable[..., Any] = open) -> "FootprintModel":
        """The model saved at ``path`` (fresh when absent or unreadable, logged); later
        observations are saved there."""
        model = cls(path=path, open_file=open_file)
        try:
            doc = json.loads(Path(path).read_text())
            for key, pairs in (doc.get("measurements") or {}).items():
                for weights, measured in pairs:
                    model._add(key, int(weights), int(measured))
            for key, ratios in (doc.get("load_peaks") or {}).items():
                for ratio in ratios:
                    model._peaks.setdefault(key, deque(maxlen=cls.KEEP)).append(float(ratio))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            log.warning("ignoring unreadable footprint file %s: %s", path, exc)
        return model

    def weight_bytes(self, file: Path, read: Callable[[Path], int]) -> int:
        """``read(file)``, remembered while the file keeps its size and mtime (parsing a
        large model file on every miss would cost time and transient memory)."""
        stat = os.stat(file)
        key = (str(file), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            if key in self._weights:
                return self._weights[key]
        value = read(file)
        with self._lock:
            self._weights[key] = value
        return value

    @staticmethod
    def key(kind: str, device: str = "cpu") -> str:
        return f"{kind}/{device_class(device)}"

    def learned(self, kind: str, device: str = "cpu", prior: Prior = PLAIN
                ) -> tuple[float, int] | None:
        """(factor, overhead) fitted to the measurements of ``kind`` on ``device``; None
        before the first one."""
        with self._lock:
            seen = list(self._seen.get(self.key(kind, device), ()))
        if not seen:
            return None
        large = [(w, m) for w, m in seen if w >= self.MIN_LEARN_BYTES]
        small = sorted([max(m - w, 0) for w, m in seen if w < self.MIN_LEARN_BYTES]
                       + [prior.overhead])
        overhead = small[(len(small) - 1) // 2]
        if large:
            overhead = min(overhead, min(max(m - w, 0) for w, m in large))
        ratios = sorted((m - overhead) / w for w, m in large)
        factor = max(1.0, ratios[min(len(ratios) - 1, int(self.QUANTILE * len(ratios)))]) \
            if ratios else prior.factor
        return factor, overhead

    def factor(self, kind: str, device: str = "cpu", prior: Prior = PLAIN) -> float:
        """The learned factor for ``kind`` on ``device``, else the prior's."""
        learned = self.learned(kind, device, prior)
        return learned[0] if learned else prior.factor

    def estimate(self, kind: str, weight_bytes: int, *, device: str = "cpu",
                 prior: Prior = PLAIN) -> int:
        """Bytes a model with ``weight_bytes`` of weights will take once loaded."""
        learned = self.learned(kind, device, prior)
        if learned is None:
            return int(prior.overhead + prior.factor * weight_bytes)
        factor, overhead = learned
        return int(self.MARGIN * (overhead + factor * weight_bytes))

    def observe(self, kind: str, weight_bytes: int, measured: int, *,
                device: str = "cpu") -> None:
        """Learn from one clean measurement (bytes) of a model of ``weight_bytes``."""
        if measured <= 0 or weight_bytes < 0:
            return
        self._add(self.key(kind, device), weight_bytes, measured)
        self.save()

    def load_peak(self, kind: str, device: str = "cpu", prior: Prior = PLAIN) -> float:
        """Peak memory during a load of ``kind`` on ``device`` per byte of the model's
        steady size: the ``QUANTILE`` of the observed ratios (at least 1), else the
        prior's. What a load reserves while it runs."""
        with self._lock:
            ratios = sorted(self._peaks.get(self.key(kind, device), ()))
        if not ratios:
            return prior.load_peak
        return max(1.0, ratios[min(len(ratios) - 1, int(self.QUANTILE * len(ratios)))])

    def observe_peak(self, kind: str, size: int, peak: int, *, device: str = "cpu") -> None:
        """Learn from one clean load of a model of ``size`` bytes that peaked at ``peak``
        bytes over the memory before it."""
        if size < self.MIN_LEARN_BYTES or peak <= 0:
            return  # small loads: the ratio is noise of the allocator
        with self._lock:
            self._peaks.setdefault(self.key(kind, device),
                                   deque(maxlen=self.KEEP)).append(peak / size)
        self.save()

    def _add(self, key: str, weights: int, measured: int) -> None:
        with self._lock:
            self._seen.setdefault(key, deque(maxlen=self.KEEP)).append((weights, measured))

    def to_json(self) -> dict[str, float]:
        """The learned factors by ``kind/device class`` (with no prior overhead)."""
        with self._lock:
            keys = list(self._seen)
        out = {}
        for key in keys:
            kind, _, device = key.partition("/")
            out[key] = self.factor(kind, device)
        return out

    def save(self) -> None:
        """Write the recent measurements to ``path`` atomically (nothing without one)."""
        if self.path is None:
            return
        with self._lock:
            doc = {"format": 1,
                   "measurements": {k: [list(p) for p in v] for k, v in self._seen.items()},
                   "load_peaks": {k: list(v) for k, v in self._peaks.items()}}
        path = Path(self.path)
        try:
            write_atomic(path, json.dumps(doc, indent=1), open_file=self.open_file)
        except OSError as exc:
            log.warning("cannot write footprint file %s: %s", path, exc)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _process_rss() -> int:
    """This process's RSS: /proc/self/statm where there is one (~µs), else psutil."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return psutil.Process().memory_info().rss


def _process_peak() -> int | None:
    """This process's peak RSS since the last ``_reset_process_peak`` (VmHWM), or None."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_process_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` 5); False where it can't."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class Window:
    """One measurement window; ``clean`` turns false when another window overlaps it.
    ``peak``: the reading's highest point over ``start_rss`` during a clean window,
    where the meter can tell (RSS on Linux), else None."""

    start_rss: int
    clean: bool = True
    peak_tracked: bool = False
    peak: int | None = None


class MemoryMeter:
    """Deltas of a reading (default: process RSS) around blocking operations, with
    overlap detection; for RSS also the peak within a window that ran alone."""

    def __init__(self, rss: Callable[[], int] | None = None) -> None:
        self._rss = rss or _process_rss
        # The process-wide peak only says something about an RSS window.
        self._peak = (_process_peak, _reset_process_peak) if rss is None else None
        self._lock = threading.Lock()
        self._open: list[Window] = []

    def rss(self) -> int:
        return self._rss()

    def begin(self) -> Window:
        with self._lock:
            tracked = not self._open and self._peak is not None and self._peak[1]()
            window = Window(self._rss(), peak_tracked=tracked)
            if self._open:
                window.clean = False
                for other in self._open:
                    other.clean = False
            self._open.append(window)
            return window

    def end(self, window: Window) -> tuple[int, bool]:
        """(RSS delta since ``begin``, whether no other window overlapped); sets
        ``window.peak`` when the window was clean and the peak is known."""
        with self._lock:
            self._open.remove(window)
            if window.clean and window.peak_tracked:
                high = self._peak[0]()
                window.peak = None if high is None else max(high - window.start_rss, 0)
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


#: uvloop's TLS transport reads each record with ``SSLObject.read(256 KiB)``: a
#: bytes object of 256 KiB, shrunk at once to what arrived.
TLS_READ_BYTES = 256 * 1024


def tune_malloc(mmap_threshold: int = TLS_READ_BYTES + 64 * 1024) -> bool:
    """Serve allocations >= ``mmap_threshold`` from mmap, always (glibc ``mallopt``).

    glibc raises its mmap threshold dynamically (up to 32 MiB) after large frees, after
    which model weights and load-time scratch buffers land in the heap: scratch freed
    after a load then stays in RSS and is billed to the model, and an unloaded model's
    weights only partly leave RSS. A fixed threshold keeps both out of the heap
    (``bench/memory_growth.py`` shows the difference; figures in docs/benchmarks.md).
    It sits above ``TLS_READ_BYTES``: at or below it, every TLS record the agent reads
    would cost an mmap, an mremap and a munmap.
    """
    libc = _get_libc()
    try:
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) if libc else False
    except AttributeError:
        return False


def cpu_budget_default(margin: float) -> int:
    """Bytes for models on the CPU: available memory now, less ``margin``."""
    return int(psutil.virtual_memory().available * (1 - margin))


def device_index(device: str) -> int:
    """N of ``cuda:N``."""
    return int(device.split(":", 1)[1])


class GpuMemoryReader:
    """GPU memory as NVML reports it, for this process (or ``pid``) per device.

    ``used`` is the process's own usage from ``nvmlDeviceGetComputeRunningProcesses``
    (``_v3`` where the binding has it), so other processes on the GPU never change what
    our models are charged. Where the driver hides per-process figures (unsupported, or
    no usedGpuMemory, or our pid absent while we hold a context: a PID namespace), it
    falls back to the device's used memory and logs a warning once per device. ``nvml``
    is the ``pynvml`` module (nvidia-ml-py) or a double with its functions."""

    def __init__(self, nvml: Any | None = None, *, pid: int | None = None) -> None:
        self._nvml = nvml
        self._ready: bool | None = None
        self.pid = pid or os.getpid()
        self._lock = threading.Lock()
        self._contexts: set[str] = set()  # devices where this process made a context
        self._warned: set[str] = set()

    def _lib(self) -> Any | None:
        """The initialised NVML binding, None without library, driver or GPU."""
        with self._lock:
            if self._ready is None:
                try:
                    if self._nvml is None:
                        import pynvml

                        self._nvml = pynvml
                    self._nvml.nvmlInit()
                    self._ready = True
                except Exception:  # noqa: BLE001 - no library, no driver: all mean "none"
                    self._ready = False
            return self._nvml if self._ready else None

    def _handle(self, device: str) -> Any:
        return self._lib().nvmlDeviceGetHandleByIndex(device_index(device))

    def devices(self) -> dict[str, int]:
        """``cuda:N`` → total bytes for each GPU NVML sees; empty without NVML."""
        nvml = self._lib()
        if nvml is None:
            return {}
        try:
            return {f"cuda:{i}": int(nvml.nvmlDeviceGetMemoryInfo(
                        nvml.nvmlDeviceGetHandleByIndex(i)).total)
                    for i in range(nvml.nvmlDeviceGetCount())}
        except Exception:  # noqa: BLE001
            return {}

    def device_used(self, device: str) -> int | None:
        """Bytes in use on ``device`` by every process; None where NVML cannot tell."""
        if self._lib() is None:
            return None
        try:
            return int(self._lib().nvmlDeviceGetMemoryInfo(self._handle(device)).used)
        except Exception:  # noqa: BLE001
            return None

    def note_context(self, device: str) -> None:
        """Record that this process now holds a CUDA context on ``device`` (from then
        on, our pid missing from NVML's list means NVML cannot see our pid)."""
        with self._lock:
            self._contexts.add(device)

    def process_used(self, device: str, pid: int | None = None) -> int | None:
        """Bytes ``pid`` (default: this process) uses on ``device`` per NVML's
        per-process figures; 0 when it has no context there; None when unavailable."""
        nvml = self._lib()
        if nvml is None:
            return None
        pid = pid or self.pid
        try:
            query = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None) \
                or nvml.nvmlDeviceGetComputeRunningProcesses
            procs = query(self._handle(device))
        except Exception:  # noqa: BLE001 - NotSupported and friends
            return None
        ours = [p for p in procs if p.pid == pid]
        if any(p.usedGpuMemory is None for p in ours) or (
                procs and all(p.usedGpuMemory is None for p in procs)):
            return None
        if not ours and pid == self.pid and device in self._contexts:
            return None  # we hold a context yet are not listed: NVML sees other pids
        return int(sum(p.usedGpuMemory for p in ours))

    def used(self, device: str, pid: int | None = None) -> int | None:
        """``process_used``, else the device's used bytes (with a warning, once per
        device); None without NVML."""
        used = self.process_used(device, pid)
        if used is not None:
            return used
        total = self.device_used(device)
        if total is not None and device not in self._warned:
            self._warned.add(device)
            log.warning("NVML gives no per-process memory on %s here; measuring device-wide "
                        "used memory, which other processes on this GPU change", device)
        return total


class GpuAccounting:
    """What the node shares with backends about its GPUs: the reader, each device's
    budget, one meter per device (this process's GPU bytes) and the one-time runtime
    overhead (CUDA context, runtime set-up) of each device.

    The overhead is measured once, around the first CUDA set-up on a device
    (``ensure_context``), and belongs to the pool, not to a model: the cache takes it
    off the device's room for models (``context_overhead``)."""

    def __init__(self, reader: GpuMemoryReader, budgets: dict[str, int]) -> None:
        self.reader = reader
        self.budgets = dict(budgets)
        self._overhead: dict[str, int] = {}
        self._lock = threading.Lock()
        self._meters: dict[str, MemoryMeter] = {}

    def meter(self, device: str) -> MemoryMeter | None:
        """A meter of this process's bytes on ``device``; None where NVML cannot tell."""
        if self.reader.used(device) is None:
            return None
        with self._lock:
            if device not in self._meters:
                self._meters[device] = MemoryMeter(lambda: self.reader.used(device) or 0)
            return self._meters[device]

    def context_overhead(self, device: str) -> int | None:
        """Bytes of the runtime's one-time set-up on ``device``; None before the first
        CUDA load there (or where it could not be measured: then 0 is billed)."""
        with self._lock:
            return self._overhead.get(device)

    def ensure_context(self, device: str, set_up: Callable[[], None]) -> int:
        """Run ``set_up`` (which creates the runtime's context on ``device`` and frees
        everything else it allocated) once per device, measuring this process's GPU
        usage around it; the overhead in bytes (0 where unmeasurable). Blocking."""
        with self._lock:  # one set-up per device, concurrent first loads wait for it
            if device in self._overhead:
                return self._overhead[device]
            reader = self.reader
            before = reader.process_used(device), reader.device_used(device)
            set_up()
            reader.note_context(device)
            after = reader.process_used(device), reader.device_used(device)
            # Per-process figures where NVML gives them, else device-wide ones (logged).
            pair = (before[0], after[0]) if None not in (before[0], after[0]) else \
                (before[1], reader.used(device))
            overhead = max(pair[1] - pair[0], 0) if None not in pair else 0
            self._overhead[device] = overhead
        log.info("runtime set-up on %s takes %.1f MiB of GPU memory (pool overhead)",
                 device, overhead / MiB)
        return overhead

    def session_limit(self, device: str) -> int | None:
        """The most one session may take on ``device`` (its ``gpu_mem_limit``): the
        budget less the context overhead; None without a budget for the device."""
        budget = self.budgets.get(device)
        if budget is None:
            return None
        return max(budget - (self.context_overhead(device) or 0), 0)


def gpu_budgets(spec: int | dict[str, int] | None, devices: dict[str, int],
                margin: float) -> dict[str, int]:
    """A budget per GPU in ``devices`` (``cuda:N`` → total bytes): ``spec`` as one size
    for every GPU, a mapping per device (devices it omits get the default), or None for
    total memory less ``margin``. Devices named by ``spec`` but absent are left out."""
    out = {}
    for device, total in devices.items():
        if isinstance(spec, dict):
            budget = spec.get(device)
        else:
            budget = spec
        out[device] = budget if budget is not None else int(total * (1 - margin))
    return out
