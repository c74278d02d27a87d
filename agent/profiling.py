"""Measuring model profiles on this machine: memory, load and execution time of real
ONNX models in ONNX Runtime, written as the simulator's profiles CSV.

For each model, in this process, one after another (ONNX Runtime is warmed up first,
so library start-up is billed to no model):

- ``rss_delta_bytes``: process RSS after the session is created and has run once,
  minus RSS before (freed heap is returned with ``malloc_trim`` between models).
  ``size_bytes`` = max(RSS delta, file size): RSS moves in pages and reuses freed
  heap, so for small models the delta undercounts; a model needs at least its weights.
- ``load_seconds``: InferenceSession creation; ``first_exec_seconds``: the first run;
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

import numpy as np
import psutil

from agent.memory import malloc_trim
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

    @property
    def size_bytes(self) -> int:
        """Memory the loaded model takes: the RSS delta, at least the file size."""
        return max(self.rss_delta_bytes, self.file_bytes)


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


def measure_model(path: str | Path, *, name: str | None = None, runs: int = 10,
                  seed: int = 0) -> ModelProfile:
    """Measure one ONNX model file on the CPU; see the module docstring for what is what."""
    import onnxruntime as ort

    if runs < 1:
        raise ProfilingError(f"runs must be >= 1, got {runs}")
    path = Path(path)
    process = psutil.Process()
    gc.collect()
    malloc_trim()
    rss_before = process.memory_info().rss
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types
        raise ProfilingError(f"{path}: ONNX Runtime cannot load it: {exc}") from None
    load_seconds = time.perf_counter() - start
    feeds = synthetic_inputs(session, seed)
    try:
        first_exec_seconds = _timed_run(session, feeds)
        rss_delta = process.memory_info().rss - rss_before
        warm = [_timed_run(session, feeds) for _ in range(runs)]
    except Exception as exc:  # noqa: BLE001
        raise ProfilingError(f"{path}: running it on a synthetic input failed: {exc}") from None
    finally:
        del session
        gc.collect()
        malloc_trim()
    return ModelProfile(model=name or path.stem, path=path, file_bytes=path.stat().st_size,
                        rss_delta_bytes=int(rss_delta), load_seconds=load_seconds,
                        first_exec_seconds=first_exec_seconds,
                        exec_seconds=statistics.median(warm))


def measure_models(paths: Iterable[str | Path], *, runs: int = 10,
                   seed: int = 0) -> list[ModelProfile]:
    """Measure every ONNX model ``find_onnx_models`` finds under ``paths``, in order."""
    models = find_onnx_models(paths)
    _warm_up_onnxruntime()
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


def _warm_up_onnxruntime() -> None:
    """Create and run one trivial session so ORT's one-time start-up is nobody's load."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "warm-up",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.zeros(1, np.float32)})
