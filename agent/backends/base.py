"""The loader interface every backend implements, after TF Serving's core/loader.h.

Lifecycle: ``estimate`` → ``load`` → ``infer``/``infer_async`` (any number of times,
concurrently) → ``unload``. ``load``, ``infer`` and ``unload`` block and are run by the
cache in thread pools, never on the event loop. Inference is batch-shaped (the first
dimension of every tensor is the batch) so an adaptive batcher can sit in front of it.
The interface knows nothing about a particular runtime: tensors are numpy arrays with
Open Inference Protocol datatype names.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from agent.backends.tfserving import TfServingHost
    from agent.config import ModelConfig
    from agent.memory import FootprintModel


class BackendError(RuntimeError):
    """A backend could not load, run or unload a model (the model's fault or the host's)."""

    status = 500
    retry_after: float | None = None


class BackendUnavailable(BackendError):
    """The runtime is down for now (restarting, unreachable): a 503, retry shortly."""

    status = 503
    retry_after = 1.0


class InvalidInput(ValueError):
    """The request's tensors do not fit the model (name, datatype, shape): a 400."""


# Open Inference Protocol datatypes <-> numpy dtypes.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype name of ``array`` (bytes/str arrays are BYTES)."""
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

    def __init__(self, name: str, version: int, path: Path, config: "ModelConfig",
                 footprints: "FootprintModel") -> None:
        self.name, self.version, self.path, self.config = name, version, path, config
        self.device = config.device
        self.footprints = footprints
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        #: Seconds of the first inference after load (part of the reload penalty).
        self.first_run_seconds = 0.0

    @property
    def pool(self) -> str:
        """The memory pool the model lives in: ``cpu`` or ``cuda:N``."""
        return self.device

    @abstractmethod
    def estimate(self) -> int:
        """Bytes the model will take in ``pool`` once loaded: an upper bound, cheap to
        compute, without loading anything. The cache reserves this much before ``load``."""

    @abstractmethod
    def load(self) -> None:
        """Make the model servable: create the session, fill ``inputs``/``outputs`` and
        run one warm-up inference (timed into ``first_run_seconds``). Blocking; raises
        ``BackendError`` on failure, leaving nothing allocated."""

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


def make_backend(kind: str, name: str, version: int, path: Path, config: "ModelConfig",
                 footprints: "FootprintModel", *, tfserving: "TfServingHost | None" = None
                 ) -> Backend:
    """The backend for ``kind`` (onnx, synthetic, tfserving). TF models share the node's
    one TF Serving server, ``tfserving``; the agent binds it (``functools.partial``)."""
    if kind == "onnx":
        from agent.backends.onnx import OnnxBackend as cls
    elif kind == "synthetic":
        from agent.backends.synthetic import SyntheticBackend as cls
    elif kind == "tfserving":
        if tfserving is None:
            raise BackendError("backend tfserving needs the agent's TF Serving server; "
                               "this process was given none")
        from agent.backends.tfserving import TfServingBackend

        return TfServingBackend(name, version, path, config, footprints, tfserving)
    else:
        raise BackendError(f"backend {kind!r} is not available in this agent "
                           "(available: onnx, synthetic, tfserving)")
    return cls(name, version, path, config, footprints)
