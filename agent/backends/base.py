"""The loader interface every backend implements, after TF Serving's core/loader.h.

Lifecycle: ``lower_bound``/``estimate`` → ``load`` → ``infer``/``infer_async`` (any
number of times, concurrently) → ``unload``. ``load``, ``infer`` and ``unload`` block and
are run by the cache in thread pools, never on the event loop. ``load_measured`` is the
one way to load and measure a backend, shared by the agent and ``profile measure``.
Inference is batch-shaped (the first dimension of every tensor is the batch) so an
adaptive batcher can sit in front of it.
The interface knows nothing about a particular runtime: tensors are numpy arrays with
Open Inference Protocol datatype names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np

from agent.errors import AgentError
from agent.memory import PLAIN, FootprintModel, MemoryMeter, Prior, device_class, malloc_trim

if TYPE_CHECKING:
    from agent.config import ModelConfig
    from agent.memory import GpuAccounting

log = logging.getLogger("edgeagent.backends")


class BackendError(AgentError, RuntimeError):
    """A backend could not load, run or unload a model (the model's fault or the host's)."""


class BackendUnavailable(BackendError):
    """The runtime is down for now (restarting, unreachable): a 503, retry shortly."""

    status = 503
    retry_after = 1.0


class BackendCrashed(BackendUnavailable):
    """The runtime failed while running a request that fits the model (not the request's
    fault): a 503 + Retry-After naming the reason. The agent reloads the model (a new
    session) once its requests in flight are done, and serves again."""


class InvalidInput(AgentError, ValueError):
    """The request's tensors do not fit the model (name, datatype, shape): a 400."""

    status = 400


# Open Inference Protocol datatypes <-> numpy dtypes.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}


