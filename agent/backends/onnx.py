"""ONNX Runtime backend: CPU execution provider, or CUDA where onnxruntime-gpu and a GPU
are present.

Memory: the estimate is computed from the graph (``onnx_weight_bytes``: the constant
tensors' bytes, read from the protobuf without creating a session) times a factor
learned per device class. On CUDA, sessions grow their arena by what they ask for
(``arena_extend_strategy: kSameAsRequested``; the default grows it in powers of two and
bills a model far more than it holds), are capped by ``gpu_mem_limit`` (the device budget less the context
overhead), and are measured with this process's NVML usage around the load. The CUDA
context and ONNX Runtime's CUDA set-up are created once per device by a trivial session
(``set_up_device``) and measured as the pool's overhead, never a model's size.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends.base import (Backend, BackendCrashed, BackendError, InvalidInput,
                                 TensorSpec)
from agent.memory import GpuAccounting, GpuMemoryReader, MiB, Prior, device_index

_ORT_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


#: ONNX Runtime's message when one operator fails on the data it was given.
_REJECTED_BY_A_NODE = re.compile(r"RUNTIME_EXCEPTION : Non-zero status code returned "
                                 r"while running \w+ node")


def _spec(arg: Any) -> TensorSpec:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise BackendError(f"tensor {arg.name!r} has unsupported type {arg.type}")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, dtype, shape)


# y = Identity(x), x and y float[1], opset 17, IR version 8: what
# ``onnx.helper.make_model(make_graph([make_node("Identity", ["x"], ["y"])], "prime", ...))``
# serialises to (tests/test_backend_onnx.py builds it so and compares). Spelled out so that
# priming the runtime does not import the onnx package into the agent.
TRIVIAL_MODEL = (b'\x08\x08:;\n\x10\n\x01x\x12\x01y"\x08Identity\x12\x05primeZ\x0f\n\x01x'
                 b'\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08'
                 b'\x01\x12\x04\n\x02\x08\x01B\x04\n\x00\x10\x11')


def prime_runtime() -> None:
    """Create and run one trivial session so that ONNX Runtime's one-time set-up (its
    environment, thread pools, allocators) is not billed to the first model loaded."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    session = ort.InferenceSession(TRIVIAL_MODEL, so, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.zeros(1, np.float32)})


def prime_cuda(device: str) -> None:
    """Create, run and drop one trivial CUDA session on ``device``: what stays (the CUDA
    context, ONNX Runtime's CUDA set-up) is the device's one-time overhead."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    session = ort.InferenceSession(
        TRIVIAL_MODEL, so, providers=[("CUDAExecutionProvider", cuda_options(device)),
                                      "CPUExecutionProvider"])
    session.run(None, {"x": np.zeros(1, np.float32)})
    del session


def cuda_options(device: str, gpu_mem_limit: int | None = None) -> dict[str, str]:
    """CUDA execution provider options for ``cuda:N``: an arena that grows by what is
    asked (not powers of two) and, where given, a per-session memory cap."""
    options = {"device_id": str(device_index(device)),
               "arena_extend_strategy": "kSameAsRequested"}
    if gpu_mem_limit:
        options["gpu_mem_limit"] = str(int(gpu_mem_limit))
    return options


_ELEMENT_BYTES = {  # onnx.TensorProto.DataType → bytes per element (STRING: by content)
    1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8,
    15: 16, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1,
}


# The weights' bytes are read off the protobuf's wire format through a memory map:
# only field keys and lengths are decoded, the tensors' data is skipped, so a file of
# any size costs neither a copy nor a parse (onnx.load would hold the file twice over
# while a burst of first requests estimates many models at once).
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE = 1, 5, 15
_NODE_ATTRIBUTE = 5
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS = 5, 6, 10, 11
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_STRINGS = 1, 2, 6
_TENSOR_EXTERNAL, _TENSOR_LOCATION = 13, 14
_STRING_STRING_KEY, _STRING_STRING_VALUE = 1, 2


def _varint(buf: Any, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


def _fields(buf: Any, start: int, end: int):
    """(field number, wire type, value) of the message in ``buf[start:end]``: an int for
    varints, a (start, end) span for length-delimited fields, None for fixed ones."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield field, wire, value
        elif wire == 2:
            length, i = _varint(buf, i)
            if i + length > end:
                raise ValueError("truncated message")
            yield field, wire, (i, i + length)
            i += length
        elif wire in (1, 5):
            yield field, wire, None
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if i != end:
        raise ValueError("truncated message")


