"""Model runtimes behind one loader interface (see ``agent.backends.base``).

The registry maps a backend name to its class, imported on first use: loading an ONNX
model never imports the TF Serving module or its protos. Adding a backend is one module
(its class, with its file name, estimate priors and device handling) plus one line here.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from agent.backends.base import (Backend, BackendCrashed, BackendError, BackendUnavailable,
                                 InvalidInput,
                                 LoadResult, TensorSpec, load_measured)

if TYPE_CHECKING:
    from agent.backends.tfserving import TfServingHost
    from agent.config import ModelConfig
    from agent.memory import FootprintModel, GpuAccounting

#: Backend name → "module:class".
REGISTRY: dict[str, str] = {
    "onnx": "agent.backends.onnx:OnnxBackend",
    "synthetic": "agent.backends.synthetic:SyntheticBackend",
    "tfserving": "agent.backends.tfserving:TfServingBackend",
}


def backend_class(kind: str) -> type[Backend]:
    """The class registered as ``kind`` (imported now); ``BackendError`` if none is."""
    target = REGISTRY.get(kind)
    if target is None:
        raise BackendError(f"backend {kind!r} is not available in this agent "
                           f"(available: {', '.join(REGISTRY)})")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def make_backend(kind: str, name: str, version: int, path: Path, config: "ModelConfig",
                 footprints: "FootprintModel", *, tfserving: "TfServingHost | None" = None,
                 gpu: "GpuAccounting | None" = None) -> Backend:
    """The backend for ``kind`` (onnx, synthetic, tfserving) for one model version. TF
    models share the node's one TF Serving server, ``tfserving``; CUDA models the node's
    ``gpu`` accounting. The agent binds both (``functools.partial``)."""
    return backend_class(kind).create(name, version, path, config, footprints,
                                      tfserving=tfserving, gpu=gpu)


__all__ = ["Backend", "BackendCrashed", "BackendError", "BackendUnavailable", "InvalidInput", "LoadResult",
           "REGISTRY", "TensorSpec", "backend_class", "load_measured", "make_backend"]