#: The OIP datatype of each numpy dtype of ``DATATYPES`` (BYTES aside).
_NAMES = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"}


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype name of ``array`` (bytes/str arrays are BYTES)."""
    found = _NAMES.get(array.dtype)
    if found is not None:
        return found
    if array.dtype.kind in "OSU":
        return "BYTES"
    for name, dtype in DATATYPES.items():
        if array.dtype == dtype:
            return name
    raise InvalidInput(f"unsupported tensor dtype {array.dtype}")


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: OIP datatype and shape, -1 for a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def zeros_for(spec: TensorSpec) -> np.ndarray:
    """A tensor of zeros (empty strings for BYTES) shaped by ``spec``, -1 dims as 1."""
    shape = [d if d >= 0 else 1 for d in spec.shape]
    if spec.datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, DATATYPES[spec.datatype])


def _compatible(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(
        a == b or a == -1 or b == -1 for a, b in zip(declared, actual))


def check_declared(config: "ModelConfig", inputs: list[TensorSpec],
                   outputs: list[TensorSpec]) -> None:
    """``BackendError`` naming the file and tensor unless the inputs/outputs a Triton
    config declares (``config.declared_*``) fit the model's: every input declared, each
    declared tensor present with the same datatype and a compatible shape (-1 = any)."""
    where = config.declared_in or "config"
    for what, declared, actual in (("input", config.declared_inputs, inputs),
                                   ("output", config.declared_outputs, outputs)):
        if declared is None:
            continue
        have = {s.name: s for s in actual}
        for d in declared:
            spec = have.get(d.name)
            if spec is None:
                raise BackendError(f"{where}: {what} {d.name!r} is not one of the model's "
                                   f"{what}s ({', '.join(have) or 'none'})")
            if spec.datatype != d.datatype:
                raise BackendError(f"{where}: {what} {d.name!r}: data_type {d.datatype}, "
                                   f"the model's is {spec.datatype}")
            if not _compatible(d.shape, spec.shape):
                raise BackendError(f"{where}: {what} {d.name!r}: shape {list(d.shape)} "
                                   f"(batch dimension included), the model's is "
                                   f"{list(spec.shape)}")
        missing = set(have) - {d.name for d in declared}
        if what == "input" and missing:
            raise BackendError(f"{where}: the model's input(s) {', '.join(sorted(missing))} "
                               "are not declared")


def check_inputs(specs: list[TensorSpec], tensors: dict[str, np.ndarray]) -> None:
    """Raise ``InvalidInput`` unless ``tensors`` are exactly the inputs ``specs`` describe."""
    by_name = {s.name: s for s in specs}
    for name in tensors:
        if name not in by_name:
            raise InvalidInput(f"unknown input {name!r}: the model's inputs are "
                               f"{', '.join(by_name) or 'none'}")
    for spec in specs:
        if spec.name not in tensors:
            raise InvalidInput(f"missing input {spec.name!r}")
        array = tensors[spec.name]
        got = datatype_of(array)
        if got != spec.datatype:
            raise InvalidInput(f"input {spec.name!r}: datatype {got}, the model expects "
                               f"{spec.datatype}")
        if len(array.shape) != len(spec.shape) or any(
                want >= 0 and want != have for want, have in zip(spec.shape, array.shape)):
            raise InvalidInput(f"input {spec.name!r}: shape {list(array.shape)}, the model "
                               f"expects {list(spec.shape)} (-1 = any)")


class Backend(ABC):
    """One version of one model in one runtime. Not reusable after ``unload``."""

    kind: ClassVar[str]
    #: The file a version directory holds for this backend (None: no file).
    MODEL_FILE: ClassVar[str | None] = None
    #: Estimate priors by device class (``cpu``, ``cuda``) before any measurement.
    PRIORS: ClassVar[dict[str, Prior]] = {"cpu": PLAIN}
    #: Warm up on zeros when the model's config says nothing (``warmup:``).
    DEFAULT_WARMUP: ClassVar[bool] = True
    #: ``infer_async`` may be cancelled midway and stops its work (it holds no thread):
    #: a caller that no longer needs the answer (a selection app's cut) cancels it.
    CANCELLABLE: ClassVar[bool] = False
    #: ``infer`` may run on the event loop itself where it is measured to be quick: it
    #: holds no lock the loop needs and returns within its measured time (the batcher
    #: decides: ``agent.node.batching.IN_PLACE_S``).
    RUNS_IN_PLACE: ClassVar[bool] = False

    def __init__(self, name: str, version: int, path: Path, config: "ModelConfig",
                 footprints: FootprintModel) -> None:
        self.name, self.version, self.path, self.config = name, version, path, config
        self.device = config.device
        self.footprints = footprints
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        #: Seconds of the first inference after load (part of the reload penalty).
        self.first_run_seconds = 0.0
        #: The warm-up inputs the config gives (decoded by the agent before ``load``)
        #: and where they come from, for messages; None: the default warm-up.
        self.warmup_sample: dict[str, np.ndarray] | None = None
        self.warmup_source = "warmup"
        #: Whether the last load's warm-up ran, and whether a default one failed (then
        #: the first request is the cold run).
        self.warmed = self.warm_up_failed = False

    @classmethod
    def create(cls, name: str, version: int, path: Path, config: "ModelConfig",
               footprints: FootprintModel, *, tfserving: Any = None,
               gpu: "GpuAccounting | None" = None) -> "Backend":
        """A backend given the node's shared services; each class takes what it needs."""
        return cls(name, version, path, config, footprints)

    @property
    def pool(self) -> str:
        """The memory pool the model lives in: ``cpu`` or ``cuda:N``."""
        return self.device

    def prior(self) -> Prior:
        """This backend's estimate prior on its device."""
        return self.prior_for(self.device)

    @classmethod
    def prior_for(cls, device: str) -> Prior:
        """The backend's estimate prior on ``device`` (its class's, else its cpu one)."""
        return cls.PRIORS.get(device_class(device), cls.PRIORS["cpu"])

    def weight_bytes(self) -> int:
        """Bytes of the model's weights as the runtime will hold them, read from the
        model's files without loading anything; 0 when unknown."""
        return 0

    def lower_bound(self) -> int:
        """Bytes the loaded model takes in ``pool`` at the very least (its weights):
        no eviction can make a model fit whose lower bound exceeds the room."""
        return self.weight_bytes()

    def load_room(self, size: int) -> int:
        """Bytes a load of a model of ``size`` steady bytes takes at its peak (the
        runtime's scratch while it builds the model): what the cache holds while the
        load runs, before the measured size replaces it."""
        return int(size * self.footprints.load_peak(self.kind, self.device, self.prior()))

    def estimate(self) -> int:
        """Bytes the model will take in ``pool`` once loaded: tight (overhead + learned
        factor × weight bytes), cheap, without loading anything. The cache reserves this
        much before ``load``; the measurement replaces it afterwards."""
        return self.footprints.estimate(self.kind, self.weight_bytes(), device=self.device,
                                        prior=self.prior())

    def set_up_device(self) -> int:
        """Set up the runtime on ``pool`` once per process (e.g. the CUDA context) and
        return that one-time overhead in bytes: the pool's, never a model's. Blocking,
        idempotent; 0 where there is none (cpu)."""
        return 0

    @abstractmethod
    def load(self) -> None:
        """Make the model servable: create the session, fill ``inputs``/``outputs`` and
        ``warm_up``. Blocking; raises ``BackendError`` on failure, leaving nothing
        allocated."""

    def warm_up(self) -> None:
        """Run the model once before it is reported ready (``load`` calls it last), timed
        into ``first_run_seconds``: on ``warmup_sample`` when the config gives one (its
        failure is a ``BackendError``: the load fails), else, unless ``warmup: none``, on
        zeros shaped by the signature (-1 dims as 1), whose failure is logged: the model
        still loads and its first request is the cold run (``warm_up_failed``)."""
        self.warmed = self.warm_up_failed = False
        self.first_run_seconds = 0.0
        option = self.config.warmup
        mode = option.mode if option is not None else (
            "default" if self.DEFAULT_WARMUP else "none")
        if mode == "none":
            return
        explicit = mode != "default"
        if explicit and self.warmup_sample is None:
            raise BackendError(f"{self.warmup_source}: the warm-up sample was not read")
        feed = self.warmup_sample if explicit else {s.name: zeros_for(s) for s in self.inputs}
        started = time.perf_counter()
        try:
            if explicit:
                check_inputs(self.inputs, feed)
            self.infer(feed, {})
        except BackendUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - any refusal of made-up inputs
            if explicit:
                raise BackendError(f"{self.warmup_source}: warm-up failed: {exc}") from None
            log.warning("%s:%s: the default warm-up (zeros) failed, serving anyway (the first "
                        "request is the cold run): %s", self.name, self.version, exc)
            self.warm_up_failed = True
            return
        self.first_run_seconds = time.perf_counter() - started
        self.warmed = True

    def measured_bytes(self) -> int | None:
        """The footprint the backend itself knows after ``load`` (exact or device-
        measured), or None to let the agent use the RSS delta around ``load``."""
        return None

    @abstractmethod
    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]
              ) -> dict[str, np.ndarray]:
        """Run one batch: validated inputs by name → all outputs by name. Blocking and
        thread-safe; raises ``InvalidInput`` (the request's fault) or ``BackendError``."""

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          executor: Executor | None) -> dict[str, np.ndarray]:
        """``infer`` without blocking the event loop (default: in ``executor``)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self.infer, inputs, parameters)

    @abstractmethod
    def unload(self) -> None:
        """Release everything ``load`` allocated. Called once, after the last ``infer``
        returned; the cache then returns freed heap to the OS."""

    def metadata(self) -> dict[str, Any]:
        return {"inputs": [s.as_json() for s in self.inputs],
                "outputs": [s.as_json() for s in self.outputs]}


@dataclass(frozen=True)
class LoadResult:
    """One measured load: ``size_bytes`` in ``pool`` (None when nothing clean was
    measured: keep the estimate), seconds of load including the first run, seconds of
    the first run, the raw RSS window (delta, clean) and its peak over the start (None
    when not known)."""

    size_bytes: int | None
    seconds: float
    first_run_seconds: float
    rss_delta: int
    clean: bool
    peak_bytes: int | None = None


def load_measured(backend: Backend, meter: MemoryMeter, *,
                  trim: Callable[[], bool] = malloc_trim) -> LoadResult:
    """Load ``backend`` inside a ``meter`` window and say what it takes: the backend's
    own figure (``measured_bytes``: exact, or measured on its device), else on ``cpu``
    max(RSS delta, ``lower_bound``) of a clean window, which also teaches the footprint
    model. On failure: unload, return the heap (``trim``) and re-raise. Blocking."""
    window = meter.begin()
    started = time.perf_counter()
    try:
        backend.load()
        check_declared(backend.config, backend.inputs, backend.outputs)
    except BaseException:
        meter.end(window)
        with contextlib.suppress(Exception):
            backend.unload()
        trim()
        raise
    seconds = time.perf_counter() - started
    delta, clean = meter.end(window)
    size = backend.measured_bytes()
    if size is None and backend.pool == "cpu" and clean and delta > 0:
        size = max(delta, backend.lower_bound())
        backend.footprints.observe(backend.kind, backend.weight_bytes(), size,
                                   device=backend.pool)
        if window.peak is not None:
            backend.footprints.observe_peak(backend.kind, size, window.peak,
                                            device=backend.pool)
    return LoadResult(size, seconds, backend.first_run_seconds, delta, clean, window.peak)