def _packed_varints(buf: Any, start: int, end: int) -> list[int]:
    out, i = [], start
    while i < end:
        value, i = _varint(buf, i)
        out.append(value)
    return out


def _tensor_bytes(buf: Any, span: tuple[int, int], model_dir: Path) -> int:
    """Bytes of one TensorProto's data: its external data's length (or the rest of its
    file), else the elements' bytes (inline ``raw_data`` or typed fields alike)."""
    dims: list[int] = []
    data_type, external, strings = 0, False, 0
    info: dict[str, str] = {}
    for field, wire, value in _fields(buf, *span):
        if field == _TENSOR_DIMS:
            dims += [value] if wire == 0 else _packed_varints(buf, *value)
        elif field == _TENSOR_TYPE and wire == 0:
            data_type = value
        elif field == _TENSOR_STRINGS and wire == 2:
            strings += value[1] - value[0]
        elif field == _TENSOR_LOCATION and wire == 0:
            external = value == 1
        elif field == _TENSOR_EXTERNAL and wire == 2:
            entry = {f: bytes(buf[v[0]:v[1]]).decode() for f, w, v in _fields(buf, *value)
                     if w == 2}
            info[entry.get(_STRING_STRING_KEY, "")] = entry.get(_STRING_STRING_VALUE, "")
    if external:
        if "length" in info:
            return int(info["length"])
        try:
            return max((model_dir / info["location"]).stat().st_size
                       - int(info.get("offset", 0)), 0)
        except (KeyError, OSError, ValueError):
            pass
    if data_type == 8:  # STRING
        return strings
    count = math.prod(dims)
    if data_type in (21, 22, 23):  # 4-bit types: two per byte
        return (count + 1) // 2
    return count * _ELEMENT_BYTES.get(data_type, 4)


def _graph_bytes(buf: Any, span: tuple[int, int], model_dir: Path) -> int:
    total = 0
    for field, wire, value in _fields(buf, *span):
        if wire != 2:
            continue
        if field == _GRAPH_INITIALIZER:
            total += _tensor_bytes(buf, value, model_dir)
        elif field == _GRAPH_SPARSE:
            total += sum(_tensor_bytes(buf, v, model_dir) for f, w, v in _fields(buf, *value)
                         if w == 2 and f in (_SPARSE_VALUES, _SPARSE_INDICES))
        elif field == _GRAPH_NODE:
            for f, w, attr in _fields(buf, *value):
                if f == _NODE_ATTRIBUTE and w == 2:
                    total += _attribute_bytes(buf, attr, model_dir)
    return total


def _attribute_bytes(buf: Any, span: tuple[int, int], model_dir: Path) -> int:
    total = 0
    for field, wire, value in _fields(buf, *span):
        if wire != 2:
            continue
        if field in (_ATTR_T, _ATTR_TENSORS):
            total += _tensor_bytes(buf, value, model_dir)
        elif field in (_ATTR_G, _ATTR_GRAPHS):
            total += _graph_bytes(buf, value, model_dir)
    return total


