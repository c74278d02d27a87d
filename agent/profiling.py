"""Measuring model profiles on this machine: memory, load and execution time of real
ONNX models in ONNX Runtime, written as the simulator's profiles CSV.

For each model, in this process, one after another, set up as the agent sets itself up
(``tune_malloc``, ONNX Runtime primed so its start-up is billed to no model), and
loaded and measured by the agent's own code: the ONNX backend with the model's
settings (``config.yaml`` beside it, else the defaults) under ``load_measured``, so
``profile measure`` and the agent report the same size for the same file.

- ``rss_delta_bytes``: process RSS after the session is created and has run once,
  minus RSS before (freed heap is returned with ``malloc_trim`` between models).
  ``size_bytes``: what the agent would account, max(RSS delta, the weights' bytes):
  RSS moves in pages and reuses freed heap, so for small models the delta undercounts.
- ``load_seconds``: session creation; ``first_exec_seconds``: the first run;
  ``exec_seconds``: the median of ``runs`` warm runs. ``cachepolicies.traces`` charges a
  miss ``load + max(first_exec − exec, 0)`` = session creation + first run − a warm
  run, which is CremeBrulee's "cold first execution − warm execution".

Inputs are synthetic, from the model's input metadata: symbolic or unknown dimensions
become 1, floats are seeded normal noise, integers zeros, booleans false, strings empty.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from agent.backends import BackendError, load_measured
from agent.config import ConfigError, ModelConfig, load_model_config
from agent.memory import FootprintModel, MemoryMeter, malloc_trim, tune_malloc
from agent.node.repository import scan_model, scan_repository
from cachepolicies.traces import Profiles, make_profiles

_NUMPY_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32,
    "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


class ProfilingError(ValueError):
    """A path holds no measurable ONNX model, or ONNX Runtime cannot load or run it."""


@dataclass(frozen=True)
class ModelProfile:
    """One model's measurements on this machine (seconds and bytes)."""

    model: str
    path: Path
    file_bytes: int
    rss_delta_bytes: int
    load_seconds: float  # InferenceSession creation
    first_exec_seconds: float  # the first run after creation
    exec_seconds: float  # median warm run
    size_bytes: int = 0  # what the agent accounts: max(RSS delta, weights' bytes)


def find_onnx_models(paths: Iterable[str | Path]) -> list[tuple[str, Path]]:
    """``(model name, model.onnx path)`` for each path: an ``.onnx`` file (named by its
    stem, or ``<model>`` for ``<repo>/<model>/<version>/model.onnx``), a model directory
    (its highest version), or a model repository (each ONNX model in it)."""
    found: list[tuple[str, Path]] = []
    for path in map(Path, paths):
        if path.is_file():
            if path.suffix != ".onnx":
                raise ProfilingError(f"{path}: not an .onnx file")
            in_repository = path.name == "model.onnx" and path.parent.name.isdigit()
            found.append((path.parent.parent.name if in_repository else path.stem, path))
        elif path.is_dir():
            is_model_dir = any(p.is_dir() and p.name.isdigit() for p in path.iterdir())
            specs = [scan_model(path)] if is_model_dir else list(scan_repository(path).values())
            if is_model_dir and specs[0].error:
                raise ProfilingError(specs[0].error)
            onnx = [s for s in specs if s.backend == "onnx" and s.error is None]
            if not onnx:
                raise ProfilingError(f"{path}: no ONNX model found (expected "
                                     f"<repo>/<model>/<version>/model.onnx)")
            found += [(s.name, s.model_file(s.default_version)) for s in onnx]
        else:
            raise ProfilingError(f"{path}: no such file or directory")
    names = [name for name, _ in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ProfilingError(f"model name(s) given twice: {', '.join(duplicates)}")
    return found


def synthetic_inputs(session, seed: int = 0) -> dict[str, np.ndarray]:
    """An input for every input of an ONNX Runtime ``session``, built from its metadata."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        dtype = _NUMPY_TYPES.get(arg.type)
        if dtype is None:
            raise ProfilingError(f"input {arg.name!r} has unsupported type {arg.type}")
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in (arg.shape or [])]
        if dtype is np.object_:
            feeds[arg.name] = np.full(shape, "", dtype=object)
        elif np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[arg.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _model_config(path: Path) -> ModelConfig:
    """The settings the agent would load ``path`` with, on the CPU: the model's
    ``config.yaml`` for ``<model>/<version>/model.onnx``, else the defaults."""
    config = ModelConfig()
    if path.parent.name.isdigit():
        try:
            config = load_model_config(path.parent.parent / "config.yaml")
        except ConfigError as exc:
            raise ProfilingError(str(exc)) from None
    return msgspec.structs.replace(config, backend="onnx", device="cpu")


def measure_model(path: str | Path, *, name: str | None = None, runs: int = 10,
                  seed: int = 0) -> ModelProfile:
    """Measure one ONNX model file on the CPU; see the module docstring for what is what."""
    from agent.backends.onnx import OnnxBackend

    if runs < 1:
        raise ProfilingError(f"runs must be >= 1, got {runs}")
    path = Path(path)
    backend = OnnxBackend(name or path.stem, 1, path.parent, _model_config(path),
                          FootprintModel(), model_file=path)
    gc.collect()
    malloc_trim()
    try:
        result = load_measured(backend, MemoryMeter())
    except BackendError as exc:
        raise ProfilingError(f"{path}: ONNX Runtime cannot load it: {exc}") from None
    try:
        feeds = synthetic_inputs(backend.session, seed)
        warm = [_timed_run(backend.session, feeds) for _ in range(runs)]
    except ProfilingError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ProfilingError(f"{path}: running it on a synthetic input failed: {exc}") from None
    finally:
        backend.unload()
        gc.collect()
        malloc_trim()
    size = result.size_bytes if result.size_bytes is not None else max(
        result.rss_delta, backend.lower_bound())
    return ModelProfile(model=name or path.stem, path=path, file_bytes=path.stat().st_size,
                        rss_delta_bytes=int(result.rss_delta),
                        load_seconds=result.seconds - result.first_run_seconds,
                        first_exec_seconds=result.first_run_seconds,
                        exec_seconds=statistics.median(warm), size_bytes=int(size))


def measure_models(paths: Iterable[str | Path], *, runs: int = 10,
                   seed: int = 0) -> list[ModelProfile]:
    """Measure every ONNX model ``find_onnx_models`` finds under ``paths``, in order."""
    from agent.backends.onnx import prime_runtime

    models = find_onnx_models(paths)
    tune_malloc()
    prime_runtime()
    return [measure_model(path, name=name, runs=runs, seed=seed) for name, path in models]


def to_profiles(measured: Sequence[ModelProfile]) -> Profiles:
    """The measurements as simulator profiles (with ``first_exec_seconds``)."""
    return make_profiles([m.model for m in measured], [m.size_bytes for m in measured],
                         [m.load_seconds for m in measured], [m.exec_seconds for m in measured],
                         [m.first_exec_seconds for m in measured], source="<measured>")


def _timed_run(session, feeds: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start