def onnx_weight_bytes(model_file: Path) -> int:
    """Bytes of an ONNX model's constant tensors (initializers, sparse initializers,
    Constant and other tensor attributes, subgraphs included) as the runtime holds them,
    read off the file's protobuf encoding without loading it (see above), external data
    counted by its length. No session is created. Raises ``OSError`` / ``ValueError`` on
    a bad file."""
    import mmap

    with open(model_file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ValueError(f"{model_file}: not an ONNX model: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                graphs = [v for field, wire, v in _fields(buf, 0, size)
                          if field == _MODEL_GRAPH and wire == 2]
                if not graphs:
                    raise ValueError("no graph")
                return sum(_graph_bytes(buf, g, Path(model_file).parent) for g in graphs)
            except (ValueError, IndexError) as exc:
                raise ValueError(f"{model_file}: not an ONNX model: {exc}") from None


def _answer(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    """On the event loop: the outcome of a job run by ``OnnxBackend.infer_async``
    (dropped when the awaiting request was cancelled meanwhile)."""
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class OnnxBackend(Backend):
    kind = "onnx"
    MODEL_FILE = "model.onnx"
    RUNS_IN_PLACE = True  # session.run: one call, as long as it was measured
    # CPU, with tune_malloc and the runtime primed: RSS = weights + the arena's first
    # chunk and session state, fitted to the demo MLPs (bench/memory_accounting.py;
    # figures in docs/benchmarks.md). CUDA: weights + cuBLAS/cuDNN handles and workspace
    # per session (a guess until the first measurement teaches the factor).
    #: cpu load_peak: session creation peaks above the steady size (VmHWM around
    #: concurrent loads of the bench's MLPs; docs/benchmarks.md); learned from then on.
    PRIORS = {"cpu": Prior(1.03, MiB // 2, load_peak=2.0),
              "cuda": Prior(1.05, 48 * MiB)}

    def __init__(self, *args: Any, gpu: GpuAccounting | None = None,
                 model_file: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session = None
        self._gpu_bytes: int | None = None
        self._model_file = Path(model_file) if model_file is not None else None
        self._weights: int | None = None
        self.gpu = gpu if gpu is not None or self.device == "cpu" else \
            GpuAccounting(GpuMemoryReader(), {})

    @classmethod
    def create(cls, name: str, version: int, path: Path, config: Any, footprints: Any, *,
               tfserving: Any = None, gpu: GpuAccounting | None = None) -> "OnnxBackend":
        return cls(name, version, path, config, footprints, gpu=gpu)

    @property
    def model_file(self) -> Path:
        if self._model_file is not None:
            return self._model_file
        return self.path / str(self.version) / self.MODEL_FILE

    def file_bytes(self) -> int:
        return self.model_file.stat().st_size

    def weight_bytes(self) -> int:
        """``onnx_weight_bytes`` of the model file (parsed once per backend)."""
        if self._weights is None:
            try:
                self._weights = self.footprints.weight_bytes(self.model_file,
                                                             onnx_weight_bytes)
            except OSError as exc:
                raise BackendError(f"cannot read {self.model_file}: {exc.strerror}") from None
            except ValueError as exc:
                raise BackendError(f"onnxruntime cannot load {self.model_file}: {exc}"
                                   ) from None
        return self._weights

    def set_up_device(self) -> int:
        if self.device == "cpu":
            return 0
        self._check_cuda()
        try:
            return self.gpu.ensure_context(self.device, lambda: prime_cuda(self.device))
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types
            raise BackendError(f"cannot set up CUDA on {self.device}: {exc}") from None

    def _session_options(self):
        import onnxruntime as ort

        opts = self.config.onnxruntime
        so = ort.SessionOptions()
        so.intra_op_num_threads = opts.intra_op_threads
        so.inter_op_num_threads = opts.inter_op_threads
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[opts.graph_optimization_level]
        so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if opts.execution_mode == "parallel"
                             else ort.ExecutionMode.ORT_SEQUENTIAL)
        so.enable_cpu_mem_arena = opts.enable_cpu_mem_arena
        so.enable_mem_pattern = opts.enable_mem_pattern
        so.add_session_config_entry("session.intra_op.allow_spinning",
                                    "1" if opts.allow_spinning else "0")
        return so

    def _check_cuda(self) -> None:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendError(f"model {self.name!r} asks for {self.device} but onnxruntime "
                               "has no CUDA execution provider (install onnxruntime-gpu)")

    def _providers(self) -> list:
        if self.device == "cpu":
            return ["CPUExecutionProvider"]
        self._check_cuda()
        limit = self.gpu.session_limit(self.device)
        return [("CUDAExecutionProvider", cuda_options(self.device, limit)),
                "CPUExecutionProvider"]

    def load(self) -> None:
        """Create the session and run it once. On CUDA the device is set up first (not
        billed) and this process's GPU bytes around the load are the model's size."""
        meter = window = None
        if self.device != "cpu":
            self.set_up_device()
            meter = self.gpu.meter(self.device)
            window = meter.begin() if meter is not None else None
        try:
            self._load_session()
        finally:
            if window is not None:
                delta, clean = meter.end(window)
        if window is not None and clean:
            self._gpu_bytes = max(delta, self.lower_bound())
            self.footprints.observe(self.kind, self.weight_bytes(), self._gpu_bytes,
                                    device=self.device)

    def _load_session(self) -> None:
        import onnxruntime as ort

        providers = self._providers()
        try:
            session = ort.InferenceSession(str(self.model_file), self._session_options(),
                                           providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types
            raise BackendError(f"onnxruntime cannot load {self.model_file}: {exc}") from None
        inputs = [_spec(a) for a in session.get_inputs()]
        outputs = [_spec(a) for a in session.get_outputs()]
        self.session, self.inputs, self.outputs = session, inputs, outputs
        self.warm_up()

    def measured_bytes(self) -> int | None:
        return self._gpu_bytes if self.device != "cpu" else None

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]
              ) -> dict[str, np.ndarray]:
        session = self.session
        if session is None:
            raise BackendError(f"model {self.name!r} is not loaded")
        feed = {k: (self._to_str(k, v) if v.dtype == object else v) for k, v in inputs.items()}
        try:
            results = session.run(None, feed)
        except Exception as exc:  # noqa: BLE001
            name, text = type(exc).__name__, str(exc)
            if "InvalidArgument" in name or "Fail" in name:
                raise InvalidInput(text) from None
            if _REJECTED_BY_A_NODE.search(text) and "allocate" not in text:
                # a kernel refused the values (a string Cast parsing numbers, a range
                # check): the request's fault, the model serves others
                raise InvalidInput(f"model {self.name!r} rejected the input: {text}") from None
            raise BackendCrashed(f"model {self.name!r} failed while running (onnxruntime: "
                                 f"{exc}); it is reloaded, retry shortly") from None
        return {spec.name: (self._to_bytes(value) if value.dtype == object else value)
                for spec, value in zip(self.outputs, results)}

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          executor: Executor | None) -> dict[str, np.ndarray]:
        """``infer`` in ``executor``, as ``run_in_executor`` would run it, with a lighter
        hand-off back: the worker thread answers an asyncio future through one
        ``call_soon_threadsafe`` (no concurrent future chained to it)."""
        if executor is None:
            return await super().infer_async(inputs, parameters, executor)
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def job() -> None:
            try:
                result = self.infer(inputs, parameters)
            except BaseException as exc:  # noqa: BLE001 - the caller's answer
                loop.call_soon_threadsafe(_answer, future, None, exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                loop.call_soon_threadsafe(_answer, future, result, None)

        executor.submit(job)
        return await future

    @staticmethod
    def _to_str(name: str, array: np.ndarray) -> np.ndarray:
        """ONNX string tensors hold text: BYTES elements must be UTF-8."""
        try:
            return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else str(b),
                                otypes=[object])(array) if array.size else array
        except UnicodeDecodeError:
            raise InvalidInput(f"input {name!r}: BYTES elements must be UTF-8 text for "
                               "an ONNX string tensor") from None

    @staticmethod
    def _to_bytes(array: np.ndarray) -> np.ndarray:
        return np.vectorize(lambda s: s.encode() if isinstance(s, str) else s,
                            otypes=[object])(array) if array.size else array

    def unload(self) -> None:
        self.session = None
